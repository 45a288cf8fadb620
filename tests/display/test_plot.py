"""The matplotlib timeline of a history."""

import pytest

from matplotlib.figure import Figure

from vramlab.display.plot import plot_history


def test_plot_returns_a_figure_with_cell_spans(recorded_history):
    fig = plot_history(recorded_history)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert any("[7]" == t.get_text() for t in ax.texts)
    (spans, _ooms) = ax.collections  # the cells' shaded spans, one collection per axis
    assert len(spans.get_paths()) == 3  # one span per cell


def test_the_figure_renders_itself_as_png(recorded_history):
    png = plot_history(recorded_history)._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_without_matplotlib_one_line_says_what_to_install(recorded_history, monkeypatch):
    import pytest

    from vramlab._extras import MissingExtra

    for name in [m for m in __import__("sys").modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib now fails
    monkeypatch.setattr("vramlab.display.plot._FIGURE_CLASS", None)
    with pytest.raises(MissingExtra, match=r"pip install 'vramlab\[plot\]'") as e:
        plot_history(recorded_history)
    assert "\n" not in str(e.value) and e.value._render_traceback_() == [f"MissingExtra: {e.value}"]


def _fresh_kernel_outputs(tmp_path, sources):
    """Run ``sources`` as the cells of a new notebook in a fresh kernel (nbclient), save it, read it back."""
    import os
    from pathlib import Path

    import nbclient
    import nbformat

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND",) and not k.startswith("VRAMLAB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    path = tmp_path / "fresh.ipynb"
    nbformat.write(nb, str(path))
    return nbformat.read(str(path), as_version=4)


@pytest.mark.slow
def test_plot_shows_a_png_in_a_fresh_kernel_and_the_saved_notebook_keeps_it(tmp_path):
    """No cell imported matplotlib.pyplot, so IPython's inline backend is not active: the
    timeline must still show as a picture, through %vram plot and vramlab.plot()."""
    import base64

    nb = _fresh_kernel_outputs(tmp_path, [
        "%load_ext vramlab\n%vram auto on",
        "x = bytearray(32 << 20)",
        "import sys; print('matplotlib.pyplot' in sys.modules)",
        "%vram plot",
        "import vramlab\nvramlab.plot()",
    ])
    assert nb.cells[2].outputs[0]["text"].splitlines()[0] == "False"
    for cell in nb.cells[3:]:
        (out,) = [o for o in cell.outputs if o.output_type in ("execute_result", "display_data")]
        assert "image/png" in out.data, list(out.data)
        assert base64.b64decode(out.data["image/png"]).startswith(b"\x89PNG")
        assert not any(o.output_type == "error" for o in cell.outputs)


def test_the_timeline_is_labelled_in_the_notebooks_language(recorded_history, speak):
    def labels(fig):
        out = []
        for ax in fig.axes:
            out += [ax.get_ylabel(), ax.get_xlabel()] + [t.get_text() for t in ax.get_legend().get_texts()]
        return [x for x in out if x]

    speak("en")
    en = labels(plot_history(recorded_history))
    speak("pt-BR")
    pt = labels(plot_history(recorded_history))
    for english, portuguese in [("host GiB", "GiB no host"), ("this process (RSS)", "este processo (RSS)"),
                                ("limit", "limite"), ("seconds", "segundos")]:
        assert english in en and portuguese in pt, (english, portuguese)
        assert english not in pt


def test_a_small_process_on_a_large_machine_fills_the_host_panel():
    """%vram plot was scaled to the whole machine's use, so a 600 MB rise barely showed
    (hardening, display nits): the host panel follows this process, and the machine's line says
    it is above the scale."""
    from vramlab.model import History, Sample

    G = 2**30
    samples = tuple(Sample(time=1000.0 + i, rss=(200 if i < 10 else 800) * 2**20, peak=None, host_used=12 * G,
                           available=12 * G, limit=24 * G, swap_used=0, swap_in=0, swap_out=0, devices=())
                    for i in range(20))
    fig = plot_history(History(cells=(), samples=samples, markers=()))
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo == 0 and 800 / 1024 < hi < 1.0  # GiB: the 600 MiB rise spans most of the panel
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "used (scope) (above the scale, up to 12.0 GiB)" in legend and "limit" in legend
