"""The public functions behind the magics: watch, stop, last, plot, free.

They join the runtime (the sampler, the records, the OOM tools) to the display (the
monitor widget, the plot), which do not import each other. ``vramlab.watch()`` and the
others are these functions; the widget and the plot are imported only when used
(ipywidgets and matplotlib are not needed to load the extension).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Optional

from .model import CellRecord, FreedReport
from .reconcile import snapshot
from .runtime.history import history
from .runtime.oom import free_last_error
from .runtime.records import get_recorder
from .runtime.sampler import get_sampler

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
    """Start the shared sampler (``interval`` in seconds; default 0.5) and return the live monitor widget.

    A kernel has one sampler thread and one monitor: calling this again (re-running a
    ``%vram watch`` cell, or watching in another cell) returns the same monitor, shown
    once more, so however often it is called one renderer listens to the sampler.
    """
    from .display.widget import Monitor

    s = get_sampler()
    # the first reading on this thread, in full: it reads the device names once, which the
    # sampler thread may not (no CUDA runtime call there)
    s.sample_now(snapshot)
    if interval is not None or not s.running:
        s.start(interval)
    live = [m for m in _MONITORS if not m.closed and m.sampler is s]
    if live:
        m = live[0]
        for extra in live[1:]:  # pragma: no cover - only if monitors were made directly
            extra.close()
        m.refresh()
        return m
    m = Monitor(s)
    _MONITORS.add(m)
    return m


def monitors() -> list[Any]:
    """The live (not closed) monitors of this kernel."""
    return [m for m in _MONITORS if not m.closed]


def stop() -> bool:
    """Stop the sampler; every monitor freezes on its last reading and says so. Returns whether
    it was running (``False``: there was nothing to stop)."""
    s = get_sampler()
    running = s.running
    s.stop()
    return running


def last() -> Optional[CellRecord]:
    """The latest cell record (:class:`~vramlab.model.CellRecord`), or ``None``."""
    h = get_recorder().history
    return h[-1] if h else None


def plot(last_s: Optional[float] = None, *, last: Optional[int] = None) -> Any:
    """A matplotlib timeline of this kernel's history; returns the ``Figure``.

    ``last_s``: only the last ``last_s`` seconds. ``last``: only the last ``last`` cell
    records (at least 1) and the samples from their time range. See
    :func:`vramlab.display.plot.plot_history`.
    """
    from .display.plot import plot_history

    return plot_history(history(), last_s=last_s, last=last)


def free() -> FreedReport:
    """Drop what the last traceback keeps alive, collect and empty the cache; report bytes freed."""
    return free_last_error(_running_shell())


def _running_shell() -> Any:
    """The IPython shell running this code, or ``None``: IPython puts ``get_ipython`` into
    the builtins while it runs a cell, so this needs no import of IPython."""
    import builtins

    get = getattr(builtins, "get_ipython", None)
    try:
        return get() if callable(get) else None
    except Exception:
        return None
