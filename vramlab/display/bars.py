"""The bars of the live monitor: one stacked bar per device, the host against its effective
limit and swap with its page-in/out rate, as HTML (the bars themselves are
:func:`vramlab.display.html.html_bar`, which the snapshot's HTML table draws too). Pure: no
ipywidgets, no reading of the machine; :mod:`vramlab.display.widget` puts it in a box.
"""

from __future__ import annotations

import html as _html
from typing import Any, Optional

from ..i18n import tr
from ..units import format_bytes
from .html import COLOURS, html_bar
from .text import device_labels, host_labels, unreadable_text

__all__ = ["bars_html", "unreadable_devices", "unreadable_status"]

_WARN = 0.90  # a bar at or above this fraction of its capacity is marked


def _swatch(colour: str) -> str:
    # a bordered square, so that the pale "free" fill stays visible on dark backgrounds
    return (f'<span style="display:inline-block;width:9px;height:9px;background:{colour};'
            'border:1px solid rgba(127,127,127,0.6);margin-right:4px;vertical-align:-1px"></span>')


def _nowrap(text: str) -> str:
    # "1014.58 MiB / 23.54 GiB" on one line: a figure and its unit never part
    return f'<span style="white-space:nowrap">{text}</span>'


def _legend(layers: tuple[tuple[str, int], ...], labels: dict[str, str]) -> str:
    parts = []
    for key, n in layers:
        if n == 0 and key in ("driver_reserved", "unattributed", "out_of_reach", "children"):
            continue
        parts.append(f'<span style="white-space:nowrap;margin-right:12px">{_swatch(COLOURS.get(key, "#888"))}'
                     f"{labels[key]} <b>{format_bytes(n)}</b></span>")
    return "".join(parts)


def _row(title: str, sub: str, bar: str, legend: str, warn: bool) -> str:
    colour = "color:#e15759;" if warn else ""
    sub_html = f'<div style="font-size:11px;opacity:0.8">{sub}</div>' if sub else ""
    bar_html = f'<div style="margin-top:2px">{bar}</div>' if bar else ""
    legend_top = "margin-top:3px" if bar else "margin-top:1px"  # a row without a bar: level with its title
    return (f'<div style="display:flex;align-items:flex-start;gap:10px;margin:0 0 6px 0">'
            f'<div style="flex:0 0 150px;{colour}"><b>{_html.escape(title)}</b>{sub_html}</div>'
            f'<div style="flex:1 1 auto;min-width:0">{bar_html}'
            f'<div style="font-size:11.5px;{legend_top}">{legend}</div></div></div>')


def unreadable_devices(snap: Any) -> list[Any]:
    """The devices of ``snap`` that have no figures to draw (no layers): a lost GPU, say."""
    return [d for d in snap.devices if not d.layers]


def bars_html(snap: Any, swap_rate: Optional[tuple[float, float]] = None) -> str:
    """The monitor's bars for one Snapshot: every device, the host, swap.

    A device without figures (a GPU that NVML cannot read) keeps its row, with the reason
    in words (``NVML cannot read this device: the GPU is lost ...``) in place of a bar.
    ``swap_rate`` is (paged in, paged out) in bytes per second.
    """
    rows = []
    for d in snap.devices:
        if not d.layers:
            why = unreadable_text(d) or tr("no memory figures: see the notes")
            rows.append(_row(d.id, _html.escape(d.name or ""), "",
                             f'<span style="color:#e15759">{_html.escape(why)}</span>', True))
            continue
        used = 1.0 - d.layer("free") / d.total if d.total else 0.0
        warn = used >= _WARN
        sub = _html.escape(d.name or "") + "<br>" + _nowrap(f"{format_bytes(d.total - d.layer('free'))} / "
                                                           f"{format_bytes(d.total)}")
        sub += " ⚠" if warn else ""
        rows.append(_row(d.id, sub, html_bar(d.layers, device_labels(), width_px=300), _legend(d.layers, device_labels()), warn))
    h = snap.host
    used = 1.0 - h.layer("available") / h.limit if h.limit else 0.0
    warn = used >= _WARN
    source = tr("physical RAM") if h.limit_source == "physical RAM" else h.limit_source
    sub = (_nowrap(f"{format_bytes(h.limit - h.layer('available'))} / {format_bytes(h.limit)}")
           + f"<br>{_html.escape(source)}")
    if h.children_count:
        n = h.children_count
        kids = tr("{n} child process", n=n) if n == 1 else tr("{n} child processes", n=n)
        sub += f"<br>{_html.escape(kids)}"
    rows.append(_row(tr("host RAM"), sub + (" ⚠" if warn else ""), html_bar(h.layers, host_labels(), width_px=300),
                     _legend(h.layers, host_labels()), warn))
    if h.swap_total:
        sw_layers = (("process", h.swap_used or 0), ("available", h.swap_total - (h.swap_used or 0)))
        rate = ""
        if swap_rate is not None:
            rate = _html.escape(tr("paging in {swap_in}/s · out {swap_out}/s", swap_in=format_bytes(swap_rate[0]),
                                   swap_out=format_bytes(swap_rate[1])))
        warn = (h.swap_used or 0) / h.swap_total >= _WARN
        rows.append(_row("swap", _nowrap(f"{format_bytes(h.swap_used)} / {format_bytes(h.swap_total)}"),
                         html_bar(sw_layers, {"process": tr("used"), "available": tr("free")}, width_px=300),
                         rate or _html.escape(tr("paging: n/a")), warn))
    else:
        rows.append(_row("swap", "", "", _html.escape(tr("none configured")), False))
    # line-height: a widget's HTML view sets a 28 px line height, which would space the lines apart
    return f'<div style="font-size:12.5px;line-height:1.35;color:inherit;margin-top:6px">{"".join(rows)}</div>'


def unreadable_status(snap: Any) -> str:
    """A warning for the status line naming the devices without figures ("" when none)."""
    if snap is None:
        return ""
    bad = unreadable_devices(snap)
    if not bad:
        return ""
    names = ", ".join(d.id for d in bad)
    return (f' <span style="font-size:12px;color:#e15759">· '
            f'{_html.escape(tr("{names}: cannot be read, see below", names=names))}</span>')
