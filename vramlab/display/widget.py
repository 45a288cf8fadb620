"""The live monitor: an ipywidgets box fed by the shared sampler.

The widget's root carries the CSS class ``vramlab-monitor``. It holds three ``HTML``
children: a status line, the stacked bars (each GPU, the host against its effective
limit, swap with its page-in/out rate) and an inline-SVG sparkline of the last minutes
with cell and OOM markers. No custom JavaScript is needed.

Update rules: the sampler thread calls the monitor after each sample; the monitor
re-renders at most :data:`MAX_UPDATES_PER_S` times a second and assigns a child's
``value`` only when the text changed (so an idle machine sends nothing). Each value
stays under 8 KB. ``repr`` is short and stable; the display bundle also carries a
static ``text/html`` of the latest reading for saved notebooks and nbconvert.
"""

from __future__ import annotations

import html as _html
import threading
import time
from typing import Any, Optional

import ipywidgets as widgets

from .._sizes import format_bytes
from .html import COLOURS, html_bar, snapshot_html

__all__ = ["Monitor", "bars_html", "sparkline_svg", "MAX_UPDATES_PER_S", "WINDOW_S"]

MAX_UPDATES_PER_S = 4
WINDOW_S = 300.0  # seconds of history in the sparkline
SPARK_POINTS = 120
_WARN = 0.90
_DEV_LABELS = {"tensors": "tensors", "torch_cache": "torch cache", "context": "context & non-torch",
               "unattributed": "unattributed", "other_processes": "other processes",
               "driver_reserved": "driver reserved", "free": "free"}
_HOST_LABELS = {"process": "this process", "others": "others", "out_of_reach": "out of reach", "available": "available"}


def _legend(layers: tuple[tuple[str, int], ...], labels: dict[str, str]) -> str:
    parts = []
    for key, n in layers:
        if n == 0 and key in ("driver_reserved", "unattributed", "out_of_reach"):
            continue
        parts.append(f'<span style="white-space:nowrap"><span style="color:{COLOURS.get(key, "#888")}">■</span> '
                     f"{labels[key]} {format_bytes(n)}</span>")
    return " · ".join(parts)


def _row(title: str, sub: str, bar: str, legend: str, warn: bool) -> str:
    colour = "color:#e15759;" if warn else ""
    return (f'<div style="display:flex;align-items:flex-start;gap:8px;margin:3px 0">'
            f'<div style="min-width:118px;{colour}"><b>{_html.escape(title)}</b><br>'
            f'<span style="font-size:85%;opacity:0.85">{sub}</span></div>'
            f'<div style="flex:1;min-width:0">{bar}<div style="font-size:85%;margin-top:2px">{legend}</div></div></div>')


def bars_html(snap: Any, swap_rate: Optional[tuple[float, float]] = None) -> str:
    """The monitor's bars for one Snapshot: every device, the host, swap."""
    rows = []
    for d in snap.devices:
        if not d.layers:
            continue
        used = 1.0 - d.layer("free") / d.total if d.total else 0.0
        warn = used >= _WARN
        sub = _html.escape(d.name or "") + f"<br>{format_bytes(d.total - d.layer('free'))} / {format_bytes(d.total)}"
        sub += " ⚠" if warn else ""
        rows.append(_row(d.id, sub, html_bar(d.layers, _DEV_LABELS, width_px=300), _legend(d.layers, _DEV_LABELS), warn))
    h = snap.host
    used = 1.0 - h.layer("available") / h.limit if h.limit else 0.0
    warn = used >= _WARN
    sub = f"{format_bytes(h.limit - h.layer('available'))} / {format_bytes(h.limit)}<br>{_html.escape(h.limit_source)}"
    rows.append(_row("host RAM", sub + (" ⚠" if warn else ""), html_bar(h.layers, _HOST_LABELS, width_px=300),
                     _legend(h.layers, _HOST_LABELS), warn))
    if h.swap_total:
        sw_layers = (("process", h.swap_used or 0), ("available", h.swap_total - (h.swap_used or 0)))
        rate = ""
        if swap_rate is not None:
            rate = f"in {format_bytes(swap_rate[0])}/s · out {format_bytes(swap_rate[1])}/s"
        warn = (h.swap_used or 0) / h.swap_total >= _WARN
        rows.append(_row("swap", f"{format_bytes(h.swap_used)} / {format_bytes(h.swap_total)}",
                         html_bar(sw_layers, {"process": "used", "available": "free"}, width_px=300),
                         rate or "paging: n/a", warn))
    else:
        rows.append(_row("swap", "none", "", "no swap space configured", False))
    return f'<div style="font-size:12px;color:inherit">{"".join(rows)}</div>'


def _downsample(points: list[tuple[float, float]], n: int) -> list[tuple[float, float]]:
    if len(points) <= n:
        return points
    step = len(points) / n
    out = []
    for i in range(n):
        chunk = points[int(i * step): int((i + 1) * step)] or [points[-1]]
        out.append(max(chunk, key=lambda p: p[1]))  # keep spikes
    return out


def sparkline_svg(samples: list[Any], markers: list[Any], now: float, window_s: float = WINDOW_S,
                  width: int = 420, height: int = 56) -> str:
    """An inline SVG of the last ``window_s`` seconds: each series as a fraction of its capacity."""
    t0 = now - window_s
    recent = [s for s in samples if s.time >= t0]
    series: list[tuple[str, str, list[tuple[float, float]]]] = []
    if recent:
        series.append(("host RSS", COLOURS["process"],
                       [(s.time, s.rss / s.limit) for s in recent if s.limit]))
        series.append(("host used", COLOURS["others"],
                       [(s.time, s.host_used / s.limit) for s in recent if s.limit]))
        ids: list[str] = []
        for s in recent:
            ids.extend(d[0] for d in s.devices if d[0] not in ids)
        palette = ["#59a14f", "#edc948", "#af7aa1", "#ff9da7"]
        for k, id_ in enumerate(ids):
            pts = [(s.time, d[3] / d[4]) for s in recent for d in s.devices
                   if d[0] == id_ and d[3] is not None and d[4]]
            series.append((f"{id_} used", palette[k % len(palette)], pts))
    plot_h = height - 14

    def xy(t: float, f: float) -> str:
        x = (t - t0) / window_s * width
        y = plot_h - min(max(f, 0.0), 1.0) * (plot_h - 2) - 1
        return f"{x:.0f},{y:.0f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'style="border:1px solid rgba(127,127,127,0.5);border-radius:3px">']
    y90 = plot_h - 0.9 * (plot_h - 2) - 1
    parts.append(f'<line x1="0" y1="{y90:.0f}" x2="{width}" y2="{y90:.0f}" stroke="#e15759" stroke-opacity="0.35" '
                 'stroke-dasharray="3,3"/>')
    for m in markers:
        if m.time < t0:
            continue
        x = (m.time - t0) / window_s * width
        colour = "#e15759" if m.kind == "oom" else "rgba(127,127,127,0.6)"
        w = 2 if m.kind == "oom" else 1
        parts.append(f'<line x1="{x:.0f}" y1="0" x2="{x:.0f}" y2="{plot_h}" stroke="{colour}" stroke-width="{w}">'
                     f"<title>{_html.escape(m.label)}</title></line>")
    legend = []
    for label, colour, pts in series:
        pts = _downsample(pts, SPARK_POINTS)
        if len(pts) >= 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                         f'points="{" ".join(xy(t, f) for t, f in pts)}"/>')
        legend.append(f'<tspan fill="{colour}">■</tspan><tspan fill="currentColor"> {_html.escape(label)}  </tspan>')
    parts.append(f'<text x="2" y="{height - 3}" font-size="10" fill="currentColor">'
                 f'{"".join(legend)}<tspan fill="currentColor">· last {window_s / 60:.0f} min, % of capacity</tspan></text>')
    parts.append("</svg>")
    return "".join(parts)


class Monitor(widgets.VBox):
    """The live memory monitor (see module docs). Create with :func:`vramlab.watch`."""

    def __init__(self, sampler: Any, window_s: float = WINDOW_S) -> None:
        self._status = widgets.HTML(value="")
        self._bars = widgets.HTML(value="")
        self._spark = widgets.HTML(value="")
        super().__init__(children=[self._status, self._bars, self._spark])
        self.add_class("vramlab-monitor")
        self._sampler = sampler
        self._window_s = window_s
        self._lock = threading.Lock()
        self._last_push = 0.0
        self._last_spark_key: Any = None
        self._error_shown: Optional[str] = None
        self.updates = 0  # renders pushed (for tests and benchmarks)
        self._latest: Any = sampler.latest
        sampler.add_listener(self._on_sample)
        if sampler.latest is not None:
            self._render(sampler.latest, force=True)

    # -- sampler callback (sampler thread)
    def _on_sample(self, snap: Any, sampler: Any) -> None:
        if snap is None:
            self._set(self._status, self._status_html(stopped=True))
            return
        self._latest = snap
        now = time.monotonic()
        if now - self._last_push < 1.0 / MAX_UPDATES_PER_S - 1e-3:
            return
        self._render(snap)

    def _status_html(self, stopped: bool = False) -> str:
        s = self._sampler
        state = "stopped" if stopped or not s.running else f"sampling every {s.interval:g} s"
        if stopped and s.stopped_reason and s.stopped_reason != "stopped":
            state += f" ({_html.escape(s.stopped_reason)})"
        text = f'<span style="font-size:12px;opacity:0.85"><b>vramlab</b> · {state}</span>'
        if s.last_error:
            self._error_shown = self._error_shown or s.last_error
            text += (f'<br><span style="font-size:12px;color:#e15759">sampling error: '
                     f"{_html.escape(self._error_shown)}</span>")
        return text

    def _swap_rate(self) -> Optional[tuple[float, float]]:
        smp = self._sampler.samples
        if len(smp) < 2:
            return None
        a, b = smp[-2], smp[-1]
        dt = b.time - a.time
        if dt <= 0 or a.swap_in is None or b.swap_in is None or a.swap_out is None or b.swap_out is None:
            return None
        return (max(b.swap_in - a.swap_in, 0) / dt, max(b.swap_out - a.swap_out, 0) / dt)

    def _render(self, snap: Any, force: bool = False) -> None:
        with self._lock:
            self._last_push = time.monotonic()
            pushed = self._set(self._status, self._status_html())
            pushed |= self._set(self._bars, bars_html(snap, self._swap_rate()))
            samples = list(self._sampler.samples)
            markers = list(self._sampler.markers)
            # redraw the timeline when a reading or marker changed, or every 5 s as the window slides
            key = (_spark_key(samples[-1:]), len(markers), int(snap.time // 5))
            if force or key != self._last_spark_key:
                self._last_spark_key = key
                pushed |= self._set(self._spark, sparkline_svg(samples, markers, snap.time, self._window_s))
            if pushed:
                self.updates += 1

    @staticmethod
    def _set(w: Any, value: str) -> bool:
        if w.value != value:
            w.value = value
            return True
        return False

    # -- lifecycle
    def close(self) -> None:
        """Stop listening to the sampler and close the widget."""
        self._sampler.remove_listener(self._on_sample)
        for child in (self._status, self._bars, self._spark):
            child.close()
        super().close()

    def refresh(self) -> None:
        """Render the latest reading now (main thread)."""
        if self._sampler.latest is not None:
            self._render(self._sampler.latest, force=True)

    def __repr__(self) -> str:
        return "<vramlab monitor>"

    def _repr_mimebundle_(self, **kwargs: Any) -> Optional[dict[str, Any]]:
        data = super()._repr_mimebundle_(**kwargs) or {"text/plain": repr(self)}
        data["text/plain"] = repr(self)
        snap = self._sampler.latest
        if snap is not None:
            data["text/html"] = ('<div class="vramlab-monitor-static">' + snapshot_html(snap)
                                 + '<div style="font-size:85%;opacity:0.8">static copy of the live vramlab monitor'
                                   "</div></div>")
        return data


def _spark_key(last: list[Any]) -> Any:
    if not last:
        return None
    s = last[0]
    mib = 1 << 20
    return (s.rss // mib, s.host_used // mib, tuple((d[0], (d[3] or 0) // mib) for d in s.devices))
