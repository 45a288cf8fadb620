"""Renderers: turn :mod:`vramlab.model` objects into text, HTML, widgets and plots.

Renderers never read the machine and never import the runtime or the probes: they take
the objects they draw. Importing this package registers the text and HTML renderers
with :func:`vramlab.model.register_renderer`, which is how ``Snapshot``, ``CellRecord``,
``History``, ``OOMExplanation`` and ``FreedReport`` display themselves without importing
the display. ``import vramlab`` imports it; the widget (:mod:`.widget`, ipywidgets) and
the plot (:mod:`.plot`, matplotlib) are imported only when used.
"""

from ..model import register_renderer
from .html import oom_html, record_html, snapshot_html
from .text import freed_text, history_text, oom_text, record_line, record_text, snapshot_text

__all__ = ["snapshot_html", "snapshot_text", "record_html", "record_text", "record_line", "history_text",
           "oom_text", "oom_html", "freed_text"]

for _name, _fn in (("snapshot.text", snapshot_text), ("snapshot.html", snapshot_html),
                   ("record.text", record_text), ("record.html", record_html), ("record.line", record_line),
                   ("history.text", history_text), ("oom.text", oom_text), ("oom.html", oom_html),
                   ("freed.text", freed_text)):
    register_renderer(_name, _fn)
