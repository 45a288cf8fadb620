import pytest
from hypothesis import given, strategies as st

from vramlab import format_bytes, parse_size


def test_format_examples():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.00 KiB"
    assert format_bytes(1536 * 1024 * 1024) == "1.50 GiB"
    assert format_bytes(-2 * 1024**2) == "-2.00 MiB"
    assert format_bytes(5 * 1024, signed=True) == "+5.00 KiB"
    assert format_bytes(None) == "n/a"
    # never "1024.00 MiB": rounding carries into the next unit
    assert format_bytes(1024**3 - 1) == "1.00 GiB"


@pytest.mark.parametrize("text,expected", [
    ("4GiB", 4 * 1024**3),
    ("512MB", 512 * 1000**2),
    ("1.5 GB", 1_500_000_000),
    ("1.5GiB", 3 * 1024**3 // 2),
    ("123", 123),
    (" 7 kib ", 7 * 1024),
    ("16 gb", 16 * 10**9),
    ("2e3", 2000),
    ("0", 0),
    (4096, 4096),
])
def test_parse_examples(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GB", "12 parsecs", "1.2.3GB", "-4GB", "four GiB", "4 G B", "nan", "inf"])
def test_parse_rejects_and_names_the_text(bad):
    with pytest.raises(ValueError) as e:
        parse_size(bad)
    assert repr(bad) in str(e.value)


@pytest.mark.parametrize("bad", [-1, True, 1.5, None])
def test_parse_rejects_non_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=2**60))
def test_round_trip_within_display_precision(n):
    text = format_bytes(n)
    back = parse_size(text.replace(" ", ""))
    # two decimals of the unit: relative error at most 0.5 % (exact below 1 KiB)
    if n < 1024:
        assert back == n
    else:
        assert abs(back - n) <= 0.005 * n + 1


@given(st.integers(min_value=0, max_value=2**32), st.sampled_from(["B", "KiB", "MiB", "GiB", "KB", "MB", "GB"]))
def test_integer_units_are_exact(n, unit):  # up to 4 EiB: a size is at most 2**63 - 1 bytes
    factor = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 10**6, "GB": 10**9}[unit]
    assert parse_size(f"{n}{unit}") == n * factor
    assert parse_size(f"{n} {unit.lower()}") == n * factor


# --------------------------------------------------------------------------- absurd sizes


@pytest.mark.parametrize("bad", ["-1GiB", "-4GB", " - 2 KiB", "-1"])
def test_a_negative_size_says_a_size_must_be_positive(bad):
    with pytest.raises(ValueError) as e:
        parse_size(bad)
    msg = str(e.value)
    assert repr(bad) in msg and "negative" in msg and "positive" in msg


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "Infinity", "inf GiB", "1e400GiB", "1e400",
                                 "1e99999999GiB", float("nan"), float("inf")])
def test_a_size_that_is_not_finite_is_refused_as_such(bad):
    """1e400 overflows a float to infinity; 1e99999999 must be refused at once, not computed
    exactly (a number of 10**8 digits)."""
    with pytest.raises(ValueError) as e:
        parse_size(bad)
    assert repr(bad) in str(e.value) and "not finite" in str(e.value)


@pytest.mark.parametrize("bad", ["8EiB", "9.3e18", "1e200GiB", 2**63, 10**30])
def test_a_size_beyond_what_torch_can_count_is_too_large(bad):
    with pytest.raises(ValueError, match="too large") as e:
        parse_size(bad)
    assert "2**63 - 1" in str(e.value)


def test_the_largest_size_and_tiny_ones():
    from vramlab.units import MAX_SIZE

    assert parse_size(MAX_SIZE) == MAX_SIZE == 2**63 - 1
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    assert parse_size("7.99EiB") < MAX_SIZE
    assert parse_size("1e-400GiB") == 0 and parse_size("-0") == 0 and parse_size("+4GiB") == 4 * 2**30
    assert parse_size("1e-99999999GiB") == 0  # at once, not by exact arithmetic


def test_what_and_positive_name_the_argument_and_refuse_zero():
    with pytest.raises(ValueError, match=r"negative capacity: '-1GiB' \(capacity must be positive\)"):
        parse_size("-1GiB", what="capacity", positive=True)
    for zero in ("0", "0GiB", 0, "1e-9B"):
        with pytest.raises(ValueError, match="capacity must be positive"):
            parse_size(zero, what="capacity", positive=True)
    with pytest.raises(ValueError, match="capacity is not finite"):
        parse_size("nan", what="capacity")


def test_what_looks_like_a_size():
    from vramlab.units import looks_like_size

    for text in ("-1GiB", "1e400GiB", "nan", "inf", " -Inf GB", "16GiBs", ".5GB", "3"):
        assert looks_like_size(text), text
    for text in ("T4", "A100-80GB", "H100", "Inferno", "nanny", "", 16, None):
        assert not looks_like_size(text), text


@pytest.mark.parametrize("value,reason", [
    ("fast", "not_a_number"), (None, "not_a_number"), (True, "not_a_number"), (float("nan"), "not_a_number"),
    ("nan", "not_a_number"), (0, "too_short"), (-1, "too_short"), ("0.001", "too_short"),
    (float("inf"), "too_long"), ("1e308", "too_long"),
])
def test_an_interval_that_cannot_be_used_is_one_typed_error(value, reason):
    from vramlab.units import IntervalError, check_interval

    with pytest.raises(IntervalError) as e:
        check_interval(value)
    assert e.value.reason == reason and e.value.got is value and isinstance(e.value, ValueError)


def test_an_interval_is_read_from_a_number_or_its_text_within_the_bounds():
    import threading

    from vramlab.units import MIN_INTERVAL, check_interval

    assert check_interval("0.25") == 0.25 and check_interval(2) == 2.0 and check_interval(MIN_INTERVAL) == MIN_INTERVAL
    assert check_interval(threading.TIMEOUT_MAX) == threading.TIMEOUT_MAX
    assert check_interval(0.5, minimum=0.5) == 0.5


def test_every_edge_words_an_interval_problem_from_its_fields_in_both_languages():
    """The CLI, the magic and the server refuse through the one validator; the words come from
    display.text.interval_problem, translated (no message is parsed back)."""
    from vramlab.display.text import interval_problem
    from vramlab.i18n import set_lang
    from vramlab.units import IntervalError, check_interval

    problems = []
    for value in ("fast", "0", "1e308"):
        with pytest.raises(IntervalError) as e:
            check_interval(value)
        problems.append(e.value)
    try:
        set_lang("en")
        english = [interval_problem(p, "--interval") for p in problems]
        set_lang("pt-BR")
        portuguese = [interval_problem(p, "--interval") for p in problems]
    finally:
        set_lang(None)
    assert all(t.startswith("--interval takes") for t in english)
    assert all(t.startswith("--interval aceita") for t in portuguese)
    assert "'fast'" in english[0] and "0.01" in english[1] and "'1e308'" in english[2]
