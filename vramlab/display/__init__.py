"""Renderers: turn Snapshots (and later cell records) into text, HTML and widgets.

Renderers never read the machine themselves: they take a :class:`~vramlab.snapshot.Snapshot`.
"""

from .html import snapshot_html
from .text import snapshot_text

__all__ = ["snapshot_html", "snapshot_text"]
