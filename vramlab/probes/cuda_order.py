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

__all__ = ["map_visible_devices", "parse_visible_devices"]


def parse_visible_devices(value: Optional[str]) -> Optional[list[str]]:
    """Split a CUDA_VISIBLE_DEVICES value into its entries.

    ``None`` (unset) means "every device"; an empty string means none.
    """
    if value is None:
        return None
    tokens = [t.strip() for t in value.split(",")]
    return [t for t in tokens if t != ""] if value.strip() else []


def _default_order(devices: Sequence[NvmlDevice]) -> list[NvmlDevice]:
    """The devices CUDA enumerates with no CUDA_VISIBLE_DEVICES: whole GPUs, and the
    MIG instances of MIG-enabled GPUs in their place."""
    out: list[NvmlDevice] = []
    for d in devices:
        if d.mig_index is not None:
            continue
        if d.mig_enabled:
            out.extend(m for m in devices if m.mig_index is not None and m.parent_uuid == d.uuid)
        else:
            out.append(d)
    return out


def _match_prefix(token: str, candidates: Sequence[NvmlDevice]) -> Optional[NvmlDevice]:
    hits = [d for d in candidates if d.uuid.lower().startswith(token.lower())]
    return hits[0] if len(hits) == 1 else None


def map_visible_devices(value: Optional[str], devices: Sequence[NvmlDevice]) -> list[NvmlDevice]:
    """Map CUDA_VISIBLE_DEVICES onto NVML devices, in CUDA's order.

    Follows the CUDA runtime's rules: entries are integers (NVML/PCI order, which is
    CUDA's order under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), ``GPU-<uuid>`` or
    ``MIG-<uuid>`` (unique prefixes allowed), or legacy ``MIG-GPU-<uuid>/<gi>/<ci>``;
    parsing stops at the first entry that names no device, and a device named twice
    ends the list too. Returns the visible devices; position ``i`` is ``cuda:i``.
    """
    tokens = parse_visible_devices(value)
    whole = [d for d in devices if d.mig_index is None]
    migs = [d for d in devices if d.mig_index is not None]
    if tokens is None:
        return _default_order(devices)
    out: list[NvmlDevice] = []
    seen: set[str] = set()
    for tok in tokens:
        dev: Optional[NvmlDevice] = None
        if tok.lstrip("+-").isdigit():
            i = int(tok)
            if 0 <= i < len(whole):
                dev = whole[i]
                if dev.mig_enabled:
                    kids = [m for m in migs if m.parent_uuid == dev.uuid]
                    dev = kids[0] if kids else None
        elif tok.upper().startswith("MIG-GPU-"):
            # legacy form MIG-GPU-<uuid>/<gpu instance>/<compute instance>
            parent_tok, _, rest = tok[4:].partition("/")
            parent = _match_prefix(parent_tok, whole)
            if parent is not None:
                kids = [m for m in migs if m.parent_uuid == parent.uuid]
                try:
                    gi = int(rest.split("/")[0])
                    dev = kids[gi] if 0 <= gi < len(kids) else None
                except ValueError:
                    dev = None
        elif tok.upper().startswith("MIG-"):
            dev = _match_prefix(tok, migs)
        elif tok.upper().startswith("GPU-"):
            dev = _match_prefix(tok, whole)
            if dev is not None and dev.mig_enabled:
                kids = [m for m in migs if m.parent_uuid == dev.uuid]
                dev = kids[0] if kids else None
        if dev is None or dev.uuid in seen:
            break
        seen.add(dev.uuid)
        out.append(dev)
    return out
