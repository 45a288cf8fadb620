"""Helpers for testing notebooks that use vramlab.

``python -m vramlab.testing`` prints the path of the nbval sanitizer file shipped with
vramlab; use it as ``pytest --nbval-lax --nbval-sanitize-with "$(python -m vramlab.testing)"``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["sanitizer_path"]


def sanitizer_path() -> str:
    """The absolute path of ``nbval_sanitize.cfg`` (regexes for addresses, timings, dates, PIDs)."""
    return str(Path(__file__).with_name("nbval_sanitize.cfg"))


if __name__ == "__main__":  # pragma: no cover
    print(sanitizer_path())
