"""CUDA's device order: which NVML device is ``cuda:i``.

NVML numbers GPUs by PCI bus; CUDA (and so torch) numbers what ``CUDA_VISIBLE_DEVICES``
leaves visible. :func:`map_visible_devices` applies the CUDA runtime's rules (integers,
``GPU-`` UUIDs, ``MIG-`` UUIDs, unique prefixes, stop at the first invalid entry) so that
vramlab's ``cuda:0`` is torch's ``cuda:0``. When torch has initialised CUDA, the snapshot
maps by the UUIDs torch reports instead, which is exact.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .nvml import NvmlDevice

__all__ = ["map_visible_devices", "parse_visible_devices", "bare_uuid"]


def bare_uuid(uuid: Optional[str]) -> str:
    """A UUID without its ``GPU-``/``MIG-`` prefix, lower case: torch reports the bare form,
    NVML the prefixed one, and a MIG instance's bytes are the same in both."""
    u = (uuid or "").strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            return u[len(prefix):]
    return u


def parse_visible_devices(value: Optional[str]) -> Optional[list[str]]:
    """Split a CUDA_VISIBLE_DEVICES value into its entries.

    ``None`` (unset) means "every device"; an empty string means none.
    """
    if value is None:
        return None
    tokens = [t.strip() for t in value.split(",")]
    return [t for t in tokens if t != ""] if value.strip() else []


def _instances(gpu: NvmlDevice, devices: Sequence[NvmlDevice]) -> list[NvmlDevice]:
    """The MIG instances of a MIG-enabled GPU, by device slot."""
    kids = [m for m in devices if m.mig_index is not None and m.parent_uuid is not None and m.parent_uuid == gpu.uuid]
    return sorted(kids, key=lambda m: m.mig_index or 0)


def _default_order(devices: Sequence[NvmlDevice]) -> list[NvmlDevice]:
    """The devices CUDA enumerates with no CUDA_VISIBLE_DEVICES: the whole GPUs without MIG,
    and one MIG instance in the place of the first MIG-enabled GPU (a CUDA process can
    enumerate a single MIG device: NVIDIA's MIG user guide, "CUDA Device Enumeration")."""
    out: list[NvmlDevice] = []
    mig_taken = False
    for d in devices:
        if d.mig_index is not None:
            continue
        if d.mig_enabled:
            kids = _instances(d, devices)
            if kids and not mig_taken:
                out.append(kids[0])
                mig_taken = True
        else:
            out.append(d)
    return out


def _match_prefix(token: str, candidates: Sequence[NvmlDevice]) -> Optional[NvmlDevice]:
    hits = [d for d in candidates if d.uuid is not None and d.uuid.lower().startswith(token.lower())]
    return hits[0] if len(hits) == 1 else None


def map_visible_devices(value: Optional[str], devices: Sequence[NvmlDevice]) -> list[NvmlDevice]:
    """Map CUDA_VISIBLE_DEVICES onto NVML devices, in CUDA's order.

    Follows the CUDA runtime's rules: entries are integers (the NVML index each device
    reports, which is CUDA's order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), ``GPU-<uuid>``
    or ``MIG-<uuid>`` (unique prefixes allowed), or the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``
    (matched by GPU-instance and compute-instance id, not by position); parsing stops at
    the first entry that names no device, and a device named twice ends the list too. A
    process enumerates at most one MIG device. Returns the visible devices; position ``i``
    is ``cuda:i``. A device that NVML could not read keeps its place.
    """
    tokens = parse_visible_devices(value)
    if tokens is None:
        return _default_order(devices)
    whole = [d for d in devices if d.mig_index is None]
    by_index = {d.index: d for d in whole}
    migs = [d for d in devices if d.mig_index is not None]
    out: list[NvmlDevice] = []
    seen: set[tuple[int, Optional[int]]] = set()
    for tok in tokens:
        dev: Optional[NvmlDevice] = None
        if tok.lstrip("+-").isdigit():
            dev = by_index.get(int(tok))
            if dev is not None and dev.mig_enabled:
                kids = _instances(dev, devices)
                dev = kids[0] if kids else None
        elif tok.upper().startswith("MIG-GPU-"):
            # legacy form MIG-GPU-<uuid>/<gpu instance id>/<compute instance id>
            parent_tok, _, rest = tok[4:].partition("/")
            parent = _match_prefix(parent_tok, whole)
            ids = rest.split("/")
            if parent is not None and len(ids) == 2 and all(x.isdigit() for x in ids):
                gi, ci = int(ids[0]), int(ids[1])
                hits = [m for m in _instances(parent, devices)
                        if m.gpu_instance_id == gi and m.compute_instance_id == ci]
                dev = hits[0] if hits else None
        elif tok.upper().startswith("MIG-"):
            dev = _match_prefix(tok, migs)
        elif tok.upper().startswith("GPU-"):
            dev = _match_prefix(tok, whole)
            if dev is not None and dev.mig_enabled:
                kids = _instances(dev, devices)
                dev = kids[0] if kids else None
        key = None if dev is None else (dev.index, dev.mig_index)
        if dev is None or key in seen:
            break
        if dev.mig_index is not None and any(m for m in out if m.mig_index is not None):
            break  # a second MIG device: CUDA enumerates one per process
        seen.add(key)  # type: ignore[arg-type]
        out.append(dev)
    return out
