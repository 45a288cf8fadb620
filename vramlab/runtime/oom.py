"""Out-of-memory explainer and recovery.

:func:`explain_oom` turns a ``torch.OutOfMemoryError`` (CUDA, or the virtual GPU) into
what a person needs to act: what was requested, what was free, what is reserved but
unallocated (fragmentation), the largest live consumers, and suggestions ranked by
those numbers. :func:`free_last_error` drops what the last traceback keeps alive and
returns the memory to the device and the host.

Sizes are in bytes.
"""

from __future__ import annotations

import gc
import re
import sys
from typing import Any, Optional

from ..i18n import tr
from ..model import Consumer, FreedDevice, FreedReport, OOMExplanation
from ..reconcile import snapshot
from ..units import format_bytes, parse_size

__all__ = ["OOMExplanation", "FreedReport", "is_oom", "drop_traceback", "parse_oom_message", "explain_oom",
           "free_last_error"]

_SIZE = r"([0-9.]+\s*(?:bytes|B|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB))"
_PATTERNS = {
    "requested": re.compile(r"Tried to allocate " + _SIZE, re.I),
    "total": re.compile(r"total capacity of " + _SIZE, re.I),
    "free": re.compile(r"of which " + _SIZE + r" is free", re.I),
    "torch_allocated": re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", re.I),
    "reserved_unallocated": re.compile(_SIZE + r" is reserved by PyTorch but unallocated", re.I),
    "process_in_use": re.compile(r"(?:Process \d+|Including non-PyTorch memory, this process) has " + _SIZE
                                 + r" memory in use", re.I),
}
_GPU_INDEX = re.compile(r"GPU (\d+) has a total capacity", re.I)
_BATCH_NAMES = ("batch_size", "BATCH_SIZE", "bs", "batch")


def is_oom(exc: Optional[BaseException]) -> bool:
    """Whether ``exc`` is a device out-of-memory error, without importing torch.

    ``torch.OutOfMemoryError`` (CUDA's caching allocator and the virtual GPU), or a
    ``RuntimeError`` whose message says ``out of memory`` (HIP, XPU, MPS, and CUDA errors
    raised outside the caching allocator, such as ``CUDA error: out of memory``).
    """
    if exc is None:
        return False
    for cls in type(exc).__mro__:
        if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
            return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def drop_traceback(exc: Optional[BaseException]) -> list[str]:
    """Release what a caught exception keeps alive: clear the locals of every frame in its
    traceback and in those of its chained exceptions (``__cause__``/``__context__``), then
    detach the tracebacks, so that the tensors of a failed step can be freed.

    Returns one ``"frames of <type>"`` entry per exception whose frames were cleared
    (a frame that is still executing cannot be cleared and is left alone).
    """
    cleared: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _clear_frames(exc.__traceback__):
            cleared.append(f"frames of {type(exc).__name__}")
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    return cleared


def _clear_frames(tb: Any) -> int:
    """Clear the frames of one traceback; returns how many could be cleared."""
    n = 0
    while tb is not None:
        try:
            tb.tb_frame.clear()
            n += 1
        except RuntimeError:
            pass  # a frame still executing
        tb = tb.tb_next
    return n


def parse_oom_message(message: str) -> dict[str, Optional[int]]:
    """Read the figures out of a CUDA-style OOM message (bytes; ``None`` where absent)."""
    out: dict[str, Optional[int]] = {}
    for key, pat in _PATTERNS.items():
        m = pat.search(message)
        value: Optional[int] = None
        if m:
            try:
                value = parse_size(m.group(1).replace("bytes", "B"))
            except ValueError:
                value = None
        out[key] = value
    g = _GPU_INDEX.search(message)
    out["gpu_index"] = int(g.group(1)) if g else None
    return out


def _live_consumers(ns: Optional[dict[str, Any]], limit: int = 5) -> list[Consumer]:
    """The largest tensors, modules and optimizers named in ``ns`` (unique storages)."""
    torch = sys.modules.get("torch")
    if torch is None or not ns:
        return []
    out: list[Consumer] = []
    for name, obj in list(ns.items()):
        if name.startswith("_"):
            continue
        tensors = []
        try:
            if isinstance(obj, torch.Tensor):
                tensors = [obj]
            elif isinstance(obj, torch.nn.Module):
                tensors = list(obj.parameters()) + list(obj.buffers())
                tensors += [p.grad for p in obj.parameters() if p.grad is not None]
            elif isinstance(obj, torch.optim.Optimizer):
                tensors = [v for st in obj.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
            elif isinstance(obj, (list, tuple)) and obj and all(isinstance(t, torch.Tensor) for t in obj[:64]):
                tensors = list(obj)
        except Exception:
            continue
        seen: set[int] = set()
        total = 0
        devices: set[str] = set()
        for t in tensors:
            try:
                st = t.untyped_storage()
                key = st.data_ptr()
                if key in seen:
                    continue
                seen.add(key)
                total += st.nbytes()
                devices.add(str(t.device))
            except Exception:
                continue
        if total:
            out.append(Consumer(name, total, ", ".join(sorted(devices))))
    out.sort(key=lambda c: -c.nbytes)
    return out[:limit]


def explain_oom(exc: BaseException, user_ns: Optional[dict[str, Any]] = None,
                record: Any = None) -> OOMExplanation:
    """Explain an out-of-memory error.

    Args:
        exc: the exception.
        user_ns: the namespace to search for live tensors, modules, optimizers and a
            batch size variable (``batch_size``, ``bs``, ``batch``).
        record: the cell's :class:`~vramlab.model.CellRecord`, when one was taken: its
            allocation during the cell gives the measured per-sample cost.
    """
    msg = str(exc)
    f = parse_oom_message(msg)
    requested, free, frag = f["requested"], f["free"], f["reserved_unallocated"]
    # What torch reserved but has not allocated could not serve the request: the allocator
    # tries its cached blocks first and releases the wholly free ones before it gives up, so
    # what is left sits in split blocks (segments that still hold live tensors), none large
    # enough. It is not usable; it is fragmentation.
    shortfall = None
    frag_cause = False
    if requested is not None and free is not None:
        shortfall = max(requested - free, 0)
        frag_cause = bool(frag) and free + (frag or 0) >= requested
    consumers = tuple(_live_consumers(user_ns))
    bs = None
    for n in _BATCH_NAMES:
        v = (user_ns or {}).get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            bs = v
            break
    fit_bs = None
    suggestions: list[str] = []
    deltas = [d.peak_allocated_delta for d in record.devices if d.peak_allocated_delta is not None] \
        if record is not None else []
    if bs is not None and requested is not None and free is not None and deltas:
        # the cell's own growth is known: it wanted at least what it allocated plus the failed
        # request, and had at most that allocation plus what was free. If memory grew in
        # proportion to the batch, bs * budget / need would be the limit; whatever does not grow
        # with the batch makes the true limit lower, so it is an upper bound.
        cell_alloc = max(max(deltas), 0)
        need = cell_alloc + requested
        budget = cell_alloc + free  # the fragmented cache is not usable
        fit_bs = min(max(int(bs * budget // need), 0), bs - 1)
        per = need / bs
        suggestions.append(tr(
            "batch size {bs} -> at most {fit}, an upper bound: the cell wanted at least {need} ({per} per "
            "sample, as if all of it grew with the batch) and {budget} was available to it; what does not "
            "grow with the batch (weights, optimizer state) makes the true limit lower, and "
            "vramlab.find_max_batch_size finds it exactly", bs=bs, fit=fit_bs, need=format_bytes(need),
            per=format_bytes(per), budget=format_bytes(budget)))
    elif bs is not None and bs > 1:
        # without the cell's own measurement, the failed request says nothing about the rest of
        # the step: no batch can be derived, only halving advised
        suggestions.append(tr(
            "batch size {bs} -> try {half}: vramlab did not measure this cell (%vram auto on, or %%vram, "
            "does), so only halving can be advised; vramlab.find_max_batch_size finds the largest batch "
            "that fits", bs=bs, half=bs // 2))
    elif requested is not None and free is not None and requested > 0:
        suggestions.append(tr("shrink what this step holds at once (the batch) to at most {pct}% of the failed "
                              "request's size", pct=f"{100.0 * free / requested:.0f}"))
    if frag and requested and (frag_cause or frag >= 0.5 * requested):
        # when free memory and the cache together could hold the request, fragmentation is the cause
        at = 0 if frag_cause else len(suggestions)
        suggestions.insert(at, tr("{cached} is cached but fragmented: set "
                                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch starts, "
                                  "or call torch.cuda.empty_cache() between phases", cached=format_bytes(frag)))
    suggestions.append(tr("mixed precision (torch.autocast with bf16/fp16) halves activation bytes"))
    suggestions.append(tr("gradient checkpointing (torch.utils.checkpoint) trades recompute for activations"))
    suggestions.append(tr("offload activations (torch.autograd.graph.save_on_cpu) or optimizer state to host RAM"))
    return OOMExplanation(message=msg, requested=requested, total=f["total"], free=free, reserved_unallocated=frag,
                          torch_allocated=f["torch_allocated"], shortfall=shortfall, consumers=consumers,
                          fragmentation_is_cause=frag_cause,
                          suggestions=tuple(suggestions), batch_size=bs, fitting_batch_size=fit_bs)


def free_last_error(shell: Any = None) -> FreedReport:
    """Drop the last exception and everything its frames keep alive, collect, empty the cache.

    Clears ``sys.last_value``/``last_traceback``/``last_type`` (and ``last_exc``),
    the locals of every frame in the traceback and its chained exceptions, IPython's
    copy of the last traceback, then runs ``gc.collect()`` and, where torch has
    initialised CUDA, ``torch.cuda.empty_cache()``.
    """
    before = snapshot()
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(sys, "last_traceback", None)
    cleared = drop_traceback(exc)
    _clear_frames(tb)
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if getattr(sys, name, None) is not None:
            setattr(sys, name, None)
            cleared.append(f"sys.{name}")
    if shell is not None:
        for holder in ("InteractiveTB", "SyntaxTB"):
            obj = getattr(shell, holder, None)
            if obj is not None and getattr(obj, "tb", None) is not None:
                obj.tb = None
                cleared.append(f"{holder}.tb")
    del exc, tb
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:
            pass
    after = snapshot()
    prev = {d.id: d for d in before.devices}
    devs = []
    for d in after.devices:
        p = prev.get(d.id)
        if p is None:
            continue
        devs.append(FreedDevice(d.id, (p.torch_allocated or 0) - (d.torch_allocated or 0),
                                (p.torch_reserved or 0) - (d.torch_reserved or 0)))
    return FreedReport(host=before.host.process_rss - after.host.process_rss, devices=tuple(devs),
                       cleared=tuple(cleared))
