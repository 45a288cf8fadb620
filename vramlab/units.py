"""Byte-size helpers: format sizes in IEC units and parse human-written sizes.

All sizes are integers in bytes.

>>> format_bytes(1610612736)
'1.50 GiB'
>>> parse_size("1.5 GB")
1500000000
>>> parse_size("4GiB")
4294967296
"""

from __future__ import annotations

import math
import re

__all__ = ["format_bytes", "parse_size", "looks_like_size", "MAX_SIZE", "MIN_INTERVAL", "IntervalError", "check_interval"]

#: The shortest interval vramlab samples or refreshes at, in seconds.
MIN_INTERVAL = 0.01

_IEC = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
    "eib": 1024**6,
    "e": 1000**6,
    "eb": 1000**6,
    "ei": 1024**6,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
    "pi": 1024**5,
}

_SIZE_RE = re.compile(r"^\s*([+-])?\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")
_NOT_FINITE_RE = re.compile(r"^\s*[+-]?\s*(?:infinity|inf|nan)\s*([A-Za-z]*)\s*$", re.IGNORECASE)
_SIZE_LIKE_RE = re.compile(r"^\s*(?:[+-]|[0-9]|\.[0-9])")

#: The largest size: ``2**63 - 1`` bytes (8 EiB less a byte), the most a ``torch`` int64 size or
#: counter can hold and far beyond any device's memory.
MAX_SIZE = 2**63 - 1


def format_bytes(n: int | float | None, *, signed: bool = False) -> str:
    """Format a size in bytes with IEC units, e.g. ``1.50 GiB``.

    ``None`` formats as ``"n/a"``. With ``signed=True`` a ``+`` is written
    before positive values (for deltas). Values below 1 KiB are written as
    whole bytes (``512 B``); larger ones with two decimals.
    """
    if n is None:
        return "n/a"
    if isinstance(n, float) and not math.isfinite(n):
        return str(n)
    sign = ""
    if n < 0:
        sign = "-"
        n = -n
    elif signed and n > 0:
        sign = "+"
    if n < 1024:
        return f"{sign}{int(n)} B"
    exp = min(int(math.log(n, 1024)), len(_IEC) - 1)
    value = n / 1024**exp
    if round(value, 2) >= 1024 and exp < len(_IEC) - 1:
        exp += 1
        value = n / 1024**exp
    return f"{sign}{value:.2f} {_IEC[exp]}"


def parse_size(text: str | int | float, *, what: str = "size", positive: bool = False) -> int:
    """Parse a size into bytes.

    Accepts plain integers (``1024``), decimal units (``512MB``, ``1.5 GB``:
    powers of 1000) and IEC units (``4GiB``: powers of 1024), case-insensitive,
    with optional spaces. The result is rounded down to a whole byte.

    A size is finite, zero or more, and at most :data:`MAX_SIZE` (``2**63 - 1`` bytes,
    8 EiB): ``"-1GiB"``, ``"nan"``, ``"inf"`` and ``"1e400GiB"`` are refused.

    Args:
        text: the size: a string or bytes (an ``int``); a ``float`` is refused, saying why
            (not finite, or a fraction of a byte).
        what: what the size is, for the error messages (``"capacity"``).
        positive: refuse zero too (a size that rounds down to 0 bytes).

    Raises:
        ValueError: naming ``what`` and the text when it is not a size, or is negative, not
            finite, too large (or zero, with ``positive``).
    """
    limit = "at most 2**63 - 1 bytes, 8 EiB"
    allowed = f"{what} must be positive" + ("" if positive else " or zero")
    if isinstance(text, bool):
        raise ValueError(f"not a {what}: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"negative {what}: {text!r} bytes ({allowed})")
        if text > MAX_SIZE:
            raise ValueError(f"{what} too large: {text!r} bytes ({limit})")
        if positive and text == 0:
            raise ValueError(f"{what} must be positive; got 0 bytes")
        return text
    if isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"{what} is not finite: {text!r} ({what} must be a finite number of bytes, {limit})")
        raise ValueError(f"not a {what}: {text!r} (bytes are an int; write a fraction of a unit as text, e.g. '1.5GiB')")
    if not isinstance(text, str):
        raise ValueError(f"not a {what}: {text!r}")
    if _not_finite(text):
        raise ValueError(f"{what} is not finite: {text!r} ({what} must be a finite number of bytes, {limit})")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a {what}: {text!r} (try e.g. '4GiB', '512MB', '1.5 GB' or a plain number of bytes)")
    sign, number, exponent, unit = m.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown unit {unit!r} in {what} {text!r} (use B, KB, MB, GB, TB, PB, EB or KiB, MiB, GiB, TiB, PiB, EiB)")
    if sign == "-" and any(c in "123456789" for c in number):
        raise ValueError(f"negative {what}: {text!r} ({allowed})")
    # The magnitude first, in floating point (cheap whatever the exponent): "1e400GiB" overflows
    # to infinity, and "1e99999999GiB" must not be computed exactly (a number of 10**8 digits).
    approx = float(f"{number}e{exponent or 0}") * factor
    if not math.isfinite(approx):
        raise ValueError(f"{what} is not finite: {text!r} overflows to infinity ({what} must be {limit})")
    if approx > 2 * MAX_SIZE:
        raise ValueError(f"{what} too large: {text!r} ({limit})")
    n = 0
    if approx >= 0.5:  # else below one byte (a float's relative error cannot reach 1): "1e-400GiB"
        # Exact decimal arithmetic: 1.5 GB is exactly 1_500_000_000. The exponent is bounded by
        # the text's length here (a value this size with a huge exponent needs as many digits).
        from fractions import Fraction

        value = Fraction(number) * factor
        if exponent is not None:
            value *= Fraction(10) ** int(exponent)
        n = int(value)
    if n > MAX_SIZE:
        raise ValueError(f"{what} too large: {text!r} = {n} bytes ({limit})")
    if positive and n == 0:
        raise ValueError(f"{what} must be positive; got {text!r} (0 bytes)")
    return n


def looks_like_size(text: object) -> bool:
    """Whether ``text`` is written as a size (a sign, a digit, ``nan`` or ``inf`` first), so that
    a caller that also takes names (GPU presets) reports :func:`parse_size`'s error for it rather
    than an unknown name. ``"T4"`` and ``"A100-80GB"`` are not; ``"-1GiB"``, ``"nan"``, ``"16GiBs"`` are."""
    return isinstance(text, str) and (_SIZE_LIKE_RE.match(text) is not None or _not_finite(text))


def _not_finite(text: str) -> bool:
    """``"nan"``, ``"inf"``, ``"-Infinity GiB"``: a non-finite number, with a known unit or none."""
    m = _NOT_FINITE_RE.match(text)
    return m is not None and m.group(1).lower() in _UNITS


class IntervalError(ValueError):
    """An interval that cannot be used, as a fact: ``reason`` is ``"not_a_number"``,
    ``"too_short"`` or ``"too_long"``; ``got`` is what was given; ``minimum`` and ``maximum``
    are the bounds, in seconds. Its ``str()`` is English; an edge that speaks the user's language
    words it from the fields (:func:`vramlab.display.text.interval_problem`)."""

    def __init__(self, reason: str, got: object, minimum: float, maximum: float) -> None:
        self.reason, self.got, self.minimum, self.maximum = reason, got, minimum, maximum
        if reason == "not_a_number":
            text = f"an interval is a number of seconds, got {got!r}"
        elif reason == "too_short":
            text = f"the interval must be at least {minimum:g} s, got {got!r}"
        else:
            text = f"the interval must be at most {maximum:.0f} s (the longest wait a thread can make), got {got!r}"
        super().__init__(text)


def check_interval(value: object, *, minimum: float = MIN_INTERVAL, maximum: float | None = None) -> float:
    """``value`` (a number, or a string of one) as an interval in seconds, or one
    :class:`IntervalError`: not a number, NaN, below ``minimum``, or above ``maximum`` (default:
    ``threading.TIMEOUT_MAX``, the longest wait a thread can make; infinity is above it). The one
    check behind ``%vram watch --interval``, ``python -m vramlab --watch``, ``Sampler.start`` and
    the server's ``refresh_interval``."""
    import threading

    most = threading.TIMEOUT_MAX if maximum is None else maximum
    if isinstance(value, bool):
        raise IntervalError("not_a_number", value, minimum, most)
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise IntervalError("not_a_number", value, minimum, most) from None
    if math.isnan(v):
        raise IntervalError("not_a_number", value, minimum, most)
    if v < minimum:
        raise IntervalError("too_short", value, minimum, most)
    if v > most:
        raise IntervalError("too_long", value, minimum, most)
    return v
