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

__all__ = ["format_bytes", "parse_size"]

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

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")


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


def parse_size(text: str | int) -> int:
    """Parse a size into bytes.

    Accepts plain integers (``1024``), decimal units (``512MB``, ``1.5 GB``:
    powers of 1000) and IEC units (``4GiB``: powers of 1024), case-insensitive,
    with optional spaces. The result is rounded down to a whole byte.

    Raises:
        ValueError: naming the text when it is not a size, or is negative.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"negative size: {text!r}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"not a size: {text!r}")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (try e.g. '4GiB', '512MB', '1.5 GB' or a plain number of bytes)")
    number, exponent, unit = m.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown unit {unit!r} in size {text!r} (use B, KB, MB, GB, TB, PB, EB or KiB, MiB, GiB, TiB, PiB, EiB)")
    # Exact decimal arithmetic: 1.5 GB is exactly 1_500_000_000.
    from fractions import Fraction

    value = Fraction(number) * factor
    if exponent is not None:
        value *= Fraction(10) ** int(exponent)
    return int(value)
