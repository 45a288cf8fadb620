"""tools/build_notebooks.py: every committed notebook is its jupytext source, executed.

The sources in ``tools/notebooks/`` are the only place a lesson is edited; this test fails
when a notebook in ``notebooks/`` was edited by hand or not rebuilt after its source changed.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from tool_modules import load_tool

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "tools" / "notebooks").glob("*.py"))


def _builder():
    return load_tool("build_notebooks")


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    built = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert built == [p.stem for p in SOURCES]
    assert [p.stem[:3] for p in SOURCES] == [f"{i:02d}_" for i in range(len(SOURCES))]  # lessons 00, 01, ... in order
    assert len(SOURCES) == 11


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_its_source_executed(src):
    parsed = _builder().parse(src.read_text())
    nb = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
    assert [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in parsed.cells]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "committed without running every cell"
