"""Plain-text renderers: snapshots, cell records, the history, OOM explanations.

Each takes a :mod:`vramlab.model` object and returns a string; none reads the machine.
Sizes are shown in IEC units.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Optional

from ..i18n import tr
from .words import advice_text, note_text, problem_text
from ..model import (DEVICE_LAYERS, HOST_LAYERS, CellRecord, DeviceSnapshot, FreedReport, History, HostDelta,
                     HostSnapshot, OOMExplanation, Snapshot)
from ..units import IntervalError, format_bytes

__all__ = ["host_labels", "device_labels", "snapshot_text", "text_bar", "children_extra", "unreadable_text", "record_text", "record_line", "history_text", "oom_text",
           "freed_text", "virtual_smi_text"]

#: One character per layer in text bars.
BAR_CHARS: dict[str, str] = {
    "tensors": "#",
    "torch_cache": "=",
    "context": "+",
    "children": "*",
    "unattributed": "?",
    "other_processes": "%",
    "driver_reserved": "!",
    "free": ".",
    "process": "#",
    "others": "%",
    "out_of_reach": "x",
    "available": ".",
}


def host_labels() -> dict[str, str]:
    """The host's layer labels, in the current language (:func:`vramlab.i18n.tr`)."""
    return {k: tr(v) for k, v in HOST_LAYERS.items()}


def device_labels() -> dict[str, str]:
    """A device's layer labels, in the current language."""
    return {k: tr(v) for k, v in DEVICE_LAYERS.items()}


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


def children_extra(h: HostSnapshot) -> str:
    """What the host's children layer holds, in words: how many, and which figure it is
    (their USS when read, else their RSS summed, which counts shared pages in each)."""
    n = h.children_count
    who = tr("{n} process", n=n) if n == 1 else tr("{n} processes", n=n)
    if h.children_uss is not None:
        out = tr("{who}, USS (RSS summed {rss}", who=who, rss=format_bytes(h.children_rss))
        if h.children_pss is not None:
            out += f", PSS {format_bytes(h.children_pss)}"
        return out + ")"
    return tr("{who}, RSS summed: counts shared pages in each (--uss for USS)", who=who)


_UNREADABLE = "NVML cannot read this device"
tr("NVML cannot read this device")  # (for the catalog's extraction: _UNREADABLE goes through tr)


def unreadable_text(d: DeviceSnapshot) -> Optional[str]:
    """Why a device has no figures, in words, or ``None`` when it has them.

    For a GPU that NVML lists but cannot read (a lost GPU): ``"NVML cannot read this
    device: <why>"``, from the device's own :attr:`~vramlab.model.DeviceSnapshot.unreadable`
    (``see the notes`` when it has none). For another device without a total: ``"no memory
    figures: see the notes"``.
    """
    if d.total is not None:
        return None
    if not d.source.startswith("nvml"):
        return tr("no memory figures: see the notes")
    why = problem_text(d.unreadable) if d.unreadable is not None else tr("see the notes")
    return f"{tr(_UNREADABLE)}: {why}"


def virtual_smi_text(d: DeviceSnapshot) -> str:
    """What ``nvidia-smi`` would show used on the card a virtual device stands for."""
    return tr("nvidia-smi on a real card would show {used} used: the modelled context plus what "
              "PyTorch reserved (tensors and its cache)", used=format_bytes(d.used or 0))


def snapshot_text(s: Snapshot, width: int = 40) -> str:
    """Render ``s`` as an aligned plain-text table (sizes in IEC units)."""
    when = _dt.datetime.fromtimestamp(s.time).strftime("%Y-%m-%d %H:%M:%S")
    lines = [tr("vramlab snapshot {when}", when=when), ""]
    h = s.host
    source = tr("physical RAM") if h.limit_source == "physical RAM" else h.limit_source
    lines.append(tr("host  limit {limit} ({source}), RAM {total}", limit=format_bytes(h.limit), source=source,
                    total=format_bytes(h.total)))
    lines.append("  " + text_bar(h.layers, width))
    for key, n in h.layers:
        if (key == "out_of_reach" and n == 0) or (key == "children" and n == 0 and not h.children_count):
            continue
        label = tr(HOST_LAYERS[key])
        extra = ""
        if key == "process":
            extra = "  " + tr("peak {peak}", peak=format_bytes(h.process_peak))
            extra += "" if h.peak_exact else " " + tr("(lifetime, not resettable)")
            if h.process_uss is not None:
                extra += f"  USS {format_bytes(h.process_uss)}"
        elif key == "children":
            extra = "  " + children_extra(h)
        lines.append(f"  {BAR_CHARS[key]} {label:<20}{format_bytes(n):>12} {_pct(n, h.limit)}{extra}")
    if h.swap_total:
        lines.append("  " + tr("swap {used} of {total} used, paged in {swap_in}, out {swap_out} since boot",
                                used=format_bytes(h.swap_used), total=format_bytes(h.swap_total),
                                swap_in=format_bytes(h.swap_in), swap_out=format_bytes(h.swap_out)))
    else:
        lines.append("  " + tr("swap none configured"))
    for d in s.devices:
        lines.append("")
        head = f"{d.id}  {d.name or '?'}"
        if d.total is not None:
            head += "  " + tr("total {total}", total=format_bytes(d.total))
        if d.utilization is not None:
            head += "  " + tr("util {pct}%", pct=d.utilization)
        lines.append(head)
        if d.layers:
            lines.append("  " + text_bar(d.layers, width))
            for key, n in d.layers:
                if n == 0 and key in ("driver_reserved", "unattributed", "children"):
                    continue
                label = tr(DEVICE_LAYERS[key])
                lines.append(f"  {BAR_CHARS[key]} {label:<20}{format_bytes(n):>12} {_pct(n, d.total)}")
        if d.torch_peak_allocated is not None:
            extra = "  " + tr("peak allocated {allocated}, peak reserved {reserved}",
                              allocated=format_bytes(d.torch_peak_allocated),
                              reserved=format_bytes(d.torch_peak_reserved))
            if d.torch_inactive_split:
                extra += ", " + tr("fragmented {size}", size=format_bytes(d.torch_inactive_split))
            if d.num_ooms:
                extra += ", " + tr("OOMs {n}", n=d.num_ooms)
            lines.append(extra)
        if d.kind == "virtual" and d.used is not None:
            lines.append("  " + virtual_smi_text(d))
        if d.source.startswith("nvml") and d.total is None:
            lines.append(f"  ({unreadable_text(d)})")
        elif d.source == "nvml" and d.id.startswith("cuda"):
            lines.append("  " + tr("(torch has not used this device: no allocator figures)"))
    if not s.devices:
        lines.append("")
        lines.append(tr("no accelerators"))
    if s.notes:
        lines.append("")
        lines.append(tr("notes:"))
        lines.extend(f"  - {note_text(n)}" for n in s.notes)
    return "\n".join(lines)


def record_text(r: CellRecord) -> str:
    """A per-cell record as a small aligned table."""
    fb = format_bytes
    h = r.host
    head = tr("vramlab cell {n} · {wall} s", n=r.execution_count if r.execution_count is not None else "-",
              wall=f"{r.wall_s:.3f}")
    if r.error:
        head += " · " + tr("raised {error}", error=r.error)
    na = tr("n/a")
    lines = [head, f"  {'':<10}{tr('delta'):>12}{tr('peak during cell'):>20}"]
    peak = na if h.peak_delta is None else "+" + fb(max(h.peak_delta, 0))
    lines.append(f"  {tr('host RSS'):<10}{fb(h.rss_delta, signed=True):>12}{peak:>20}")
    if h.uss_delta is not None:
        lines.append(f"  {tr('host USS'):<10}{fb(h.uss_delta, signed=True):>12}{'':>20}  "
                     + tr("{size} at the end", size=fb(h.uss_end)))
    if h.swap_delta:
        lines.append(f"  {'swap':<10}{fb(h.swap_delta, signed=True):>12}")
    if _had_children(h):
        lines.append(f"  {tr('children'):<10}{fb(h.children_rss_delta, signed=True):>12}{'':>20}  "
                     + tr("RSS summed, {start} -> {end} processes", start=h.children_count_start,
                          end=h.children_count_end))
        if h.children_uss_delta is not None:
            lines.append(f"  {'':<10}{fb(h.children_uss_delta, signed=True):>12}{'':>20}  USS")
    for d in r.devices:
        if d.allocated_delta is None and d.nvml_delta is None:
            continue
        pk = na if d.peak_allocated_delta is None else "+" + fb(max(d.peak_allocated_delta, 0))
        lines.append(f"  {d.id:<10}{fb(d.allocated_delta, signed=True):>12}{pk:>20}  " + tr("allocated"))
        if d.reserved_delta is not None:
            lines.append(f"  {'':<10}{fb(d.reserved_delta, signed=True):>12}{'':>20}  " + tr("reserved"))
        if d.nvml_delta is not None:
            lines.append(f"  {'':<10}{fb(d.nvml_delta, signed=True):>12}{'':>20}  " + tr("NVML (this process)"))
    if not r.peaks_reset:
        lines.append("  " + tr("(peak counters kept: a peak is shown only when the cell set a new high)"))
    return "\n".join(lines)


def _had_children(h: HostDelta) -> bool:
    return bool(h.children_count_start or h.children_count_end)


def record_line(r: CellRecord) -> str:
    """A per-cell record in one compact line, as ``%vram auto on`` prints it."""
    h = r.host
    parts = [tr("[vramlab] cell {n}", n=r.execution_count if r.execution_count is not None else "-"),
             f"{r.wall_s:.3f} s"]
    host = f"RSS {format_bytes(h.rss_delta, signed=True)}"
    if h.peak_delta is not None:
        host += " (" + tr("peak +{size}", size=format_bytes(max(h.peak_delta, 0))) + ")"
    if h.uss_delta is not None:
        host += f", USS {format_bytes(h.uss_delta, signed=True)}"
    parts.append(host)
    if _had_children(h):
        kids = tr("children {size} RSS", size=format_bytes(h.children_rss_delta, signed=True))
        if h.children_uss_delta is not None:
            kids += f", USS {format_bytes(h.children_uss_delta, signed=True)}"
        parts.append(kids + " (" + tr("{n} now", n=h.children_count_end) + ")")
    for d in r.devices:
        if d.allocated_delta is None and d.nvml_delta is None:
            continue
        s = f"{d.id} " + tr("alloc") + f" {format_bytes(d.allocated_delta, signed=True)}"
        if d.peak_allocated_delta is not None:
            s += " (" + tr("peak +{size}", size=format_bytes(max(d.peak_allocated_delta, 0))) + ")"
        if d.reserved_delta:
            s += " " + tr("reserved") + f" {format_bytes(d.reserved_delta, signed=True)}"
        if d.nvml_delta:
            s += f" nvml {format_bytes(d.nvml_delta, signed=True)}"
        parts.append(s)
    if r.error:
        parts.append(tr("raised {error}", error=r.error))
    return " · ".join(parts)


def history_text(h: History, last: int = 20) -> str:
    """A table of the last ``last`` cells."""
    fb = format_bytes
    cells = h.cells[-last:]
    if not cells:
        return tr("no cell records yet: use %%vram on a cell, or %vram auto on")
    ids: list[str] = []
    for r in cells:
        ids.extend(d.id for d in r.devices if d.allocated_delta is not None and d.id not in ids)
    na = tr("n/a")
    head = f"{tr('cell'):>5} {tr('wall s'):>8} {tr('RSS delta'):>12} {tr('RSS peak'):>12}"
    for i in ids:
        head += f" {i + ' ' + tr('alloc'):>16} {i + ' ' + tr('peak'):>16}"
    lines = [head]
    for r in cells:
        line = (f"{r.execution_count if r.execution_count is not None else '-':>5} {r.wall_s:>8.3f} "
                f"{fb(r.host.rss_delta, signed=True):>12} "
                f"{('+' + fb(max(r.host.peak_delta, 0))) if r.host.peak_delta is not None else na:>12}")
        devs = {d.id: d for d in r.devices}
        for i in ids:
            d = devs.get(i)
            a = fb(d.allocated_delta, signed=True) if d and d.allocated_delta is not None else na
            pk = ("+" + fb(max(d.peak_allocated_delta, 0))) if d and d.peak_allocated_delta is not None else na
            line += f" {a:>16} {pk:>16}"
        if r.error:
            line += f"  {r.error}"
        lines.append(line)
    return "\n".join(lines)


def oom_text(e: OOMExplanation) -> str:
    """An OOM explanation as plain text: the figures, the largest consumers, what to try."""
    lines = [tr("[vramlab] out of memory")]
    labels = [tr("requested"), tr("free on the device"), tr("cached, unallocated"), tr("short by")]
    w = max(21, *(len(x) + 1 for x in labels))
    if e.requested is not None:
        lines.append(f"  {labels[0]:<{w}}{format_bytes(e.requested)}")
    if e.free is not None:
        lines.append(f"  {labels[1]:<{w}}{format_bytes(e.free)}"
                     + (tr(" of {total}", total=format_bytes(e.total)) if e.total else ""))
    if e.reserved_unallocated is not None:
        lines.append(f"  {labels[2]:<{w}}{format_bytes(e.reserved_unallocated)} "
                     + tr("(reserved by torch in split blocks, none large enough: not usable for this request)"))
    if e.shortfall is not None:
        lines.append(f"  {labels[3]:<{w}}{format_bytes(e.shortfall)}")
    if e.fragmentation_is_cause:
        lines.append("  " + tr("fragmentation is the cause: free memory and the cache together would hold the request"))
    if e.consumers:
        lines.append("  " + tr("largest live consumers:"))
        lines.extend(_consumer_lines(e.consumers))
    if e.suggestions:
        lines.append("  " + tr("what to try, most effective first:"))
        lines.extend(f"    {i}. {advice_text(s)}" for i, s in enumerate(e.suggestions, 1))
    lines.append("  " + tr("then run %vram free to release what the traceback keeps alive"))
    return "\n".join(lines)


def _kind(kind: str) -> str:
    """A holder's kind (:mod:`vramlab.runtime.holders`), in the display's language."""
    return {"tensor": tr("tensor"), "tensors": tr("tensors"), "module": tr("module"),
            "optimizer state": tr("optimizer state"), "autograd graph": tr("autograd graph"),
            "output cache": tr("output cache")}.get(kind, kind)


def _consumer_lines(consumers: Any, indent: str = "    ") -> list[str]:
    return [f"{indent}{c.name:<16}{_kind(c.kind):<18}{format_bytes(c.nbytes):>12}  {c.devices}" for c in consumers]


def _freed(n: int) -> str:
    """A freed byte count in words: never a negative size. Memory that rose meanwhile (the host's
    allocator keeps what Python frees, a thread allocated) is said as such."""
    if n >= 0:
        return format_bytes(n)
    return tr("nothing (it rose by {size} meanwhile)", size=format_bytes(-n))


def freed_text(f: FreedReport) -> str:
    """What ``%vram free`` returned: one line per layer, what it released and what still holds tensors."""
    lines = [tr("[vramlab] freed: host RSS {size}", size=_freed(f.host))]
    for d in f.devices:
        lines.append(f"  {d.id}: " + tr("allocated {allocated}, reserved {reserved}", allocated=_freed(d.allocated),
                                        reserved=_freed(d.reserved)))
    if f.cleared:
        lines.append("  " + tr("dropped: {what}", what=", ".join(f.cleared)))
    if f.released:
        lines.append("  " + tr("released (values kept: a graph is detached from its tensor, a cached output "
                               "removed from Out):"))
        lines.extend(_consumer_lines(f.released))
    if f.kept:
        lines.append("  " + tr("still held, and left alone (del the name, or opt.state.clear(), frees it):"))
        lines.extend(_consumer_lines(f.kept[:8]))
        if len(f.kept) > 8:
            lines.append("    " + tr("and {n} more", n=len(f.kept) - 8))
    return "\n".join(lines)


def trial_line(n: int, batch: int, fits: bool, peak: Optional[int], lo: int, hi: Optional[int]) -> str:
    """One line of a batch search's progress: trial ``n`` and what is known of the largest batch
    (``lo``: the largest that fitted, ``hi``: the smallest that did not)."""
    outcome = tr("fits") if fits else "OOM"
    known = tr("the largest is in [{lo}, {hi})", lo=lo, hi=hi) if hi is not None else \
        tr("the largest is at least {lo}", lo=lo)
    peak_text = tr("n/a") if peak is None else format_bytes(peak)
    return tr("[vramlab] trial {n}: batch {batch} {outcome} (peak {peak}); {known}", n=n, batch=batch,
              outcome=outcome, peak=peak_text, known=known)


def search_done_line(best: int, trials: int) -> str:
    """The last line of a batch search's progress."""
    return tr("[vramlab] max batch size {n} after {trials} trials", n=best, trials=trials)


def interval_problem(e: IntervalError, option: str) -> str:
    """Why ``option`` (``"--interval"``, ``"--watch"``) cannot take the value of ``e``, in the
    user's language (the one wording of :class:`vramlab.units.IntervalError`)."""
    got = repr(e.got)
    if e.reason == "not_a_number":
        return tr("{option} takes a number of seconds, got {got}", option=option, got=got)
    if e.reason == "too_short":
        return tr("{option} takes at least {least} seconds, got {got}", option=option, least=f"{e.minimum:g}", got=got)
    return tr("{option} takes at most {most} seconds (the longest wait a thread can make), got {got}", option=option,
              most=f"{e.maximum:.0f}", got=got)
