"""The live monitor: an ipywidgets box fed by the shared sampler.

The widget's root carries the CSS class ``vramlab-monitor``. It holds three ``HTML``
children: a status line, the stacked bars (each GPU, the host against its effective
limit, swap with its page-in/out rate) and an inline-SVG sparkline of the last minutes
with cell and OOM markers. No custom JavaScript is needed.

Update rules: the sampler thread calls the monitor after each sample; the monitor
re-renders at most :data:`MAX_UPDATES_PER_S` times a second and assigns a child's
``value`` only when the text changed (so an idle machine sends nothing). Each value
stays under 8 KB. ``repr`` is short and stable; the display bundle also carries a
static ``text/html`` copy of the latest reading (``vramlab-monitor-static``).

Saved notebooks: a viewer without a live kernel cannot draw the widget. nbconvert shows
the static copy when the notebook holds no widget state (as JupyterLab saves it by
default), but picks the widget whenever the state was saved (as nbclient and
``nbconvert --execute`` do), and that needs the widget scripts from a CDN: offline, on
GitHub and anywhere scripts do not run, the output is blank. So, in a kernel, the monitor
is displayed with a display id and, when the sampler stops, every output of it is
replaced (``update_display``) by the static copy of its last reading, which then is what
the notebook saves; when the sampler starts again the live widget comes back.
"""

from __future__ import annotations

import collections
import html as _html
import itertools
import threading
import time
import uuid
from operator import itemgetter
from typing import Any, Deque, Iterable, Optional

import ipywidgets as widgets

from ..facts import StopReason
from ..i18n import tr
from ..units import format_bytes
from .html import COLOURS, html_bar
from .words import marker_text, stop_text
from .text import device_labels, host_labels, snapshot_text, unreadable_text

__all__ = ["Monitor", "SampleWindow", "bars_html", "sparkline_svg", "MAX_UPDATES_PER_S", "WINDOW_S", "SPARK_POINTS"]

MAX_UPDATES_PER_S = 4
WINDOW_S = 300.0  # seconds of history in the sparkline
#: the sparkline's keys for the host's lines (a device's line is keyed by its id)
HOST_RSS, HOST_USED = "host:rss", "host:used"
SPARK_POINTS = 120  # at most this many points per line of the sparkline (each the highest of its stretch)
MIN_SPAN_S = 30.0  # the sparkline's shortest time axis, while there is less history than WINDOW_S
_Y_TOPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # the sparkline's y axis ends at the first that fits
_WARN = 0.90


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


_SECOND = itemgetter(1)


def _downsample(points: list[tuple[float, float]], n: int) -> list[tuple[float, float]]:
    """At most ``n`` of ``points``: the highest of each of ``n`` equal stretches (spikes stay)."""
    if len(points) <= n:
        return points
    step = len(points) / n
    out = []
    for i in range(n):
        chunk = points[int(i * step): int((i + 1) * step)] or [points[-1]]
        out.append(max(chunk, key=_SECOND))  # keep spikes
    return out


class SampleWindow:
    """The samples of the last ``window_s`` seconds, and the sparkline's series, kept as they come.

    :meth:`update` takes the samples the ring gained since the last call and drops from the
    left those older than ``now - window_s``, so a redraw costs what changed, not the whole
    ring. Its content is always what ``[s for s in ring if s.time >= now - window_s]``
    gives: when the clock went back (a sample older than the one before it, or an earlier
    ``now``), or when the samples seen last left the ring, it is rebuilt that way.

    ``series`` maps each line's key to its ``(time, fraction of capacity)`` points, in
    order: :data:`HOST_RSS` and :data:`HOST_USED` (of the host's effective limit), then each
    device's id (its used memory, of its total), in the order the devices first appear in the
    window.
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.samples: Deque[Any] = collections.deque()
        self.series: dict[str, Deque[tuple[float, float]]] = {}
        self._last: Any = None  # the newest sample taken in
        self._now: Optional[float] = None
        self._ordered = True

    def update(self, ring: Any, now: float) -> None:
        """Take in the samples ``ring`` (oldest first) gained since the last call; the window
        ends at ``now`` (seconds since the epoch)."""
        new = None
        if self._ordered and self._now is not None and now >= self._now:
            new = _newer_than(ring, self._last)
        if new is None:
            self._rebuild(ring, now)
            return
        self._now = now
        for s in new:
            if self.samples and s.time < self.samples[-1].time:  # the clock went back
                self._rebuild(ring, now)
                return
            self._add(s)
        self._drop_older_than(now - self.window_s)

    def _rebuild(self, ring: Any, now: float) -> None:
        self.samples.clear()
        self.series.clear()
        self._last = None
        self._now = now
        cutoff = now - self.window_s
        recent = [s for s in _copy(ring) if s.time >= cutoff]
        self._ordered = all(a.time <= b.time for a, b in zip(recent, recent[1:]))
        if not recent:
            return
        self.samples.extend(recent)
        self._last = recent[-1]
        host = [s for s in recent if s.limit]
        if host:
            self.series[HOST_RSS] = collections.deque([(s.time, s.rss / s.limit) for s in host])
            self.series[HOST_USED] = collections.deque([(s.time, s.host_used / s.limit) for s in host])
        for s in recent:
            for d in s.devices:
                if d.used is not None and d.total:
                    self._point(d.id, s.time, d.used / d.total)

    def _add(self, s: Any) -> None:
        self.samples.append(s)
        self._last = s
        if s.limit:
            self._point(HOST_RSS, s.time, s.rss / s.limit)
            self._point(HOST_USED, s.time, s.host_used / s.limit)
        for d in s.devices:
            if d.used is not None and d.total:
                self._point(d.id, s.time, d.used / d.total)

    def _point(self, label: str, t: float, f: float) -> None:
        pts = self.series.get(label)
        if pts is None:
            pts = self.series[label] = collections.deque()
        pts.append((t, f))

    def _drop_older_than(self, cutoff: float) -> None:
        samples = self.samples
        while samples and samples[0].time < cutoff:
            samples.popleft()
        for label in list(self.series):
            pts = self.series[label]
            while pts and pts[0][0] < cutoff:
                pts.popleft()
            if not pts:
                del self.series[label]

    @classmethod
    def of(cls, samples: Iterable[Any], now: float, window_s: float = WINDOW_S) -> "SampleWindow":
        """The window of ``samples`` (oldest first) ending at ``now``."""
        w = cls(window_s)
        w._rebuild(list(samples), now)
        return w


def _copy(ring: Any) -> list[Any]:
    """A list of ``ring``'s items; retried if another thread changed it meanwhile."""
    while True:
        try:
            return list(ring)
        except RuntimeError:  # pragma: no cover - "deque mutated during iteration"
            continue


def _newer_than(ring: Any, last: Any) -> Optional[list[Any]]:
    """The items of ``ring`` after ``last`` (oldest first), found by identity from the right;
    ``None`` when ``last`` is not in it (never set, or gone from the ring)."""
    if last is None:
        return None
    k = 16
    while True:
        try:
            tail = list(itertools.islice(reversed(ring), k))
        except RuntimeError:  # pragma: no cover - appended to meanwhile: look again
            continue
        for i, s in enumerate(tail):
            if s is last:
                return tail[:i][::-1]
        if len(tail) < k:
            return None
        k *= 4


def _span_label(span: float) -> str:
    return f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min"


_PALETTE = ("#59a14f", "#edc948", "#af7aa1", "#ff9da7")


def _series_label(key: str) -> str:
    """A sparkline series' label (:attr:`SampleWindow.series`' key) in the current language."""
    if key == HOST_RSS:
        return tr("host RSS")
    if key == HOST_USED:
        return tr("host used")
    return tr("{id} used", id=key)


def sparkline_svg(samples: Any, markers: list[Any], now: float, window_s: float = WINDOW_S,
                  width: int = 420, height: int = 58) -> str:
    """An inline SVG of the last ``window_s`` seconds: each series as a fraction of its capacity.

    ``samples`` is a list of samples (oldest first), or a :class:`SampleWindow` already
    brought up to ``now`` (what the monitor passes: nothing is filtered again). Each line has
    at most :data:`SPARK_POINTS` points, the highest of each stretch, so spikes stay.

    With less history than ``window_s`` the time axis spans what there is (at least
    :data:`MIN_SPAN_S`), so a new monitor does not squeeze its line into the right edge. The
    y axis ends at the first of 1, 2, 5, 10, 20, 50, 100 % that holds every point, so a small
    process on a large machine still shows its rises; the label says where it ends.
    """
    win = samples if isinstance(samples, SampleWindow) else SampleWindow.of(samples, now, window_s)
    span = window_s
    if win.samples:
        span = min(window_s, max(now - win.samples[0].time, MIN_SPAN_S))
    t0 = now - span
    series: list[tuple[str, str, list[tuple[float, float]]]] = []
    if win.samples:
        series.append((HOST_RSS, COLOURS["process"], _downsample(list(win.series.get(HOST_RSS, ())),
                                                                   SPARK_POINTS)))
        series.append((HOST_USED, COLOURS["others"], _downsample(list(win.series.get(HOST_USED, ())),
                                                                   SPARK_POINTS)))
        k = 0
        for label, kept in win.series.items():
            if label in (HOST_RSS, HOST_USED):
                continue
            series.append((label, _PALETTE[k % len(_PALETTE)], _downsample(list(kept), SPARK_POINTS)))
            k += 1
    peak = max((f for _, _, pts in series for _, f in pts), default=0.0)
    top = next((t for t in _Y_TOPS if peak <= t), 1.0)
    plot_h = height - 16

    def y_of(f: float) -> float:
        return plot_h - min(max(f / top, 0.0), 1.0) * (plot_h - 3) - 1.5

    def xy(t: float, f: float) -> str:
        x = (t - t0) / span * width
        return f"{x:.1f},{y_of(f):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'style="display:block;border:1px solid rgba(127,127,127,0.5);border-radius:3px;margin-top:2px">']
    if top >= 1.0:  # the 90 % line only where the axis reaches it
        y90 = y_of(0.9)
        parts.append(f'<line x1="0" y1="{y90:.0f}" x2="{width}" y2="{y90:.0f}" stroke="#e15759" '
                     'stroke-opacity="0.45" stroke-dasharray="3,3"/>')
    parts.append(f'<line x1="0" y1="{plot_h + 0.5}" x2="{width}" y2="{plot_h + 0.5}" '
                 'stroke="rgba(127,127,127,0.35)"/>')
    for m in markers:
        if m.time < t0:
            continue
        x = (m.time - t0) / span * width
        colour = "#e15759" if m.kind == "oom" else "rgba(127,127,127,0.6)"
        w = 2 if m.kind == "oom" else 1
        parts.append(f'<line x1="{x:.0f}" y1="0" x2="{x:.0f}" y2="{plot_h}" stroke="{colour}" stroke-width="{w}">'
                     f"<title>{_html.escape(marker_text(m.kind, m.execution_count))}</title></line>")
    legend = []
    for label, colour, pts in series:
        if len(pts) >= 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                         f'points="{" ".join(xy(t, f) for t, f in pts)}"/>')
        legend.append(f'<tspan fill="{colour}">■</tspan><tspan fill="currentColor"> '
                      f'{_html.escape(_series_label(label))}  </tspan>')
    caption = tr("· last {span}, 0–{top} of capacity", span=_span_label(span), top=f"{top:.0%}")
    parts.append(f'<text x="4" y="{height - 4}" font-size="10.5" fill="currentColor">'
                 f'{"".join(legend)}<tspan fill="currentColor" fill-opacity="0.8">{_html.escape(caption)}</tspan></text>')
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
        self._window = SampleWindow(window_s)  # the sparkline's samples, kept as they come
        self._lock = threading.RLock()
        self._last_push = 0.0
        self._last_spark_key: Any = None
        self._error_shown: Optional[str] = None
        self._display_id: Optional[str] = None  # set when displayed in a kernel (see module docs)
        self._shown = "live"  # what the outputs of this monitor show: "live" or "static"
        self.updates = 0  # renders pushed (for tests and benchmarks)
        self._closed = False
        self._latest: Any = sampler.latest
        sampler.add_listener(self._on_sample)
        if sampler.latest is not None:
            self._render(sampler.latest, force=True)

    # -- sampler callback (sampler thread)
    def _on_sample(self, snap: Any, sampler: Any) -> None:
        if snap is None:
            self._set(self._status, self._status_html(stopped=True))
            self._switch_view("static")
            return
        self._latest = snap
        if self._shown != "live":
            self._switch_view("live")
        now = time.monotonic()
        if now - self._last_push < 1.0 / MAX_UPDATES_PER_S - 1e-3:
            return
        self._render(snap)

    def _status_html(self, stopped: bool = False) -> str:
        s = self._sampler
        state = _html.escape(tr("stopped") if stopped or not s.running
                             else tr("sampling every {interval} s", interval=f"{s.interval:g}"))
        if stopped and s.stopped_reason is not None and s.stopped_reason.reason is not StopReason.STOPPED:
            state += f" ({_html.escape(stop_text(s.stopped_reason))})"
        text = f'<span style="font-size:12px;opacity:0.85"><b>vramlab</b> · {state}</span>'
        text += _unreadable_status(self._snap())
        if s.last_error:
            self._error_shown = self._error_shown or s.last_error
            text += (f'<br><span style="font-size:12px;color:#e15759">'
                     f"{_html.escape(tr('sampling error: {error}', error=self._error_shown))}</span>")
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
            self._window.update(self._sampler.samples, snap.time)
            win = self._window.samples
            markers = _copy(self._sampler.markers)
            # redraw the timeline when a reading or marker changed, or every 5 s as the window slides
            key = (_spark_key(win[-1] if win else None), len(markers), int(snap.time // 5))
            if force or key != self._last_spark_key:
                self._last_spark_key = key
                pushed |= self._set(self._spark, sparkline_svg(self._window, markers, snap.time, self._window_s))
            if pushed:
                self.updates += 1

    @staticmethod
    def _set(w: Any, value: str) -> bool:
        if w.value != value:
            w.value = value
            return True
        return False

    # -- lifecycle
    @property
    def sampler(self) -> Any:
        """The sampler this monitor listens to."""
        return self._sampler

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the widget's comm is gone)."""
        return self._closed

    def close(self) -> None:
        """Stop listening to the sampler and close the widget."""
        self._closed = True
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
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = tr("<vramlab monitor>")
        if self._snap() is not None:
            data["text/html"] = self.static_html()
        return data

    def _snap(self) -> Any:
        return self._sampler.latest if self._sampler.latest is not None else self._latest

    def static_html(self, stopped: bool = False) -> str:
        """A self-contained copy of the monitor's latest reading (class ``vramlab-monitor-static``)."""
        snap = self._snap()
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.time))
        if stopped:
            last = _html.escape(tr("last reading {when}", when=when))
            status = self._status_html(stopped=True).replace("</span>", f" · {last}</span>", 1)
        else:
            copy = _html.escape(tr("static copy of the live monitor, reading of {when}", when=when))
            status = f'<span style="font-size:12px;opacity:0.85"><b>vramlab</b> · {copy}</span>'
        with self._lock:
            self._window.update(self._sampler.samples, snap.time)
            spark = sparkline_svg(self._window, _copy(self._sampler.markers), snap.time, self._window_s)
        return (f'<div class="vramlab-monitor-static" style="color:inherit;padding:2px 0">{status}'
                f"{bars_html(snap, self._swap_rate())}{spark}</div>")

    def _ipython_display_(self) -> None:
        """Display the widget with a display id, so that a stop can leave the static copy in its place."""
        from IPython.display import display

        if self._display_id is None and _in_kernel():
            self._display_id = f"vramlab-monitor-{uuid.uuid4().hex}"
        # shown again while stopped: the static copy, like its other outputs
        bundle = self._frozen_bundle() if self._shown == "static" else self._repr_mimebundle_()
        if self._display_id is None:
            display(bundle, raw=True)
        else:
            display(bundle, raw=True, display_id=self._display_id)

    def _switch_view(self, to: str) -> None:
        """Make every output of this monitor show the live widget or (``"static"``) the frozen copy."""
        if self._display_id is None or self._shown == to or (to == "static" and self._snap() is None):
            return
        try:
            from IPython.display import update_display

            bundle = self._frozen_bundle() if to == "static" else self._repr_mimebundle_()
            update_display(bundle, raw=True, display_id=self._display_id)
            self._shown = to
        except Exception:  # never raise into the sampler thread (or at interpreter exit)
            pass

    def _frozen_bundle(self) -> dict[str, str]:
        """What a stopped monitor's outputs hold: its last reading, with no widget."""
        return {"text/plain": tr("<vramlab monitor: stopped>") + "\n" + snapshot_text(self._snap()),
                "text/html": self.static_html(stopped=True)}


def _in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (where display ids reach a frontend)."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except Exception:
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def _spark_key(s: Any) -> Any:
    """What of the newest sample the sparkline shows, to the MiB (``None`` for no sample)."""
    if s is None:
        return None
    mib = 1 << 20
    return (s.rss // mib, s.host_used // mib, tuple((d.id, (d.used or 0) // mib) for d in s.devices))


def _unreadable_status(snap: Any) -> str:
    """A warning for the status line naming the devices without figures ("" when none)."""
    if snap is None:
        return ""
    bad = unreadable_devices(snap)
    if not bad:
        return ""
    names = ", ".join(d.id for d in bad)
    return (f' <span style="font-size:12px;color:#e15759">· '
            f'{_html.escape(tr("{names}: cannot be read, see below", names=names))}</span>')


class TrialProgress:
    """A search's progress in a notebook: a bar (trials run against trials run plus those left at
    most) and the last trial's line (:func:`vramlab.display.text.trial_line`). Never raises: a
    frontend that cannot show it leaves the search as it was."""

    def __init__(self) -> None:
        from IPython.display import display

        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="16em"))
        self.label = widgets.HTML()
        display(widgets.HBox([self.bar, self.label]))

    def update(self, line: str, done: int, left: int) -> None:
        """``done`` trials run, at most ``left`` to go."""
        try:
            self.bar.max = max(done + left, 1)
            self.bar.value = done
            self.label.value = _html.escape(line)
        except Exception:
            pass

    def close(self, line: str) -> None:
        try:
            self.bar.max = max(self.bar.value, 1)
            self.bar.value = self.bar.max
            self.bar.bar_style = "success"
            self.label.value = _html.escape(line)
        except Exception:
            pass


def trial_progress() -> Optional[TrialProgress]:
    """A :class:`TrialProgress` shown in this notebook, or ``None`` outside a Jupyter kernel."""
    if not _in_kernel():
        return None
    try:
        return TrialProgress()
    except Exception:
        return None
