"""The timeline stays one collection per axis however many cells it draws, and `last` picks cells."""

import pytest

from vramlab.display.plot import MAX_LABELS, plot_history
from vramlab.facts import MarkerKind
from vramlab.model import CellRecord, DeviceSample, History, HostDelta, Marker, Sample

GiB = 1 << 30
_HOST = HostDelta(rss_start=0, rss_end=0, rss_delta=0, peak=None, peak_delta=None, swap_delta=None, peak_exact=True)


def _history(n_cells, oom_cells=(), error_cells=()):
    """``n_cells`` cells of 1 s each, one every 2 s from t=1000, cell i numbered i + 1; a sample every second
    (host and one device); an OOM marker inside each cell of ``oom_cells``; ``error_cells`` raised an OOM."""
    cells = tuple(CellRecord(execution_count=i + 1, started=1000.0 + 2 * i, wall_s=1.0,
                             error="OutOfMemoryError" if i in error_cells else None, host=_HOST)
                  for i in range(n_cells))
    samples = tuple(Sample(time=1000.0 + t, rss=GiB, peak=None, host_used=2 * GiB, available=6 * GiB, limit=8 * GiB,
                           swap_used=None, swap_in=None, swap_out=None,
                           devices=(DeviceSample("cuda:0", GiB, 2 * GiB, 3 * GiB, 16 * GiB),))
                    for t in range(2 * n_cells))
    markers = tuple(Marker(1000.0 + 2 * i + 0.5, MarkerKind.OOM, i + 1) for i in oom_cells)
    return History(cells=cells, samples=samples, markers=markers)


def _counts(fig):
    return [(len(ax.collections), len(ax.patches), len(ax.lines)) for ax in fig.axes]


def _cell_labels(fig):
    return [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("[")]


@pytest.mark.slow
def test_artists_per_axis_do_not_grow_with_the_cells():
    small = plot_history(_history(10, oom_cells=(3,)))
    large = plot_history(_history(2000, oom_cells=(3,)))
    assert _counts(small) == _counts(large)
    assert len(large.axes) == 2  # the host and cuda:0
    for ax in large.axes:
        spans, ooms = ax.collections
        assert len(spans.get_paths()) == 2000 and len(ooms.get_segments()) == 1


def test_labels_are_capped_evenly_and_keep_the_cells_that_ran_out_of_memory():
    fig = plot_history(_history(2000, oom_cells=(1233,), error_cells=(776,)))
    labels = _cell_labels(fig)
    assert len(labels) <= MAX_LABELS
    assert "[1234]" in labels and "[777]" in labels  # the OOM marker's cell, and the cell that raised
    assert labels[0] == "[1]" and labels[-1] == "[2000]"
    assert [t.get_text() for t in fig.axes[0].texts].count("OOM") == 1


def test_few_cells_are_all_labelled():
    assert _cell_labels(plot_history(_history(10))) == [f"[{i}]" for i in range(1, 11)]


def test_last_keeps_the_last_cells_their_samples_and_their_oom_markers():
    h = _history(2000, oom_cells=(3, 1998))
    fig = plot_history(h, last=5)
    spans, ooms = fig.axes[0].collections
    assert len(spans.get_paths()) == 5
    assert _cell_labels(fig) == ["[1996]", "[1997]", "[1998]", "[1999]", "[2000]"]
    assert len(ooms.get_segments()) == 1 and [t.get_text() for t in fig.axes[0].texts].count("OOM") == 1
    # the samples of cells 1996..2000: from t=1000+2*1995 to the end of the last cell, 1000+2*1999+1
    rss = fig.axes[0].lines[0]
    assert len(rss.get_xdata()) == 10
    assert min(rss.get_xdata()) >= 0 and max(rss.get_xdata()) <= 9


def test_last_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        plot_history(_history(3), last=0)


def test_a_history_without_cells_or_samples_still_draws():
    fig = plot_history(History(cells=(), samples=(), markers=()), last=3)
    assert len(fig.axes) == 1 and _cell_labels(fig) == []
