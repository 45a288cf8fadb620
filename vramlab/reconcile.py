"""The reconciled snapshot: one frozen reading of every memory layer.

``snapshot()`` reads the host, NVML and the torch allocators once and reconciles
them. For each GPU every byte of the card sits in exactly one layer, and the
layers add up to the card's total:

==================  ==========================================================
``tensors``          torch ``memory_allocated``
``torch_cache``      reserved − allocated: blocks the caching allocator keeps
``context``          NVML's figure for this process − torch reserved: the CUDA
                     context, cuBLAS workspaces, non-torch libraries
``children``         what NVML lists under the PIDs of this process's descendants
                     (``torch.multiprocessing``, ``notebook_launcher`` workers)
``other_processes``  NVML used − this process − its children
``unattributed``     used memory NVML cannot split between this process and
                     others (it does not list this PID: containers, WSL)
``driver_reserved``  memory the driver keeps (NVML v2 memory info)
``free``             the rest
==================  ==========================================================

Host memory splits the same way against the *effective limit* (the cgroup's in
a container or on Binder, else physical RAM): ``process`` (RSS), ``children``
(this process's descendants: DataLoader workers and the like), ``others``
(other processes and caches charged to the same scope), ``available`` and
``out_of_reach`` (inside the limit but not available, because the machine
itself is short).

The ``children`` layer is their summed USS when it was read (``uss=True``): the
pages only they map, which this process's RSS does not hold. Otherwise it is their
summed RSS, which counts every page a forked worker still shares with this process
(copy-on-write) once more in each worker, so it over-counts; it is capped at what
the scope uses beyond this process's RSS, so that it never pushes ``available``.

All sizes are in bytes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, Optional

from .facts import Note, NoteCode
from .model import DEVICE_LAYERS, HOST_LAYERS, DeviceSnapshot, HostReading, HostSnapshot, Snapshot
from .probes.cuda_order import bare_uuid, map_visible_devices
from .probes.host import read_host
from .probes.nvml import NvmlDevice, read_nvml
from .probes.torch_alloc import TorchDevice, read_torch

__all__ = [
    "Snapshot",
    "HostSnapshot",
    "DeviceSnapshot",
    "snapshot",
    "device_layers",
    "host_layers",
    "register_device_provider",
    "unregister_device_provider",
    "take_departed_devices",
    "reset_provider_peaks",
    "DEVICE_LAYERS",
    "HOST_LAYERS",
]


# --------------------------------------------------------------------------- reconciliation


def device_layers(
    total: Optional[int],
    used: Optional[int],
    *,
    driver_reserved: Optional[int] = None,
    process_used: Optional[int] = None,
    torch_reserved: Optional[int] = None,
    torch_allocated: Optional[int] = None,
    unattributed: Optional[int] = 0,
    other_processes: Optional[int] = None,
    children: Optional[int] = 0,
) -> tuple[tuple[str, int], ...]:
    """Split a device's total into layers that add up to ``total`` exactly (bytes).

    Readings taken a moment apart may disagree by a few blocks; each layer is then
    clamped into what is left, so the sum always equals ``total``.

    ``process_used`` is NVML's figure for this process. ``None`` means NVML cannot tell
    this process from the rest (its PID is not listed in a PID namespace, or no figure is
    given): what is used beyond torch's reserved memory is ``unattributed``, except
    ``other_processes`` bytes of processes known to be others. ``unattributed`` is what
    NVML lists under PIDs this namespace cannot see (``None``: unknown, so everything not
    this process's is unattributed); the rest of the used memory is ``other_processes``.
    ``children`` is what NVML lists under the PIDs of this process's descendants (``None``:
    unknown, counted as 0); it is taken before ``unattributed`` and ``other_processes``.
    The layers come in :data:`DEVICE_LAYERS` order.
    """
    if total is None or used is None:
        return ()
    rd = max(driver_reserved or 0, 0)
    in_use = max(min(used, total - rd), 0)
    left = in_use
    alloc = max(torch_allocated or 0, 0)
    reserved = max(torch_reserved or 0, alloc)
    out: list[tuple[str, int]] = []

    def take(key: str, n: int) -> None:
        nonlocal left
        n = max(min(n, left), 0)
        left -= n
        out.append((key, n))

    kids = max(children or 0, 0)
    take("tensors", alloc)
    take("torch_cache", reserved - alloc)
    if process_used is None:
        take("unattributed", left - kids - max(other_processes or 0, 0))
        take("children", kids)
        take("other_processes", left)
    else:
        take("context", max(process_used - reserved, 0))
        take("children", kids)
        take("unattributed", left if unattributed is None else unattributed)
        take("other_processes", left)
    out.append(("driver_reserved", min(rd, total - in_use)))
    out.append(("free", total - in_use - min(rd, total - in_use)))
    order = list(DEVICE_LAYERS)
    return tuple(sorted(out, key=lambda kv: order.index(kv[0])))


def host_layers(h: HostReading) -> tuple[tuple[str, int], ...]:
    """Split the effective limit into this process, its children, others, out of reach and
    available (bytes); they add up to ``h.limit`` exactly.

    The children's figure is their USS when read, else their summed RSS (see the module
    docs), capped at what the scope uses beyond this process's RSS.
    """
    limit = h.limit
    scope_used = h.cgroup_usage if h.cgroup_usage is not None else h.used
    process = max(min(h.process_rss, limit), 0)
    beyond = scope_used - h.process_rss
    kids_figure = h.children_uss if h.children_uss is not None else h.children_rss
    children = max(min(kids_figure, beyond, limit - process), 0)
    others = max(min(beyond - children, limit - process - children), 0)
    headroom = limit - process - children - others
    available = max(min(h.available, headroom), 0)
    return (
        ("process", process),
        ("children", children),
        ("others", others),
        ("out_of_reach", headroom - available),
        ("available", available),
    )


# --------------------------------------------------------------------------- providers (virtual devices)

DeviceProvider = Callable[[], "list[DeviceSnapshot]"]

# provider -> its peak resetter (or None); insertion-ordered
_PROVIDERS: dict[DeviceProvider, Optional[Callable[[], None]]] = {}
_CACHE_EMPTIERS: dict[DeviceProvider, Callable[[], None]] = {}
_PROVIDERS_LOCK = threading.Lock()
#: the last readings of providers that left (a virtual GPU whose context closed), for the
#: per-cell record of the cell it was entered and left in; bounded
_DEPARTED: "list[DeviceSnapshot]" = []
_DEPARTED_MAX = 16


def register_device_provider(fn: DeviceProvider, reset_peak: Optional[Callable[[], None]] = None,
                             empty_cache: Optional[Callable[[], None]] = None) -> None:
    """Add a source of extra devices; idempotent.

    This is how layers above the core plug in without the core importing them: the
    virtual GPU (:mod:`vramlab.sim`) registers itself while its context is active.
    ``fn()`` returns the devices to add to every :func:`snapshot`; ``reset_peak()``, when
    given, is called by per-cell records (:func:`reset_provider_peaks`) as they reset
    torch's and the host's peak counters. ``empty_cache()``, when given, gives the device's
    cached memory back, as ``torch.cuda.empty_cache()`` does on a card
    (:func:`empty_provider_caches`, called by ``%vram free``).
    """
    with _PROVIDERS_LOCK:
        _PROVIDERS[fn] = reset_peak
        if empty_cache is not None:
            _CACHE_EMPTIERS[fn] = empty_cache


def unregister_device_provider(fn: DeviceProvider, last: "Optional[list[DeviceSnapshot]]" = None) -> None:
    """Remove a device source added by :func:`register_device_provider`. ``last``: its devices'
    last readings, kept for :func:`take_departed_devices` (a virtual GPU entered and left inside
    one cell is then measured by that cell's record)."""
    with _PROVIDERS_LOCK:
        known = fn in _PROVIDERS
        _PROVIDERS.pop(fn, None)
        _CACHE_EMPTIERS.pop(fn, None)
        if known and last:
            _DEPARTED.extend(last)
            del _DEPARTED[:-_DEPARTED_MAX]


def take_departed_devices() -> "list[DeviceSnapshot]":
    """The last readings of the devices whose providers left since the previous call, oldest
    first, and forget them."""
    with _PROVIDERS_LOCK:
        out = list(_DEPARTED)
        _DEPARTED.clear()
    return out


def empty_provider_caches() -> None:
    """Give back the cache of every registered provider that has one (a virtual GPU's). Never raises."""
    with _PROVIDERS_LOCK:
        emptiers = list(_CACHE_EMPTIERS.values())
    for e in emptiers:
        try:
            e()
        except Exception:
            pass


def reset_provider_peaks() -> None:
    """Reset the peak of every registered provider that has a resetter. Never raises."""
    with _PROVIDERS_LOCK:
        resetters = [r for r in _PROVIDERS.values() if r is not None]
    for r in resetters:
        try:
            r()
        except Exception:
            pass


# --------------------------------------------------------------------------- snapshot()


def _order_note(visible: list[NvmlDevice]) -> Optional[Note]:
    """Before torch is up, ``cuda:i`` follows NVML's PCI order. CUDA's default order
    (``CUDA_DEVICE_ORDER=FASTEST_FIRST``) is the same only when the GPUs are alike; say
    when it is assumed."""
    if os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID":
        return None
    names = {d.name for d in visible if d.mig_index is None and d.readable}
    if len(names) <= 1:
        return None
    return Note(NoteCode.ORDER_ASSUMED, source=", ".join(sorted(names)))



def _from_parts(id: str, kind: str, nv: Optional[NvmlDevice], td: Optional[TorchDevice],
                notes: list[Note]) -> DeviceSnapshot:
    hidden: Optional[int] = 0
    if nv is not None:
        total, used, free, rd = nv.total, nv.used, nv.free, nv.reserved
        process_used, others, hidden = nv.process_used, nv.other_processes_used, nv.unattributed_used
        kids = nv.children_used
        holds = bool(td is not None and td.reserved)
        if nv.readable and nv.process_list is not None and not nv.pid_listed and (nv.hidden_pids or holds):
            # NVML does not list this PID: in a PID namespace its memory is under a host PID
            process_used = None
            if nv.hidden_pids:
                notes.append(Note(NoteCode.PIDS_HIDDEN_SELF_UNLISTED, device=id, count=nv.hidden_pids))
            else:
                notes.append(Note(NoteCode.SELF_UNLISTED, device=id))
        elif nv.readable and nv.hidden_pids:
            notes.append(Note(NoteCode.PIDS_HIDDEN, device=id, count=nv.hidden_pids))
        elif nv.readable and nv.process_list is not None and nv.pid_listed and process_used is None:
            notes.append(Note(NoteCode.NO_PROCESS_MEMORY, device=id))
    else:
        total = td.mem_total if td is not None else None
        free = td.mem_free if td is not None else None
        used = (total - free) if total is not None and free is not None else None
        rd = None
        process_used = others = kids = None
        if td is not None and td.kind == "mps":
            used = td.reserved
            free = None if total is None or used is None else max(total - used, 0)
            process_used = td.reserved
    layers = device_layers(
        total, used,
        driver_reserved=rd,
        process_used=process_used,
        torch_reserved=td.reserved if td else None,
        torch_allocated=td.allocated if td else None,
        unattributed=hidden,
        other_processes=others,
        children=kids,
    )
    source = "+".join(s for s, present in (("nvml", nv is not None), ("torch", td is not None)) if present)
    return DeviceSnapshot(
        id=id,
        kind=kind,
        name=(nv.name if nv is not None else (td.name if td else None)),
        uuid=(nv.uuid if nv is not None else (td.uuid if td else None)),
        source=source,
        nvml_index=nv.index if nv is not None else None,
        unreadable=nv.unreadable if nv is not None else None,
        total=total,
        free=free,
        used=used,
        driver_reserved=rd,
        process_used=process_used,
        other_processes_used=others,
        utilization=nv.utilization if nv is not None else None,
        torch_allocated=td.allocated if td else None,
        torch_reserved=td.reserved if td else None,
        torch_active=td.active if td else None,
        torch_inactive_split=td.inactive_split if td else None,
        torch_peak_allocated=td.peak_allocated if td else None,
        torch_peak_reserved=td.peak_reserved if td else None,
        num_ooms=td.num_ooms if td else None,
        num_alloc_retries=td.num_alloc_retries if td else None,
        mem_info_free=td.mem_free if td else None,
        mem_info_total=td.mem_total if td else None,
        unified_memory=bool(nv.unified_memory) if nv is not None else False,
        layers=layers,
        children_used=kids,
    )


def snapshot(*, uss: bool = False, import_torch: bool = False, cuda_calls: bool = True) -> Snapshot:
    """Read every memory layer now and reconcile it. Never raises for a missing layer.

    Args:
        uss: also read the USS of this process and of its children, and their PSS (walks
            every mapping: slower). The host's ``children`` layer is then their USS.
        import_torch: import torch to read its allocators even if the user has not.
            By default torch is read only when it is already imported, and CUDA
            only when it is already initialised: reading never creates a context.
        cuda_calls: allow torch calls that may reach the CUDA runtime (``mem_get_info``,
            device properties). The background sampler passes ``False`` (safe during
            CUDA graph capture): NVML and the allocator's host-side counters only.
    """
    notes: list[Note] = []  # the host's first (an unreadable cgroup file), then the devices'
    h = read_host(uss=uss)
    notes.extend(h.notes)
    host = HostSnapshot(**vars(h), layers=host_layers(h))
    nvml = read_nvml(children=h.children_pids)
    notes.extend(nvml.notes)
    torch_reading = read_torch(import_torch=import_torch, runtime_calls=cuda_calls)
    torch_devs = torch_reading.devices
    notes.extend(torch_reading.notes)

    devices: list[DeviceSnapshot] = []
    nv_by_uuid = {bare_uuid(d.uuid): d for d in nvml.devices if d.uuid}
    used_nv: set[tuple[int, Optional[int]]] = set()
    cuda_t = [t for t in torch_devs if t.kind == "cuda"]
    visible = map_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), nvml.devices)
    if cuda_t:
        # torch is up: map by the UUIDs torch reports (exact).
        for t in cuda_t:
            nv = nv_by_uuid.get(bare_uuid(t.uuid)) if t.uuid else None
            if nv is None and t.uuid is None and t.index < len(visible):
                nv = visible[t.index]  # old torch without uuid: fall back to the env mapping
            if nv is not None:
                used_nv.add((nv.index, nv.mig_index))
            elif nvml.devices:
                notes.append(Note(NoteCode.NO_NVML_MATCH, device=t.id, source=str(t.uuid)))
            devices.append(_from_parts(t.id, "cuda", nv, t, notes))
    else:
        for i, nv in enumerate(visible):
            used_nv.add((nv.index, nv.mig_index))
            devices.append(_from_parts(f"cuda:{i}", "cuda", nv, None, notes))
        order = _order_note(visible)
        if order:
            notes.append(order)
        if visible and "torch" in sys.modules:
            notes.append(Note(NoteCode.CUDA_NOT_INITIALISED))
    for t in torch_devs:
        if t.kind != "cuda":
            devices.append(_from_parts(t.id, t.kind, None, t, notes))
    for nv in nvml.devices:
        if (nv.index, nv.mig_index) in used_nv or (nv.mig_enabled and any(
                m.mig_index is not None and m.index == nv.index and (m.index, m.mig_index) in used_nv
                for m in nvml.devices)):
            continue
        devices.append(_from_parts(f"nvml:{nv.index}" + (f".{nv.mig_index}" if nv.mig_index is not None else ""),
                                   "cuda", nv, None, notes))
    with _PROVIDERS_LOCK:
        providers = list(_PROVIDERS)
    for p in providers:
        try:
            devices.extend(p())
        except Exception as e:
            notes.append(Note(NoteCode.PROVIDER_FAILED, source=str(getattr(p, "__qualname__", p)),
                              detail=f"{type(e).__name__}: {e}"))
    if "torch" not in sys.modules:
        notes.append(Note(NoteCode.TORCH_NOT_IMPORTED))
    return Snapshot(time=h.time, host=host, devices=tuple(devices), notes=tuple(notes))
