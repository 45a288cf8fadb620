"""A figure's words travel with its picture: the labels in a PNG output's metadata.

In-process tests read figures (matplotlib's Figure, no pyplot) and drive IPython's own
DisplayFormatter; the inline backend is process-wide state, so the tests that activate it run
in a subprocess with a real InteractiveShell, and one runs a real kernel (nbclient), as the
workbook's build does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from matplotlib.figure import Figure

from vramlab.lessons.figures import KEY, figure_labels, install, label_problems

ROOT = Path(__file__).resolve().parents[2]
INLINE = "module://matplotlib_inline.backend_inline"


def _run(code: str, env_extra: dict[str, str] | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND" and not k.startswith("VRAMLAB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout


def _line_and_bars() -> Figure:
    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot([1, 2, 3], [3, 1, 2], label="medido")
    ax1.axvline(2, label="limite")
    ax1.set_xlabel("tamanho do lote")
    ax1.set_ylabel("MiB")
    ax1.set_title("pico", loc="left")
    ax1.legend(title="legenda")
    ax2.bar(["fp32", "int8"], [4, 1])
    ax2.set_title("bytes por parâmetro")
    ax2.set_ylabel("bytes")
    fig.suptitle("memória")
    return fig


# --- the labels -------------------------------------------------------------------------------


def test_the_labels_hold_titles_axis_labels_and_legends():
    labels = figure_labels(_line_and_bars())
    assert labels["suptitle"] == "memória" and labels["supxlabel"] == labels["supylabel"] == ""
    assert labels["legend"] == []
    a, b = labels["axes"]
    assert (a["title"], a["xlabel"], a["ylabel"]) == ("pico", "tamanho do lote", "MiB")
    assert a["legend"] == ["medido", "limite"] and a["legend_title"] == "legenda"
    assert a["visible"] and a["axis_on"] and a["has_data"] and not a["colorbar"]
    assert not a["xcategorical"] and not a["ycategorical"]
    assert (b["title"], b["xlabel"], b["ylabel"], b["legend"]) == ("bytes por parâmetro", "", "bytes", [])
    assert b["xcategorical"] and not b["ycategorical"]
    assert a["sharex"] == a["sharey"] == b["sharex"] == b["sharey"] == []


def test_the_labels_are_json_and_stable():
    labels = figure_labels(_line_and_bars())
    assert json.loads(json.dumps(labels)) == labels
    assert figure_labels(_line_and_bars()) == labels
    assert set(labels) == {"suptitle", "supxlabel", "supylabel", "legend", "axes"}
    assert set(labels["axes"][0]) == {"title", "xlabel", "ylabel", "legend", "legend_title", "visible", "axis_on",
                                      "has_data", "colorbar", "xcategorical", "ycategorical", "sharex", "sharey"}


def test_ticks_set_with_words_are_categories_ticks_set_with_numbers_are_not():
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1, 2], [1, 2, 3])
    ax.set_xticks([0, 1, 2], ["start", "after model", "after step"])
    ax.set_yticks([1, 2, 3], [64, 128, "−256"])
    (a,) = figure_labels(fig)["axes"]
    assert a["xcategorical"] and not a["ycategorical"]
    fig = Figure()
    ax = fig.subplots()
    ax.loglog([1, 10, 100], [1, 2, 3])
    ax.set_xticks([1, 10, 100])  # numbers, written as 10^k
    (a,) = figure_labels(fig)["axes"]
    assert not a["xcategorical"] and not a["ycategorical"]


def test_shared_axes_off_axes_colorbars_and_figure_legends_are_recorded():
    fig = Figure()
    axes = fig.subplots(1, 3, sharey=True)
    for ax in axes[:2]:
        ax.imshow([[0, 1], [1, 0]])
    axes[2].axis("off")
    fig.colorbar(axes[0].images[0], ax=axes[1], label="MiB")
    fig.legend(["uma"], loc="upper right")
    fig.supxlabel("largura")
    labels = figure_labels(fig)
    a0, a1, a2, cbar = labels["axes"]
    assert a0["sharey"] == [1, 2] and a1["sharey"] == [0, 2] and a0["sharex"] == []
    assert not a2["axis_on"] and a2["visible"] and not a2["has_data"]
    assert cbar["colorbar"] and "MiB" in (cbar["xlabel"], cbar["ylabel"])
    assert labels["legend"] == ["uma"] and labels["supxlabel"] == "largura"


# --- the rule ---------------------------------------------------------------------------------


def _one(draw) -> list[str]:
    fig = Figure()
    ax = fig.subplots()
    draw(fig, ax)
    return label_problems(figure_labels(fig))


def test_a_labelled_figure_has_no_problems():
    assert label_problems(figure_labels(_line_and_bars())) == []
    assert _one(lambda f, ax: (ax.plot([1, 2]), ax.set_xlabel("step"), ax.set_ylabel("loss"))) == []


def test_a_missing_axis_label_is_a_problem():
    assert _one(lambda f, ax: (ax.plot([1, 2]), ax.set_xlabel("step"))) == ["axes 0: no y label"]
    assert _one(lambda f, ax: (ax.plot([1, 2]), ax.set_ylabel("loss"), ax.set_title("t"))) == [
        "axes 0 ('t'): no x label"]
    assert _one(lambda f, ax: (ax.plot([1, 2]), ax.set_xlabel("  "), ax.set_ylabel("loss"))) == ["axes 0: no x label"]


def test_categories_may_go_unlabelled_under_a_title_but_not_without_one():
    bars = lambda f, ax: (ax.barh(["eager", "lazy"], [3, 1]), ax.set_xlabel("peak MiB"))  # noqa: E731
    assert _one(bars) == ["axes 0: no y label, and no title to say what its categories are"]
    assert _one(lambda f, ax: (bars(f, ax), ax.set_title("loading a dataset"))) == []
    assert _one(lambda f, ax: (bars(f, ax), f.suptitle("loading a dataset"))) == []
    # the value axis still needs its label, title or not
    assert _one(lambda f, ax: (ax.bar(["a", "b"], [1, 2]), ax.set_title("t"))) == [
        "axes 0 ('t'): no x label", "axes 0 ('t'): no y label"]


def test_a_shared_axis_is_labelled_once():
    fig = Figure()
    axes = fig.subplots(1, 3, sharey=True)
    for ax in axes:
        ax.plot([1, 2])
        ax.set_xlabel("width")
    axes[0].set_ylabel("side")
    assert label_problems(figure_labels(fig)) == []
    axes[0].set_ylabel("")
    assert label_problems(figure_labels(fig)) == [f"axes {i}: no y label" for i in range(3)]
    fig.supylabel("side")
    assert label_problems(figure_labels(fig)) == []


def test_off_empty_and_colorbar_axes():
    assert _one(lambda f, ax: (ax.imshow([[0, 1]]), ax.axis("off"), ax.set_title("a picture"))) == []
    assert _one(lambda f, ax: ax.imshow([[0, 1]])) == [
        "the figure has no title and no axis label", "axes 0: no x label", "axes 0: no y label"]

    def with_colorbar(fig, ax, label):
        im = ax.imshow([[0, 1]])
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        fig.colorbar(im, ax=ax, label=label)

    assert _one(lambda f, ax: with_colorbar(f, ax, "MiB")) == []
    assert _one(lambda f, ax: with_colorbar(f, ax, "")) == ["axes 1: the colorbar has no label"]


def test_a_blank_legend_entry_is_a_problem():
    def draw(fig, ax):
        ax.plot([1, 2])
        ax.plot([2, 1])
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        ax.legend(["", "b"])

    assert _one(draw) == ["axes 0: a legend entry is blank"]


# --- the formatter, in-process, on IPython's own DisplayFormatter ------------------------------


def _shell():
    from IPython.core.formatters import DisplayFormatter

    return SimpleNamespace(display_formatter=DisplayFormatter())


def _labelled_figure() -> Figure:
    fig = Figure()
    ax = fig.subplots()
    ax.plot([1, 2], label="a")
    ax.set_xlabel("x")
    ax.legend()
    return fig


def test_install_wraps_the_registered_printer_once_and_the_metadata_lands_under_image_png():
    from IPython.core.pylabtools import print_figure

    shell = _shell()
    png = shell.display_formatter.formatters["image/png"]
    png.for_type(Figure, lambda fig: print_figure(fig, "png", base64=True))
    assert install(shell) and install(shell)  # twice: still one wrapper
    printer = png.lookup_by_type(Figure)
    assert type(printer).__name__ == "_WithMetadata" and type(printer.printer).__name__ == "function"
    fig = _labelled_figure()
    data, md = shell.display_formatter.format(fig)
    assert data["image/png"].startswith("iVBOR")  # base64 of the PNG signature
    assert md == {"image/png": {KEY: figure_labels(fig)}}


def test_a_printer_registered_later_is_wrapped_as_it_is_registered():
    """What the inline backend does when it selects the figure formats: pop, then for_type."""
    from IPython.core.pylabtools import select_figure_formats

    shell = _shell()
    assert install(shell)  # no printer yet: nothing registered, nothing shown
    assert shell.display_formatter.format(_labelled_figure())[0].keys() == {"text/plain"}
    for formats in ("png", "retina", {"png", "svg"}):
        select_figure_formats(shell, formats)
        data, md = shell.display_formatter.format(_labelled_figure())
        assert "image/png" in data and md["image/png"][KEY]["axes"][0]["xlabel"] == "x", formats
        if formats == "retina":  # the printer's own metadata is kept beside ours
            assert {"width", "height", KEY} <= set(md["image/png"])
        if "svg" in formats:  # only the PNG carries it
            assert "image/svg+xml" in data and "image/svg+xml" not in md


def test_a_printer_registered_by_name_is_wrapped_without_importing_matplotlib():
    shell = _shell()
    png = shell.display_formatter.formatters["image/png"]
    install(shell)
    png.for_type_by_name("matplotlib.figure", "Figure", lambda fig: b"\x89PNG fake")
    assert type(png.deferred_printers[("matplotlib.figure", "Figure")]).__name__ == "_WithMetadata"
    data, md = shell.display_formatter.format(_labelled_figure())
    assert data["image/png"] == b"\x89PNG fake" and KEY in md["image/png"]


def test_a_failing_provider_leaves_the_plain_png_and_an_empty_figure_stays_empty(monkeypatch):
    from IPython.core.pylabtools import select_figure_formats

    shell = _shell()
    select_figure_formats(shell, "png")
    install(shell)
    assert shell.display_formatter.format(Figure())[0].keys() == {"text/plain"}  # no axes: no picture
    monkeypatch.setitem(shell.display_formatter.formatters["image/png"]._vramlab_figure_metadata, KEY,
                        lambda fig: 1 / 0)
    data, md = shell.display_formatter.format(_labelled_figure())
    assert "image/png" in data and md == {}


def test_install_outside_ipython_does_nothing_and_imports_nothing():
    out = _run("""
        import sys
        import vramlab.lessons
        from vramlab.lessons.figures import install
        print(install(), 'IPython' in sys.modules, 'matplotlib' in sys.modules, 'torch' in sys.modules)
    """)
    assert out.split() == ["False", "False", "False", "False"]


# --- a real InteractiveShell with the inline backend, in a subprocess ---------------------------

_SHELL_SCRIPT = """
import importlib, json, sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

ip = InteractiveShell.instance(colors="NoColor")

def run(code):
    with capture_output() as cap:
        ip.run_cell(code).raise_error()
    return [{"data": sorted(o.data), "metadata": o.metadata} for o in cap.outputs]

DRAW = ("fig, ax = plt.subplots()\\nax.plot([1, 2], [3, 4], label='medido')\\n"
        "ax.set_xlabel('tamanho do lote')\\nax.set_ylabel('MiB')\\nax.legend()\\n")
report = {}
first = sys.argv[1]
if first == "lessons":
    run("import vramlab.lessons")
    report["matplotlib imported by vramlab.lessons"] = "matplotlib" in sys.modules
    run("import matplotlib.pyplot as plt")
else:
    run("import matplotlib.pyplot as plt")
    report["before"] = run(DRAW)
    run("import vramlab.lessons")
import matplotlib
report["backend"] = matplotlib.get_backend()
report["flushed"] = run(DRAW)
report["shown"] = run(DRAW + "plt.show()")
report["transparent"] = run(DRAW + "fig.patch.set_alpha(0)\\nax.patch.set_alpha(0)\\n"
                            "[t.set_color('white') for t in ax.get_xticklabels() + ax.get_yticklabels()]\\n")
report["retina"] = run("from matplotlib_inline.backend_inline import set_matplotlib_formats\\n"
                       "set_matplotlib_formats('retina')\\n" + DRAW)
report["displayed"] = run("from IPython.display import display\\nplt.ioff()\\n" + DRAW + "display(fig)\\nplt.close(fig)")
ip.run_cell("plt.ion()")
importlib.reload(importlib.import_module("vramlab.lessons"))
from vramlab.lessons.figures import install
report["install again"] = install()
printer = ip.display_formatter.formatters["image/png"].lookup_by_type(matplotlib.figure.Figure)
report["printer"] = [type(printer).__name__, type(printer.printer).__name__]
report["after reload"] = run(DRAW)
print(json.dumps(report))
"""


@pytest.mark.parametrize("first", ["lessons", "pyplot"])
@pytest.mark.slow
def test_an_inline_figure_is_published_with_its_labels(first):
    """The inline backend registers its PNG printer when pyplot loads it, after or before
    ``import vramlab.lessons``, and again when the formats change: the labels survive each."""
    report = json.loads(_run(f"import sys; sys.argv[1:] = [{first!r}]\n" + _SHELL_SCRIPT, {"MPLBACKEND": INLINE})
                        .splitlines()[-1])
    assert report["backend"] in ("inline", INLINE)
    if first == "lessons":
        assert report["matplotlib imported by vramlab.lessons"] is False
    else:  # the control: before vramlab.lessons, the same figure goes out without labels
        (before,) = report["before"]
        assert "image/png" in before["data"] and KEY not in before["metadata"].get("image/png", {})
    want = {"title": "", "xlabel": "tamanho do lote", "ylabel": "MiB", "legend": ["medido"]}
    for case in ("flushed", "shown", "transparent", "retina", "displayed", "after reload"):
        (out,) = report[case]
        assert out["data"] == ["image/png", "text/plain"], case
        labels = out["metadata"]["image/png"][KEY]
        assert {k: labels["axes"][0][k] for k in want} == want, case
        assert label_problems(labels) == [], case
    # the backend's own metadata, merged beside ours: top-level needs_background, retina's size
    assert report["transparent"][0]["metadata"]["needs_background"] == "dark"
    assert {"width", "height", KEY} <= set(report["retina"][0]["metadata"]["image/png"])
    assert report["install again"] is True
    assert report["printer"] == ["_WithMetadata", "partial"]  # wrapped once, after reload and install


# --- a real kernel, as the build runs the lessons -----------------------------------------------


@pytest.mark.slow
def test_a_kernel_sends_the_labels_in_its_display_data_and_the_saved_notebook_keeps_them(tmp_path):
    import nbclient
    import nbformat

    draw = ("fig, ax = plt.subplots()\nax.bar(['fp32', 'int8'], [4, 1], label='medido')\n"
            "ax.set_title('bytes por parâmetro')\nax.set_ylabel('bytes')\nax.legend()")
    sources = ["import matplotlib.pyplot as plt", draw, "import vramlab.lessons", draw,
               "%matplotlib inline\n" + draw + "\nplt.show()"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_")}
    env["MPLBACKEND"] = INLINE  # as tools/build_notebooks.py sets it
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    nbformat.write(nb, str(tmp_path / "figures.ipynb"))
    saved = json.loads((tmp_path / "figures.ipynb").read_text())
    pictures = [[o for o in c["outputs"] if "image/png" in o.get("data", {})] for c in saved["cells"]]
    assert [len(p) for p in pictures] == [0, 1, 0, 1, 1]
    assert KEY not in pictures[1][0]["metadata"].get("image/png", {})  # drawn before the import
    for (out,) in pictures[3:]:
        assert out["output_type"] == "display_data"
        labels = out["metadata"]["image/png"][KEY]
        (ax,) = labels["axes"]
        assert (ax["title"], ax["ylabel"], ax["legend"], ax["xcategorical"]) == (
            "bytes por parâmetro", "bytes", ["medido"], True)
        assert label_problems(labels) == []
