"""The live monitor's sparkline: the samples of the last minutes kept as they come
(:class:`SampleWindow`), and their inline SVG (:func:`sparkline_svg`) with cell and OOM
markers. Pure: no ipywidgets, no reading of the machine. Times are seconds since the epoch;
each line is a fraction of its capacity (the host's effective limit, a device's total).
"""

from __future__ import annotations

import collections
import html as _html
import itertools
from operator import itemgetter
from typing import Any, Deque, Iterable, Optional

from ..i18n import tr
from .html import COLOURS
from .words import marker_text

__all__ = ["HOST_RSS", "HOST_USED", "MIN_SPAN_S", "SPARK_POINTS", "SampleWindow", "WINDOW_S", "copy_ring",
           "sparkline_svg"]

WINDOW_S = 300.0  # seconds of history in the sparkline
#: the sparkline's keys for the host's lines (a device's line is keyed by its id)
HOST_RSS, HOST_USED = "host:rss", "host:used"
SPARK_POINTS = 120  # at most this many points per line of the sparkline (each the highest of its stretch)
MIN_SPAN_S = 30.0  # the sparkline's shortest time axis, while there is less history than WINDOW_S
_Y_TOPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # the sparkline's y axis ends at the first that fits


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
        recent = [s for s in copy_ring(ring) if s.time >= cutoff]
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


def copy_ring(ring: Any) -> list[Any]:
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
    y axis ends at the first of 1, 2, 5, 10, 20, 50, 100 % that holds this process's and the
    devices' points, so a small process on a large machine still shows its rises; the label says
    where it ends, and the host's whole use, when above it, runs along the top and says how high it went.
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
    # the scale follows this process and the devices: the machine's whole use would squeeze a
    # 600 MB rise on a large host flat; above the scale its line runs along the top, and says so
    peak = max((f for label, _, pts in series if label != HOST_USED for _, f in pts), default=0.0)
    top = next((t for t in _Y_TOPS if peak <= t), 1.0)
    used_peak = max((f for label, _, pts in series if label == HOST_USED for _, f in pts), default=0.0)
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
        name = _series_label(label)
        if label == HOST_USED and used_peak > top:
            name = tr("{line} (above the scale, up to {peak})", line=name, peak=f"{used_peak:.0%}")
        legend.append(f'<tspan fill="{colour}">■</tspan><tspan fill="currentColor"> '
                      f'{_html.escape(name)}  </tspan>')
    caption = tr("· last {span}, 0–{top} of capacity", span=_span_label(span), top=f"{top:.0%}")
    parts.append(f'<text x="4" y="{height - 4}" font-size="10.5" fill="currentColor">'
                 f'{"".join(legend)}<tspan fill="currentColor" fill-opacity="0.8">{_html.escape(caption)}</tspan></text>')
    parts.append("</svg>")
    return "".join(parts)
