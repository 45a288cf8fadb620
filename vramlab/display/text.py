"""Plain-text rendering of a Snapshot: an aligned table that tells the whole story."""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING, Optional

from .._sizes import format_bytes
from .._snapshot import DEVICE_LAYERS, HOST_LAYERS, Snapshot

if TYPE_CHECKING:
    from ..cells import CellRecord

__all__ = ["snapshot_text", "text_bar", "record_text"]

#: One character per layer in text bars.
BAR_CHARS: dict[str, str] = {
    "tensors": "#",
    "torch_cache": "=",
    "context": "+",
    "unattributed": "?",
    "other_processes": "%",
    "driver_reserved": "!",
    "free": ".",
    "process": "#",
    "others": "%",
    "out_of_reach": "x",
    "available": ".",
}


def text_bar(layers: tuple[tuple[str, int], ...], width: int = 40) -> str:
    """A stacked bar of ``width`` characters, one character kind per layer."""
    total = sum(n for _, n in layers)
    if total <= 0:
        return "[" + " " * width + "]"
    cells: list[str] = []
    acc = 0
    drawn = 0
    for key, n in layers:
        acc += n
        upto = round(acc * width / total)
        cells.append(BAR_CHARS.get(key, "?") * (upto - drawn))
        drawn = upto
    return "[" + "".join(cells) + "]"


def _pct(n: int, total: Optional[int]) -> str:
    if not total:
        return ""
    return f"{100.0 * n / total:5.1f}%"


def snapshot_text(s: Snapshot, width: int = 40) -> str:
    """Render ``s`` as an aligned plain-text table (sizes in IEC units)."""
    when = _dt.datetime.fromtimestamp(s.time).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"vramlab snapshot {when}", ""]
    h = s.host
    lines.append(f"host  limit {format_bytes(h.limit)} ({h.limit_source}), RAM {format_bytes(h.total)}")
    lines.append("  " + text_bar(h.layers, width))
    for key, n in h.layers:
        if key == "out_of_reach" and n == 0:
            continue
        label = HOST_LAYERS[key]
        extra = ""
        if key == "process":
            peak = format_bytes(h.process_peak)
            extra = f"  peak {peak}" + ("" if h.peak_exact else " (lifetime, not resettable)")
            if h.process_uss is not None:
                extra += f"  USS {format_bytes(h.process_uss)}"
        lines.append(f"  {BAR_CHARS[key]} {label:<20}{format_bytes(n):>12} {_pct(n, h.limit)}{extra}")
    if h.swap_total:
        lines.append(f"  swap {format_bytes(h.swap_used)} of {format_bytes(h.swap_total)} used,"
                     f" paged in {format_bytes(h.swap_in)}, out {format_bytes(h.swap_out)} since boot")
    else:
        lines.append("  swap none configured")
    for d in s.devices:
        lines.append("")
        head = f"{d.id}  {d.name or '?'}"
        if d.total is not None:
            head += f"  total {format_bytes(d.total)}"
        if d.utilization is not None:
            head += f"  util {d.utilization}%"
        lines.append(head)
        if d.layers:
            lines.append("  " + text_bar(d.layers, width))
            for key, n in d.layers:
                if n == 0 and key in ("driver_reserved", "unattributed"):
                    continue
                label = DEVICE_LAYERS[key]
                lines.append(f"  {BAR_CHARS[key]} {label:<20}{format_bytes(n):>12} {_pct(n, d.total)}")
        if d.torch_peak_allocated is not None:
            extra = f"  peak allocated {format_bytes(d.torch_peak_allocated)}, peak reserved {format_bytes(d.torch_peak_reserved)}"
            if d.torch_inactive_split:
                extra += f", fragmented {format_bytes(d.torch_inactive_split)}"
            if d.num_ooms:
                extra += f", OOMs {d.num_ooms}"
            lines.append(extra)
        if d.source == "nvml" and d.id.startswith("cuda"):
            lines.append("  (torch has not used this device: no allocator figures)")
    if not s.devices:
        lines.append("")
        lines.append("no accelerators")
    if s.notes:
        lines.append("")
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in s.notes)
    return "\n".join(lines)


def record_text(r: "CellRecord") -> str:
    """A per-cell record as a small aligned table."""
    from .._sizes import format_bytes as fb

    h = r.host
    head = f"vramlab cell {r.execution_count if r.execution_count is not None else '-'} · {r.wall_s:.3f} s"
    if r.error:
        head += f" · raised {r.error}"
    lines = [head, f"  {'':<10}{'delta':>12}{'peak during cell':>20}"]
    peak = "n/a" if h.peak_delta is None else "+" + fb(max(h.peak_delta, 0))
    lines.append(f"  {'host RSS':<10}{fb(h.rss_delta, signed=True):>12}{peak:>20}")
    if h.swap_delta:
        lines.append(f"  {'swap':<10}{fb(h.swap_delta, signed=True):>12}")
    for d in r.devices:
        if d.allocated_delta is None and d.nvml_delta is None:
            continue
        pk = "n/a" if d.peak_allocated_delta is None else "+" + fb(max(d.peak_allocated_delta, 0))
        lines.append(f"  {d.id:<10}{fb(d.allocated_delta, signed=True):>12}{pk:>20}  allocated")
        if d.reserved_delta is not None:
            lines.append(f"  {'':<10}{fb(d.reserved_delta, signed=True):>12}{'':>20}  reserved")
        if d.nvml_delta is not None:
            lines.append(f"  {'':<10}{fb(d.nvml_delta, signed=True):>12}{'':>20}  NVML (this process)")
    if not r.peaks_reset:
        lines.append("  (peak counters kept: a peak is shown only when the cell set a new high)")
    return "\n".join(lines)
