"""History: the cell records and the sampler's samples, as one frozen :class:`~vramlab.model.History`.

``vramlab.history()`` returns it: ``.cells`` (records, oldest first), ``.samples`` and
``.markers`` (from the sampler's ring buffer). ``export(path)`` writes CSV or JSON, chosen
by the suffix. Sizes in bytes, times in seconds since the epoch.
"""

from __future__ import annotations

from ..model import History
from .records import get_recorder
from .sampler import get_sampler

__all__ = ["History", "history"]


def history() -> History:
    """A frozen copy of this kernel's cell records and samples."""
    s = get_sampler()
    return History(cells=tuple(get_recorder().history), samples=tuple(s.samples), markers=tuple(s.markers))
