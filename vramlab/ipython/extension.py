"""``%load_ext vramlab`` and ``%unload_ext vramlab``: symmetric registration on a shell.

:func:`load` registers the ``%vram``/``%%vram`` magics, two event callbacks and an AST
transformer (it passes an interrupt that landed in ``pre_run_cell`` on to the cell, and
otherwise leaves every cell as it is); :func:`unload` removes exactly those and stops the
sampler.
"""

from __future__ import annotations

from typing import Any, Callable

from ..facts import StopReason
from ..runtime.sampler import existing_sampler
from .events import CellEvents
from .magics import VramMagics

__all__ = ["load", "unload"]

_REGISTERED: dict[int, tuple[CellEvents, list[tuple[str, Callable[..., Any]]]]] = {}


def load(ip: Any) -> None:
    """Register the magics and the two event callbacks on shell ``ip``. Loading twice is harmless."""
    key = id(ip)
    if key in _REGISTERED:
        return
    events = CellEvents(ip)
    ip.register_magics(VramMagics(ip, events))
    callbacks = [("pre_run_cell", events.pre_run_cell), ("post_run_cell", events.post_run_cell)]
    for name, fn in callbacks:
        ip.events.register(name, fn)
    transformers = getattr(ip, "ast_transformers", None)
    if isinstance(transformers, list):
        transformers.append(events.interrupter)
    _REGISTERED[key] = (events, callbacks)


def unload(ip: Any) -> None:
    """Remove exactly what :func:`load` registered, and stop the sampler."""
    entry = _REGISTERED.pop(id(ip), None)
    if entry is not None:
        events, callbacks = entry
        for name, fn in callbacks:
            try:
                ip.events.unregister(name, fn)
            except ValueError:
                pass
        transformers = getattr(ip, "ast_transformers", None)
        if isinstance(transformers, list) and events.interrupter in transformers:
            transformers.remove(events.interrupter)
        events.tracker.stop()
    magics = ip.magics_manager.magics
    magics.get("line", {}).pop("vram", None)
    magics.get("cell", {}).pop("vram", None)
    ip.magics_manager.registry.pop("VramMagics", None)
    s = existing_sampler()
    if s is not None:
        s.stop(StopReason.UNLOADED)
