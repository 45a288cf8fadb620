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


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["B", "KiB", "MiB", "GiB", "KB", "MB", "GB"]))
def test_integer_units_are_exact(n, unit):
    factor = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 10**6, "GB": 10**9}[unit]
    assert parse_size(f"{n}{unit}") == n * factor
    assert parse_size(f"{n} {unit.lower()}") == n * factor
