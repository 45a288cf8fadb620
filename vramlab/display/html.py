"""HTML renderers: a snapshot as a table with one stacked bar per device and for the host,
a cell record as a compact table, an OOM explanation as a block.

The HTML is self-contained (inline styles, no scripts), so it survives in a saved
notebook, on nbviewer and on GitHub. Colours are mid-tone fills that read on light
and dark backgrounds; text inherits the page's colour.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
from typing import Optional

from ..i18n import tr
from .words import note_text
from ..model import CellRecord, OOMExplanation, Snapshot
from ..units import format_bytes
from .text import children_extra, device_labels, host_labels, oom_text, unreadable_text, virtual_smi_text

__all__ = ["snapshot_html", "html_bar", "record_html", "oom_html", "COLOURS"]

#: Fill colour of each layer. Red is kept for what needs attention (a bar near its limit, an error).
COLOURS: dict[str, str] = {
    "tensors": "#4e79a7",
    "torch_cache": "#76b7b2",
    "context": "#f28e2b",
    "children": "#a0cbe8",
    "unattributed": "#b07aa1",
    "other_processes": "#bab0ac",  # grey, not red: other processes and page cache are no alarm
    "driver_reserved": "#9c755f",
    "free": "rgba(127,127,127,0.18)",
    "process": "#4e79a7",
    "others": "#bab0ac",
    "out_of_reach": "#9c755f",
    "available": "rgba(127,127,127,0.18)",
}

_WARN = 0.90
_DEVICE_SKIP_ZERO = ("driver_reserved", "unattributed", "children")  # legend entries left out when empty
# JupyterLab stripes and highlights table rows (a grey band on every other row); ours are a layout
_TR = '<tr style="background:transparent">'


def html_bar(layers: tuple[tuple[str, int], ...], labels: dict[str, str], width_px: int = 320) -> str:
    """A stacked horizontal bar; each segment's title gives its label and size."""
    total = sum(n for _, n in layers)
    segs = []
    for key, n in layers:
        if n <= 0 or total <= 0:
            continue
        pct = 100.0 * n / total
        title = _html.escape(f"{labels.get(key, key)}: {format_bytes(n)} ({pct:.1f}%)")
        segs.append(f'<div title="{title}" style="width:{pct:.3f}%;background:{COLOURS.get(key, "#888")};height:100%"></div>')
    return (f'<div class="vramlab-bar" style="display:flex;width:{width_px}px;height:14px;'
            f'border:1px solid rgba(127,127,127,0.6);border-radius:3px;overflow:hidden">{"".join(segs)}</div>')


def _legend(layers: tuple[tuple[str, int], ...], labels: dict[str, str], total: Optional[int],
            skip_zero: tuple[str, ...] = ()) -> str:
    items = []
    for key, n in layers:
        if n == 0 and key in skip_zero:
            continue
        pct = f" ({100.0 * n / total:.1f}%)" if total else ""
        items.append(
            f'<span style="white-space:nowrap;margin-right:10px"><span style="display:inline-block;width:9px;'
            f'height:9px;background:{COLOURS.get(key, "#888")};border:1px solid rgba(127,127,127,0.6);'
            f'margin-right:3px"></span>{_html.escape(labels.get(key, key))} <b>{format_bytes(n)}</b>{pct}</span>'
        )
    return " ".join(items)


def _used_fraction(layers: tuple[tuple[str, int], ...], free_keys: tuple[str, ...]) -> float:
    total = sum(n for _, n in layers)
    if total <= 0:
        return 0.0
    return sum(n for k, n in layers if k not in free_keys) / total


def snapshot_html(s: Snapshot) -> str:
    """Render ``s`` as a self-contained HTML table."""
    when = _dt.datetime.fromtimestamp(s.time).strftime("%Y-%m-%d %H:%M:%S")
    td = 'style="padding:3px 8px;text-align:left;vertical-align:top"'
    rows = []
    h = s.host
    warn = _used_fraction(h.layers, ("available",)) >= _WARN
    peak = format_bytes(h.process_peak) + ("" if h.peak_exact else " " + tr("(lifetime)"))
    swap = (f"swap {format_bytes(h.swap_used)} / {format_bytes(h.swap_total)}" if h.swap_total
            else _html.escape(tr("no swap")))
    kids = f" · {_html.escape(host_labels()['children'])}: {_html.escape(children_extra(h))}" if h.children_count else ""
    source = tr("physical RAM") if h.limit_source == "physical RAM" else h.limit_source
    rows.append(
        f"{_TR}<td {td}><b>host</b><br><small>{_html.escape(tr('limit {limit}', limit=format_bytes(h.limit)))}"
        f"<br>{_html.escape(source)}</small></td>"
        f"<td {td}>{html_bar(h.layers, host_labels())}"
        f'<div style="font-size:90%;margin-top:3px">'
        f'{_legend(h.layers, host_labels(), h.limit, ("out_of_reach", "children"))}</div>'
        f'<div style="font-size:90%">{_html.escape(tr("peak RSS {peak}", peak=peak))} · {swap}{kids}'
        + (f' · <b style="color:#e15759">{_html.escape(tr("≥ 90% of the limit"))}</b>' if warn else "")
        + "</div></td></tr>"
    )
    for d in s.devices:
        title = f"<b>{_html.escape(d.id)}</b><br><small>{_html.escape(d.name or '?')}"
        if d.total is not None:
            title += "<br>" + _html.escape(tr("total {total}", total=format_bytes(d.total)))
        if d.utilization is not None:
            title += " · " + _html.escape(tr("util {pct}%", pct=d.utilization))
        title += "</small>"
        body = ""
        if d.source.startswith("nvml") and d.total is None:
            body += f'<div style="font-size:90%">{_html.escape(unreadable_text(d) or "")}</div>'
        if d.layers:
            warn = _used_fraction(d.layers, ("free",)) >= _WARN
            body += html_bar(d.layers, device_labels())
            body += (f'<div style="font-size:90%;margin-top:3px">'
                     f'{_legend(d.layers, device_labels(), d.total, _DEVICE_SKIP_ZERO)}</div>')
            if warn:
                body += ('<div style="font-size:90%"><b style="color:#e15759">'
                         f'{_html.escape(tr("≥ 90% of the device in use"))}</b></div>')
        if d.torch_peak_allocated is not None:
            extra = tr("peak allocated {allocated} · peak reserved {reserved}",
                       allocated=format_bytes(d.torch_peak_allocated), reserved=format_bytes(d.torch_peak_reserved))
            if d.torch_inactive_split:
                extra += " · " + tr("fragmented {size}", size=format_bytes(d.torch_inactive_split))
            if d.num_ooms:
                extra += " · " + tr("OOMs {n}", n=d.num_ooms)
            body += f'<div style="font-size:90%">{_html.escape(extra)}</div>'
        if d.kind == "virtual" and d.used is not None:
            body += f'<div style="font-size:90%">{_html.escape(virtual_smi_text(d))}</div>'
        rows.append(f"{_TR}<td {td}>{title}</td><td {td}>{body}</td></tr>")
    if not s.devices:
        rows.append(f"{_TR}<td {td}><b>{_html.escape(tr('accelerators'))}</b></td>"
                    f"<td {td}>{_html.escape(tr('none'))}</td></tr>")
    notes = ""
    if s.notes:
        notes = ('<div style="font-size:85%;opacity:0.8;margin-top:4px">'
                 + "<br>".join("• " + _html.escape(note_text(n)) for n in s.notes) + "</div>")
    return (f'<div class="vramlab-snapshot" style="font-family:var(--jp-ui-font-family,sans-serif);color:inherit">'
            f'<div style="font-size:90%;opacity:0.8">{_html.escape(tr("vramlab snapshot {when}", when=when))}</div>'
            f'<table style="border-collapse:collapse;color:inherit;background:transparent">{"".join(rows)}</table>'
            f"{notes}</div>")


def record_html(r: CellRecord) -> str:
    """A per-cell record as a compact HTML table."""
    h = r.host
    td = 'style="padding:1px 8px;text-align:right"'
    tl = 'style="padding:1px 8px;text-align:left"'
    head = _html.escape(tr("vramlab · cell {n} · {wall} s", n=r.execution_count if r.execution_count is not None else "-",
                           wall=f"{r.wall_s:.3f}"))
    if r.error:
        head += f' · <b style="color:#e15759">{_html.escape(tr("raised {error}", error=r.error))}</b>'
    rows = [f"<tr><th {tl}></th><th {td}>{_html.escape(tr('delta'))}</th>"
            f"<th {td}>{_html.escape(tr('peak during cell'))}</th><th {tl}></th></tr>"]
    na = _html.escape(tr("n/a"))
    peak = na if h.peak_delta is None else "+" + format_bytes(max(h.peak_delta, 0))
    rows.append(f"<tr><td {tl}>host</td><td {td}>{format_bytes(h.rss_delta, signed=True)}</td>"
                f"<td {td}>{peak}</td><td {tl}>RSS</td></tr>")
    if h.uss_delta is not None:
        rows.append(f"<tr><td></td><td {td}>{format_bytes(h.uss_delta, signed=True)}</td><td></td>"
                    f"<td {tl}>USS ({_html.escape(tr('{size} at the end', size=format_bytes(h.uss_end)))})</td></tr>")
    if h.swap_delta:
        rows.append(f"<tr><td {tl}>swap</td><td {td}>{format_bytes(h.swap_delta, signed=True)}</td><td></td><td></td></tr>")
    if h.children_count_start or h.children_count_end:
        summed = tr("RSS summed, {start} → {end} processes", start=h.children_count_start, end=h.children_count_end)
        rows.append(f"<tr><td {tl}>{_html.escape(tr('children'))}</td>"
                    f"<td {td}>{format_bytes(h.children_rss_delta, signed=True)}</td>"
                    f"<td></td><td {tl}>{_html.escape(summed)}</td></tr>")
        if h.children_uss_delta is not None:
            rows.append(f"<tr><td></td><td {td}>{format_bytes(h.children_uss_delta, signed=True)}</td><td></td>"
                        f"<td {tl}>USS</td></tr>")
    for d in r.devices:
        if d.allocated_delta is None and d.nvml_delta is None:
            continue
        pk = na if d.peak_allocated_delta is None else "+" + format_bytes(max(d.peak_allocated_delta, 0))
        rows.append(f"<tr><td {tl}>{_html.escape(d.id)}</td><td {td}>{format_bytes(d.allocated_delta, signed=True)}</td>"
                    f"<td {td}>{pk}</td><td {tl}>{_html.escape(tr('allocated'))}</td></tr>")
        if d.reserved_delta is not None:
            rows.append(f"<tr><td></td><td {td}>{format_bytes(d.reserved_delta, signed=True)}</td><td></td>"
                        f"<td {tl}>{_html.escape(tr('reserved'))}</td></tr>")
        if d.nvml_delta is not None:
            rows.append(f"<tr><td></td><td {td}>{format_bytes(d.nvml_delta, signed=True)}</td><td></td>"
                        f"<td {tl}>{_html.escape(tr('NVML (this process)'))}</td></tr>")
    return (f'<div class="vramlab-record" style="font-size:90%;color:inherit"><div>{head}</div>'
            f'<table style="border-collapse:collapse;color:inherit;background:transparent">{"".join(rows)}</table></div>')


def oom_html(e: OOMExplanation) -> str:
    """An OOM explanation as a preformatted block with a red rule."""
    return (f'<pre class="vramlab-oom" style="border-left:3px solid #e15759;padding-left:6px">'
            f"{_html.escape(oom_text(e))}</pre>")
