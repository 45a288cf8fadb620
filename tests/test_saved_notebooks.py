"""What a reader without a kernel sees: the committed notebooks, converted to HTML by nbconvert
(as GitHub, nbviewer and an offline HTML export show them)."""

import html
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WATCHING = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb")
                  if any("%vram watch" in "".join(c["source"]) for c in json.loads(p.read_text())["cells"]
                         if c["cell_type"] == "code"))
FIGURE = re.compile(r"\d+(\.\d+)? (B|KiB|MiB|GiB)\b")


def test_some_committed_notebook_shows_a_monitor():
    assert WATCHING, "no committed notebook has a %vram watch cell"


@pytest.mark.parametrize("path", WATCHING, ids=lambda p: p.name)
@pytest.mark.slow
def test_the_monitor_of_a_committed_notebook_appears_as_text_in_its_html(path):
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(path), as_version=4)
    watch_cells = [c for c in nb.cells if c.cell_type == "code" and "%vram watch" in c.source]
    for cell in watch_cells:
        (out,) = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
        # no widget view: nbconvert would draw the widget from the saved state, which needs its scripts
        assert "application/vnd.jupyter.widget-view+json" not in out.data, list(out.data)
    body, _ = HTMLExporter().from_notebook_node(nb)
    blocks = re.findall(r'<div class="vramlab-monitor-static".*?</svg></div>', body, flags=re.S)
    assert len(blocks) == len(watch_cells), len(blocks)
    for block in blocks:
        text = html.unescape(re.sub(r"<[^>]+>", " ", block))
        # the edition's language
        words = (("RAM do host", "este processo", "parado", "última leitura") if path.parent.name == "pt-BR"
                 else ("host RAM", "this process", "stopped", "last reading"))
        assert all(w in text for w in words), (words, text[:500])
        assert len(FIGURE.findall(text)) >= 3, text[:500]


NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_cell_that_draws_is_committed_with_its_figure(path):
    """A reader on GitHub or nbviewer sees the figures: each code cell that makes a matplotlib
    figure carries a PNG in its committed outputs."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    drawing = [c for c in cells if re.search(r"plt\.subplots|plt\.figure|\.plot_\w*\(|\bplot\w*\(ax", "".join(c["source"]))]
    missing = ["".join(c["source"])[:80] for c in drawing
               if not any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert not missing, missing


def _committed_figures(path):
    """``(cell source, image/png output)`` for every PNG in a committed notebook's outputs."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return [("".join(c["source"]), o) for c in cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_committed_figure_carries_its_labels(path):
    """Each PNG keeps its figure's words (titles, axis labels, legends) in its output metadata,
    as ``import vramlab.lessons`` has the kernel publish them (``vramlab/lessons/figures.py``)."""
    from vramlab.lessons.figures import KEY

    missing = [source[:80] for source, out in _committed_figures(path)
               if not isinstance(out.get("metadata", {}).get("image/png", {}).get(KEY), dict)
               or not isinstance(out["metadata"]["image/png"][KEY].get("axes"), list)]
    assert not missing, f"figures without {KEY} metadata (rebuild the notebook): {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_committed_figure_is_labelled(path):
    """No committed figure leaves its reader guessing what an axis is. For every axes that shows
    something (visible, not ``ax.axis("off")``, with data): both axes are labelled (by their own
    label, by the label of an axes that shares them, or by ``fig.supxlabel``/``supylabel``); an
    axis whose ticks name categories (``bar(names, ...)``, ``set_xticks(positions, words)``) may
    instead go unlabelled under a title (the axes' or the figure's suptitle) when the other axis
    is labelled; a colorbar has its label; no legend entry is blank; and each figure has at least
    one title or label (:func:`vramlab.lessons.figures.label_problems`)."""
    from vramlab.lessons.figures import KEY, label_problems

    problems = []
    for source, out in _committed_figures(path):
        labels = out.get("metadata", {}).get("image/png", {}).get(KEY)
        found = ["no labels in the output's metadata"] if not isinstance(labels, dict) else label_problems(labels)
        problems += [f"{source[:60]!r}: {p}" for p in found]
    assert not problems, "\n".join(problems)
