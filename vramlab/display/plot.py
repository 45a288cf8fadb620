"""A matplotlib timeline of the history: device and host memory, cell spans, OOMs.

The figure is a plain ``matplotlib.figure.Figure`` (no pyplot state) that also renders
itself as PNG (``_repr_png_``), so it shows as a picture in any kernel, and a saved
notebook keeps it, whether or not the inline backend was ever activated. Without
matplotlib, :func:`plot_history` raises :class:`~vramlab._extras.MissingExtra`, one line
saying what to install.
"""

from __future__ import annotations

from typing import Any, Optional

from ..i18n import tr
from .html import COLOURS
from ..model import CellRecord, History

__all__ = ["plot_history", "PNG_DPI", "MAX_LABELS"]

PNG_DPI = 100  # dots per inch of the PNG a notebook shows
#: At most this many cell labels (``[7]``), and as many ``OOM`` labels: evenly chosen past that,
#: the cells that ran out of memory always among them.
MAX_LABELS = 40
_OOM_ERRORS = ("OutOfMemoryError", "MemoryError")

_FIGURE_CLASS: Any = None


def _figure_class() -> Any:
    """``Figure`` with a PNG repr (made once, at first use, so that importing this module needs no matplotlib)."""
    global _FIGURE_CLASS
    if _FIGURE_CLASS is None:
        from matplotlib.figure import Figure

        class TimelineFigure(Figure):
            """The timeline: a ``Figure`` that IPython shows as PNG in any kernel."""

            def _repr_png_(self) -> bytes:
                import io

                buf = io.BytesIO()
                self.savefig(buf, format="png", dpi=PNG_DPI)
                return buf.getvalue()

        _FIGURE_CLASS = TimelineFigure
    return _FIGURE_CLASS


def _evenly(n: int, k: int) -> list[int]:
    """``k`` indices of ``range(n)`` spread evenly, the first and the last among them (all when ``n <= k``)."""
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [n - 1] if k == 1 else []
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _labelled_cells(cells: list[CellRecord], oom_times: list[float], k: int) -> list[int]:
    """The indices of at most ``k`` cells to label: every cell that ran out of memory (raised an
    out-of-memory error, or holds an OOM marker) while they fit, the rest spread evenly."""
    import bisect

    oom_times = sorted(oom_times)

    def ran_out(c: CellRecord) -> bool:
        j = bisect.bisect_left(oom_times, c.started)  # the first OOM marker at or after the cell's start
        return c.error in _OOM_ERRORS or (j < len(oom_times) and oom_times[j] <= c.started + c.wall_s)

    forced = [i for i, c in enumerate(cells) if ran_out(c)]
    if len(forced) >= k:
        return [forced[i] for i in _evenly(len(forced), k)]
    chosen = set(forced)
    rest = [i for i in range(len(cells)) if i not in chosen]
    return sorted(forced + [rest[i] for i in _evenly(len(rest), k - len(forced))])


def plot_history(h: History, *, last_s: Optional[float] = None, last: Optional[int] = None) -> Any:
    """Draw ``h`` (a :class:`~vramlab.model.History`) and return the ``Figure``.

    Lines: per device torch allocated, torch reserved and used (NVML or virtual), and
    the host's RSS, in GiB against seconds. The recorded cells are shaded spans (one
    collection per axis, however many cells), and at most :data:`MAX_LABELS` of them are
    labelled by their execution count, evenly chosen, the cells that ran out of memory
    always among them; OOM markers are red lines (one collection per axis) labelled
    ``OOM``. Uses the object API (no pyplot state), so it works in any backend, and shows
    as PNG in any kernel.

    Args:
        h: the history to draw.
        last_s: only the last ``last_s`` seconds (of samples, cells and markers).
        last: only the last ``last`` cell records, and the samples and markers from the
            start of the first of them to the end of the last (with no cell records,
            the samples are all kept). At least 1.

    Raises:
        ValueError: ``last`` below 1.
        MissingExtra: matplotlib is not installed.
    """
    from .._extras import require_matplotlib

    if last is not None and last < 1:
        raise ValueError(f"last must be at least 1 (a number of cell records), got {last!r}")
    require_matplotlib("the memory timeline (%vram plot, vramlab.plot())")
    from matplotlib.collections import LineCollection, PolyCollection

    Figure = _figure_class()
    samples = list(h.samples)
    cells = list(h.cells)
    markers = list(h.markers)
    t_end = max([s.time for s in samples] + [c.started + c.wall_s for c in cells] + [0.0])
    if last_s is not None:
        since = t_end - last_s
        samples = [s for s in samples if s.time >= since]
        cells = [c for c in cells if c.started + c.wall_s >= since]
        markers = [m for m in markers if m.time >= since]
    if last is not None and cells:
        cells = cells[-last:]
        lo, hi = cells[0].started, max(c.started + c.wall_s for c in cells)
        samples = [s for s in samples if lo <= s.time <= hi]
        markers = [m for m in markers if lo <= m.time <= hi]
    ooms = [m for m in markers if m.kind == "oom"]
    times = [s.time for s in samples] + [c.started for c in cells] + [m.time for m in markers]
    ends = [s.time for s in samples] + [c.started + c.wall_s for c in cells] + [m.time for m in markers]
    t0 = min(times, default=0.0)
    x_end = max(ends, default=t0) - t0
    ids: list[str] = []
    for s in samples:
        ids.extend(d.id for d in s.devices if d.id not in ids)
    n = 1 + len(ids)
    fig = Figure(figsize=(8, 1.8 + 1.6 * n), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    G = 2.0**30
    xs = [s.time - t0 for s in samples]
    ax = axes[0]
    ax.plot(xs, [s.rss / G for s in samples], label=tr("this process (RSS)"), color="#4e79a7")
    used_label = tr("used (scope)")
    rss_top = max((s.rss for s in samples), default=0) / G
    used_top = max((s.host_used for s in samples), default=0) / G
    # the scale follows this process when the machine's whole use dwarfs it (a 600 MB rise on a
    # large host would be flat): the machine's line and the limit are above it, and say so
    zoom = bool(samples) and rss_top > 0 and used_top > 3 * rss_top
    if zoom:
        used_label = tr("{line} (above the scale, up to {peak})", line=used_label, peak=f"{used_top:.1f} GiB")
    ax.plot(xs, [s.host_used / G for s in samples], label=used_label, color=COLOURS["others"])
    if samples:
        ax.axhline(samples[-1].limit / G, color="grey", ls="--", lw=1, label=tr("limit"))
    if zoom:
        ax.set_ylim(0, rss_top * 1.15)
    ax.set_ylabel(tr("host GiB"))
    ax.legend(loc="upper left", fontsize="small")
    per_device: dict[str, list[tuple[float, Any]]] = {id_: [] for id_ in ids}
    for s in samples:
        for d in s.devices:
            per_device[d.id].append((s.time - t0, d))
    for i, id_ in enumerate(ids, start=1):
        ax = axes[i]
        rows = per_device[id_]
        for field, label, colour in (("allocated", tr("allocated"), "#4e79a7"), ("reserved", tr("reserved"), "#76b7b2"),
                                     ("used", tr("used"), "#e15759")):
            pts = [(x, getattr(d, field)) for x, d in rows if getattr(d, field) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] / G for p in pts], label=label, color=colour)
        tot = [d.total for _, d in rows if d.total is not None]
        if tot:
            ax.axhline(tot[-1] / G, color="grey", ls="--", lw=1, label=tr("total"))
        ax.set_ylabel(tr("{device} GiB", device=id_))
        ax.legend(loc="upper left", fontsize="small")
    spans = [[(c.started - t0, 0.0), (c.started - t0, 1.0), (c.started - t0 + c.wall_s, 1.0),
              (c.started - t0 + c.wall_s, 0.0)] for c in cells]
    span_colours = ["#f28e2b" if c.error else "#bab0ac" for c in cells]
    oom_xs = [m.time - t0 for m in ooms]
    for ax in axes:
        # x in data, y in axes fraction: the spans and OOM lines fill each axis's height
        ax.add_collection(PolyCollection(spans, facecolors=span_colours, edgecolors="none", alpha=0.25,
                                         transform=ax.get_xaxis_transform()), autolim=False)
        ax.add_collection(LineCollection([[(x, 0.0), (x, 1.0)] for x in oom_xs], colors="#e15759", linewidths=2,
                                         transform=ax.get_xaxis_transform()), autolim=False)
    if x_end > 0:
        pad = 0.02 * x_end
        axes[0].set_xlim(-pad, x_end + pad)  # shared: the spans and lines are not in the data limits
    top = axes[0]
    for i in _labelled_cells(cells, [m.time for m in ooms], MAX_LABELS):
        c = cells[i]
        count = "-" if c.execution_count is None else c.execution_count
        top.text(c.started - t0, 1.0, f"[{count}]", transform=top.get_xaxis_transform(), fontsize="x-small",
                 va="bottom")
    for i in _evenly(len(ooms), MAX_LABELS):
        top.text(oom_xs[i], 0.5, "OOM", transform=top.get_xaxis_transform(), color="#e15759", fontsize="small",
                 rotation=90)
    axes[-1].set_xlabel(tr("seconds"))
    return fig
