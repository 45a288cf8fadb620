"""The matplotlib timeline of a history."""

from matplotlib.figure import Figure

from vramlab.display.plot import plot_history


def test_plot_returns_a_figure_with_cell_spans(recorded_history):
    fig = plot_history(recorded_history)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert any("[7]" == t.get_text() for t in ax.texts)
    assert len(ax.patches) >= 3  # one shaded span per cell
