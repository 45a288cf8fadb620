"""A matplotlib timeline of the history: device and host memory, cell spans, OOMs.

The figure is a plain ``matplotlib.figure.Figure`` (no pyplot state) that also renders
itself as PNG (``_repr_png_``), so it shows as a picture in any kernel, and a saved
notebook keeps it, whether or not the inline backend was ever activated. Without
matplotlib, :func:`plot_history` raises :class:`~vramlab._extras.MissingExtra`, one line
saying what to install.
"""

from __future__ import annotations

from typing import Any, Optional

from ..model import History

__all__ = ["plot_history", "PNG_DPI"]

PNG_DPI = 100  # dots per inch of the PNG a notebook shows

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


def plot_history(h: History, *, last_s: Optional[float] = None) -> Any:
    """Draw ``h`` (a :class:`~vramlab.model.History`) and return the ``Figure``.

    Lines: per device torch allocated, torch reserved and used (NVML or virtual), and
    the host's RSS, in GiB against seconds. Each recorded cell is a shaded span labelled
    by its execution count; OOM markers are red lines. Uses the object API (no pyplot
    state), so it works in any backend, and shows as PNG in any kernel.
    """
    from .._extras import require_matplotlib

    require_matplotlib("the memory timeline (%vram plot, vramlab.plot())")
    Figure = _figure_class()
    samples = list(h.samples)
    cells = list(h.cells)
    t_end = max([s.time for s in samples] + [c.started + c.wall_s for c in cells] + [0.0])
    if last_s is not None:
        samples = [s for s in samples if s.time >= t_end - last_s]
    t0 = min([s.time for s in samples] + [c.started for c in cells] + [t_end])
    ids: list[str] = []
    for s in samples:
        ids.extend(d[0] for d in s.devices if d[0] not in ids)
    n = 1 + len(ids)
    fig = Figure(figsize=(8, 1.8 + 1.6 * n), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    G = 2.0**30
    xs = [s.time - t0 for s in samples]
    ax = axes[0]
    ax.plot(xs, [s.rss / G for s in samples], label="this process (RSS)", color="#4e79a7")
    ax.plot(xs, [s.host_used / G for s in samples], label="used (scope)", color="#e15759", alpha=0.7)
    if samples:
        ax.axhline(samples[-1].limit / G, color="grey", ls="--", lw=1, label="limit")
    ax.set_ylabel("host GiB")
    ax.legend(loc="upper left", fontsize="small")
    for i, id_ in enumerate(ids, start=1):
        ax = axes[i]
        for idx, label, colour in ((1, "allocated", "#4e79a7"), (2, "reserved", "#76b7b2"), (3, "used", "#e15759")):
            pts = [(s.time - t0, d[idx] / G) for s in samples for d in s.devices if d[0] == id_ and d[idx] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, color=colour)
        tot = [d[4] for s in samples for d in s.devices if d[0] == id_ and d[4] is not None]
        if tot:
            ax.axhline(tot[-1] / G, color="grey", ls="--", lw=1, label="total")
        ax.set_ylabel(f"{id_} GiB")
        ax.legend(loc="upper left", fontsize="small")
    for ax in axes:
        for c in cells:
            ax.axvspan(c.started - t0, c.started - t0 + c.wall_s, color="#f28e2b" if c.error else "#bab0ac", alpha=0.25)
        for m in h.markers:
            if m.kind == "oom":
                ax.axvline(m.time - t0, color="#e15759", lw=2)
    top = axes[0]
    for c in cells:
        top.annotate(f"[{c.execution_count}]", (c.started - t0, 1.0), xycoords=("data", "axes fraction"),
                     fontsize="x-small", va="bottom")
    for m in h.markers:
        if m.kind == "oom":
            top.annotate("OOM", (m.time - t0, 0.5), xycoords=("data", "axes fraction"), color="#e15759",
                         fontsize="small", rotation=90)
    axes[-1].set_xlabel("seconds")
    return fig
