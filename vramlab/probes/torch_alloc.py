"""PyTorch allocator probe: CUDA (and ROCm, which torch calls ``cuda``), XPU and MPS.

All sizes are in bytes. This module never imports torch: it reads only when torch
is already in ``sys.modules`` (or ``import_torch=True`` is passed), and it never
initialises a device runtime just to read. CUDA and XPU are read only when
``is_initialized()`` says the runtime is up, and ``mem_get_info`` only on devices
where the allocator already holds memory (so a context certainly exists there), and
only by readers that may call the runtime (``runtime_calls=True``: not the sampler).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional

from ..facts import Note, NoteCode

__all__ = ["TorchDevice", "TorchReading", "read_torch", "torch_imported", "reset_peaks"]


@dataclass(frozen=True)
class TorchDevice:
    """Allocator statistics of one torch device. Sizes in bytes; ``None`` where not reported.

    Attributes:
        id: torch's name, e.g. ``"cuda:0"``.
        kind: ``"cuda"``, ``"xpu"`` or ``"mps"``.
        index: the torch device index.
        name: the device name.
        uuid: the device UUID as torch reports it (without NVML's ``GPU-``/``MIG-`` prefix), or ``None``.
        allocated: bytes in live tensors (``memory_allocated``).
        reserved: bytes the caching allocator holds from the driver (``memory_reserved``).
        active: bytes in active blocks (allocated, plus blocks in use by streams).
        inactive_split: bytes in inactive blocks that are split, i.e. cached but fragmented.
        peak_allocated, peak_reserved: peaks since the last ``reset_peak_memory_stats``.
        num_ooms: out-of-memory errors the allocator raised.
        num_alloc_retries: allocations that had to free the cache and retry.
        mem_free, mem_total: ``mem_get_info`` (driver view), read only where a context exists.
    """

    id: str
    kind: str
    index: int
    name: Optional[str]
    uuid: Optional[str]
    allocated: Optional[int]
    reserved: Optional[int]
    active: Optional[int]
    inactive_split: Optional[int]
    peak_allocated: Optional[int]
    peak_reserved: Optional[int]
    num_ooms: Optional[int]
    num_alloc_retries: Optional[int]
    mem_free: Optional[int]
    mem_total: Optional[int]


def torch_imported() -> bool:
    """Whether torch is already imported in this process."""
    return "torch" in sys.modules


_NAMES: dict[tuple[str, int], tuple[Optional[str], Optional[str]]] = {}


def _name_uuid(mod: Any, kind: str, i: int, runtime_calls: bool = True) -> tuple[Optional[str], Optional[str]]:
    key = (kind, i)
    if key not in _NAMES:
        if not runtime_calls:
            return None, None  # get_device_properties may call the runtime: leave it to the next full read
        name = uuid = None
        try:
            props = mod.get_device_properties(i)
            name = getattr(props, "name", None)
            u = getattr(props, "uuid", None)
            if u is not None:
                uuid = str(u).strip() or None  # as torch reports it: a MIG instance's too, unprefixed
        except Exception:
            pass
        _NAMES[key] = (name, uuid)
    return _NAMES[key]


def _stats_device(mod: Any, kind: str, i: int, runtime_calls: bool = True) -> TorchDevice:
    st = mod.memory_stats(i)
    g = st.get
    reserved = g("reserved_bytes.all.current")
    free = total = None
    if reserved and runtime_calls:
        try:
            free, total = (int(x) for x in mod.mem_get_info(i))
        except Exception:
            free = total = None
    name, uuid = _name_uuid(mod, kind, i, runtime_calls)
    return TorchDevice(
        id=f"{kind}:{i}",
        kind=kind,
        index=i,
        name=name,
        uuid=uuid,
        allocated=g("allocated_bytes.all.current", 0),
        reserved=reserved if reserved is not None else 0,
        active=g("active_bytes.all.current", 0),
        inactive_split=g("inactive_split_bytes.all.current", 0),
        peak_allocated=g("allocated_bytes.all.peak", 0),
        peak_reserved=g("reserved_bytes.all.peak", 0),
        num_ooms=g("num_ooms", 0),
        num_alloc_retries=g("num_alloc_retries", 0),
        mem_free=free,
        mem_total=total,
    )


@dataclass(frozen=True)
class TorchReading:
    """Every initialised torch device, and what could not be read (``notes``)."""

    devices: tuple[TorchDevice, ...] = ()
    notes: tuple[Note, ...] = ()


def read_torch(import_torch: bool = False, runtime_calls: bool = True) -> TorchReading:
    """Read every initialised torch device. Never raises: what cannot be read is a note.

    Args:
        import_torch: import torch if it is not imported yet (a torch feature was asked for).
        runtime_calls: allow calls that may reach the CUDA runtime (``mem_get_info``, and
            ``get_device_properties`` the first time a device is read). The sampler thread
            passes ``False``: a runtime call from another thread during CUDA graph capture
            can invalidate the capture. It then reads only ``is_initialized``,
            ``device_count`` (cached by torch once CUDA is up) and ``memory_stats`` (the
            caching allocator's host-side counters).
    """
    if not import_torch and "torch" not in sys.modules:
        return TorchReading()
    notes: list[Note] = []
    out: list[TorchDevice] = []
    try:
        import torch
    except Exception as e:
        return TorchReading(notes=(Note(NoteCode.TORCH_UNIMPORTABLE, detail=f"{type(e).__name__}: {e}"),))
    if not hasattr(torch, "cuda"):  # torch is half-imported (we are inside its import)
        return TorchReading()
    for kind in ("cuda", "xpu"):
        mod = getattr(torch, kind, None)
        if mod is None:
            continue
        try:
            if not mod.is_initialized():
                continue
            n = mod.device_count()
        except Exception:
            continue
        for i in range(n):
            try:
                out.append(_stats_device(mod, kind, i, runtime_calls))
            except Exception as e:
                notes.append(Note(NoteCode.TORCH_STATS_UNAVAILABLE, device=f"{kind}:{i}", detail=f"{type(e).__name__}: {e}"))
    mps = getattr(torch, "mps", None)
    backends_mps = getattr(getattr(torch, "backends", None), "mps", None)
    try:
        mps_ok = bool(mps is not None and backends_mps is not None and backends_mps.is_available())
    except Exception:
        mps_ok = False
    if mps_ok and mps is not None:
        try:
            total = None
            if hasattr(mps, "recommended_max_memory"):
                total = int(mps.recommended_max_memory())
            out.append(TorchDevice(
                id="mps:0", kind="mps", index=0, name="Apple MPS", uuid=None,
                allocated=int(mps.current_allocated_memory()),
                reserved=int(mps.driver_allocated_memory()),
                active=None, inactive_split=None, peak_allocated=None, peak_reserved=None,
                num_ooms=None, num_alloc_retries=None, mem_free=None, mem_total=total,
            ))
        except Exception as e:
            notes.append(Note(NoteCode.TORCH_STATS_UNAVAILABLE, device="mps", detail=f"{type(e).__name__}: {e}"))
    return TorchReading(tuple(out), tuple(notes))


def reset_peaks() -> list[str]:
    """Reset the peak counters of every initialised CUDA/XPU device (global in torch).

    Returns the ids reset. Does nothing (and imports nothing) when torch is not imported.
    """
    done: list[str] = []
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return done
    for kind in ("cuda", "xpu"):
        mod = getattr(torch, kind, None)
        try:
            if mod is None or not mod.is_initialized():
                continue
            for i in range(mod.device_count()):
                mod.reset_peak_memory_stats(i)
                done.append(f"{kind}:{i}")
        except Exception:
            continue
    return done
