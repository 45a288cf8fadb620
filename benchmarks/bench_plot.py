"""Cost of the timeline (``%vram plot``) and of the monitor's sparkline as the history grows.

    python benchmarks/bench_plot.py [--cells 2000]

Timeline: builds and renders (PNG) the figure for 10 and N cell records, as drawn now (one
collection per axis, at most ``MAX_LABELS`` labels) and with the per-cell drawing it replaced
(one ``axvspan`` per cell per axis and one annotation per cell), and prints the seconds and
their ratios. Sparkline: renders a full ring (14,400 samples) all inside the window, from a
list of samples and from the monitor's kept window, and prints the milliseconds and their ratio.
Figures depend on the machine; only the ratios are meant to be compared.
"""

from __future__ import annotations

import argparse
import collections
import time

from vramlab.display.plot import plot_history
from vramlab.display.sparkline import SampleWindow, sparkline_svg
from vramlab.model import CellRecord, DeviceSample, History, HostDelta, Sample

GiB = 1 << 30
_HOST = HostDelta(rss_start=0, rss_end=0, rss_delta=0, peak=None, peak_delta=None, swap_delta=None, peak_exact=True)


def history(n: int) -> History:
    """``n`` one-second cells two seconds apart, a sample every second (host and one device)."""
    cells = tuple(CellRecord(execution_count=i + 1, started=2.0 * i, wall_s=1.0, error=None, host=_HOST)
                  for i in range(n))
    samples = tuple(Sample(time=float(t), rss=GiB, peak=None, host_used=2 * GiB, available=6 * GiB, limit=8 * GiB,
                           swap_used=None, swap_in=None, swap_out=None,
                           devices=(DeviceSample("cuda:0", GiB, 2 * GiB, 3 * GiB, 16 * GiB),)) for t in range(2 * n))
    return History(cells=cells, samples=samples, markers=())


def per_cell(h: History) -> object:
    """The figure with the drawing it replaced added back: an axvspan per cell per axis, an annotation per cell."""
    fig = plot_history(History(cells=(), samples=h.samples, markers=h.markers))
    t0 = min([s.time for s in h.samples] + [c.started for c in h.cells])
    for ax in fig.axes:
        for c in h.cells:
            ax.axvspan(c.started - t0, c.started - t0 + c.wall_s, color="#bab0ac", alpha=0.25)
    for c in h.cells:
        fig.axes[0].annotate(f"[{c.execution_count}]", (c.started - t0, 1.0), xycoords=("data", "axes fraction"),
                             fontsize="x-small", va="bottom")
    return fig


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=2000)
    n = ap.parse_args().cells
    print("timeline: figure built and rendered as PNG, seconds")
    plot_history(history(10))._repr_png_()  # warm-up: fonts and caches
    rows = {}
    for k in (10, n):
        h = history(k)
        rows[k] = (timed(lambda: plot_history(h)._repr_png_()), timed(lambda: per_cell(h)._repr_png_()))
        print(f"  {k:>6} cells  now {rows[k][0]:8.3f}  per-cell drawing {rows[k][1]:8.3f}  "
              f"ratio {rows[k][1] / rows[k][0]:6.1f}x")
    print(f"  growth from 10 to {n} cells: now {rows[n][0] / rows[10][0]:.1f}x, per-cell {rows[n][1] / rows[10][1]:.1f}x")
    now = 100_000.0
    m = 14_400
    ring = collections.deque(Sample(time=now - 290 + i * 290 / m, rss=(i % 97) << 20, peak=None, host_used=95 << 20,
                                    available=5 << 20, limit=100 << 20, swap_used=0, swap_in=0, swap_out=0,
                                    devices=(DeviceSample("cuda:0", 0, 0, (i % 50) << 20, 100 << 20),))
                             for i in range(m))
    win = SampleWindow()
    win.update(ring, now)
    reps = 5
    full = sum(timed(lambda: sparkline_svg(list(ring), [], now)) for _ in range(reps)) / reps
    kept = sum(timed(lambda: (win.update(ring, now), sparkline_svg(win, [], now))) for _ in range(reps)) / reps
    print(f"sparkline, {m} samples in the window, ms per redraw: from the ring {full * 1e3:.1f}, "
          f"from the kept window {kept * 1e3:.1f}, ratio {full / kept:.1f}x")


if __name__ == "__main__":
    main()
