"""The public functions behind the magics: watch, stop, last, history, plot, free."""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Optional

__all__ = ["watch", "stop", "last", "plot", "free", "monitors"]

_MONITORS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _close_all() -> None:
    for m in list(_MONITORS):
        try:
            m.close()
        except Exception:
            pass


atexit.register(_close_all)


def watch(interval: Optional[float] = None) -> Any:
    """Start the shared sampler (``interval`` in seconds; default 0.5) and return a live monitor widget.

    Every monitor shares the kernel's one sampler thread.
    """
    from .display.widget import Monitor
    from .sampler import get_sampler

    s = get_sampler()
    if interval is not None or not s.running:
        s.start(interval)
    if s.latest is None:
        s.sample_now()
    m = Monitor(s)
    _MONITORS.add(m)
    return m


def monitors() -> list[Any]:
    """The live monitors of this kernel."""
    return list(_MONITORS)


def stop() -> None:
    """Stop the sampler; every monitor freezes on its last reading and says so."""
    from .sampler import get_sampler

    get_sampler().stop()


def last() -> Any:
    """The latest cell record (:class:`~vramlab.cells.CellRecord`), or ``None``."""
    from .cells import get_recorder

    h = get_recorder().history
    return h[-1] if h else None


def plot(last_s: Optional[float] = None) -> Any:
    """A matplotlib timeline of this kernel's history; returns the ``Figure``."""
    from .display.plot import plot_history
    from ._history import history

    return plot_history(history(), last_s=last_s)


def free() -> Any:
    """Drop what the last traceback keeps alive, collect and empty the cache; report bytes freed."""
    from .oom import free_last_error

    shell = None
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:
        shell = None
    return free_last_error(shell)
