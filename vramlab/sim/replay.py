"""Replay a real allocator trace through vramlab's model of PyTorch's CUDA caching allocator.

A trace is what ``torch.cuda.memory._record_memory_history()`` then
``torch.cuda.memory._snapshot()["device_traces"][i]`` give on a CUDA machine: a list of events,
each a dict with ``action`` (``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``,
``segment_free``, ``segment_map``, ``segment_unmap``, ``oom``, ``snapshot``), ``addr``, ``size``
(bytes; for ``alloc`` the size that was asked for) and ``stream``. :func:`replay` feeds every
``alloc`` and ``free_completed`` to a fresh :class:`~vramlab.sim.allocator.CachingAllocator`
and compares, after each of them, the model's reserved bytes with the real ones (the running
sum of the trace's segment events). Sizes in bytes.

The trace must start with an empty allocator (record from the process's first CUDA allocation)
and hold no ``torch.cuda.empty_cache()`` (which the trace shows only as segment frees). The model
keeps one pool per size class, not per stream: a trace with several streams is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .allocator import AllocatorOOM, AllocConf, CachingAllocator

__all__ = ["ReplayResult", "replay"]


@dataclass
class ReplayResult:
    """How a trace replayed. Sizes in bytes.

    Attributes:
        events: the trace's events.
        checked: the allocs and frees after which reserved memory was compared.
        mismatches: how many of those disagreed.
        first_mismatch: the first disagreement: ``(event index, action, size, real reserved,
            model reserved)``, or ``None``.
        peak_reserved_real, peak_reserved_model: the largest reserved figure of each.
        streams: the streams the trace uses.
        unmatched_frees: frees of addresses the replay never saw allocated (the trace began
            after they were allocated).
        model_ooms: allocations the model refused (its capacity was too small).
    """

    events: int = 0
    checked: int = 0
    mismatches: int = 0
    first_mismatch: Optional[tuple[int, str, int, int, int]] = None
    peak_reserved_real: int = 0
    peak_reserved_model: int = 0
    streams: list[Any] = field(default_factory=list)
    unmatched_frees: int = 0
    model_ooms: int = 0

    @property
    def exact(self) -> bool:
        """Whether reserved memory agreed after every alloc and free."""
        return self.checked > 0 and self.mismatches == 0 and self.unmatched_frees == 0 and self.model_ooms == 0

    def text(self) -> str:
        """One line: the verdict and its figures."""
        from ..units import format_bytes

        s = (f"{self.checked} allocs and frees of {self.events} events: reserved "
             + ("agrees after every one" if self.mismatches == 0 else f"differs after {self.mismatches}")
             + f"; peak reserved {format_bytes(self.peak_reserved_real)} real, "
               f"{format_bytes(self.peak_reserved_model)} modelled")
        if self.first_mismatch is not None:
            i, action, size, real, model = self.first_mismatch
            s += (f"; first at event {i} ({action} of {format_bytes(size)}): real {format_bytes(real)}, "
                  f"model {format_bytes(model)}")
        if len(self.streams) > 1:
            s += f"; {len(self.streams)} streams (the model has one pool per size class)"
        if self.unmatched_frees:
            s += f"; {self.unmatched_frees} frees of blocks allocated before the trace"
        if self.model_ooms:
            s += f"; the model refused {self.model_ooms} allocations"
        return s


def replay(events: Sequence[dict[str, Any]], capacity: int, conf: Optional[str] = None) -> ReplayResult:
    """Replay ``events`` (a torch allocator trace) on a model of ``capacity`` bytes under
    ``PYTORCH_CUDA_ALLOC_CONF`` ``conf``; see the module docs."""
    model = CachingAllocator(capacity, AllocConf.parse(conf))
    out = ReplayResult(events=len(events))
    live: dict[int, Any] = {}
    real = 0
    streams: list[Any] = []
    for i, e in enumerate(events):
        action = str(e.get("action"))
        size = int(e.get("size") or 0)
        if e.get("stream") is not None and e.get("stream") not in streams:
            streams.append(e.get("stream"))
        if action in ("segment_alloc", "segment_map"):
            real += size
            out.peak_reserved_real = max(out.peak_reserved_real, real)
            continue
        if action in ("segment_free", "segment_unmap"):
            real -= size
            continue
        if action == "alloc":
            try:
                live[int(e["addr"])] = model.malloc(size)
            except AllocatorOOM:
                out.model_ooms += 1
                continue
        elif action == "free_completed":
            block = live.pop(int(e["addr"]), None)
            if block is None:
                out.unmatched_frees += 1
                continue
            model.free(block)
        else:
            continue
        out.checked += 1
        out.peak_reserved_model = max(out.peak_reserved_model, model.reserved)
        if model.reserved != real:
            out.mismatches += 1
            if out.first_mismatch is None:
                out.first_mismatch = (i, action, size, real, model.reserved)
    out.streams = streams
    return out
