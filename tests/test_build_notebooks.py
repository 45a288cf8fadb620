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
    assert len(SOURCES) == 13


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_its_source_executed(src):
    build = _builder()
    parsed = build.parse(src.read_text())
    nb = nbformat.read(ROOT / "notebooks" / f"{src.stem}.ipynb", as_version=4)
    assert build.committed_view(nb) == build.committed_view(parsed)
    # each solution is folded, code unchanged, into the collapsed block above it
    assert build.folded_solutions(nb) == [c.source.rstrip() for c in parsed.cells if build.is_solution(c)]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "committed without running every cell"


def _exercises_heading(cell) -> bool:
    return cell.cell_type == "markdown" and any(
        line.strip() in ("## Exercises", "## Exercícios") for line in cell.source.splitlines())


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("**/*.ipynb")),
                         ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_no_executed_cell_answers_an_exercise(path):
    """Solutions sit collapsed in <details>, never as an executed cell under the question."""
    build = _builder()
    nb = nbformat.read(path, as_version=4)
    at = [i for i, c in enumerate(nb.cells) if _exercises_heading(c)]
    assert at, "a lesson without its exercises"
    after = nb.cells[at[-1]:]
    assert not [c for c in after if c.cell_type == "code"], "an executed cell under the exercises"
    assert not [c for c in nb.cells if build.is_solution(c)]
    for c in after:
        if build.SOLUTION_OPEN in c.source:  # a folded solution is inside the collapsed block
            assert c.source.index("<details>") < c.source.index(build.SOLUTION_OPEN) < c.source.rindex("</details>")


def test_a_solution_is_folded_with_what_it_printed():
    build = _builder()
    nb = build.parse("# %% [markdown]\n# ## Exercises\n#\n# <details><summary>Solutions</summary>\n#\n"
                     "# 1. The code below.\n#\n# </details>\n\n# %% tags=[\"solution\"]\nprint(6 * 7)\n")
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    folded = build.fold_solutions(nb, "en")
    assert [c.cell_type for c in folded.cells] == ["markdown"]
    md = folded.cells[0].source
    assert "```python\nprint(6 * 7)\n```" in md and "```text\n42\n```" in md
    assert md.index(build.SOLUTION_OPEN) < md.index("</details>")
    assert build.folded_solutions(folded) == ["print(6 * 7)"]
    nb.cells.append(nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["solution"]}))
    nb.cells[-1].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="", traceback=[])]
    with pytest.raises(ValueError, match="raised"):
        build.fold_solutions(nb, "en")


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream") + "".join(
        o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", []) if o.output_type == "execute_result")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("**/*.ipynb")),
                         ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_the_numbers_the_prose_quotes_are_the_ones_printed_above_it(path):
    build = _builder()
    nb = nbformat.read(path, as_version=4)
    above = ""
    for cell in nb.cells:
        if cell.cell_type == "code":
            above += _printed(cell)
            continue
        meta = cell.get("metadata", {}).get("vramlab", {})
        assert not build.QUOTE.search(cell.source), "a placeholder left in the committed prose"
        if "quotes" not in meta:
            continue
        values = [v for _, v in meta["quotes"]]
        assert build.fill(meta["template"], values) == cell.source
        lang = "pt-BR" if path.parent.name == "pt-BR" else "en"
        for placeholder, value in meta["quotes"]:
            printed = build.local_number(value, lang)  # swapping the separators twice gives the output's
            assert printed in above, f"the prose quotes {value} ({placeholder}), which no cell above it printed"


def test_a_quote_is_filled_from_its_own_cell_and_the_cell_removed():
    build = _builder()
    nb = build.parse("# %%\nx = 3.14159\nprint(f'{x:.2f}')\n\n# %% [markdown]\n# pi is {{ x | .2f }}, "
                     "not {{ x * 2 | .1f }}\n")
    build.insert_quote_cells(nb)
    assert [c.cell_type for c in nb.cells] == ["code", "code", "markdown"]
    ns: dict = {}
    for cell in nb.cells[:2]:  # run the cells as a kernel would, capturing what they print
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(cell.source, ns)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=buf.getvalue())]
        cell.execution_count = 1
    build.fill_quotes(nb)
    assert [c.cell_type for c in nb.cells] == ["code", "markdown"]
    assert nb.cells[1].source == "pi is 3.14, not 6.3"
    assert nb.cells[1].metadata["vramlab"]["template"] == "pi is {{ x | .2f }}, not {{ x * 2 | .1f }}"
    assert build.committed_view(nb) == [("code", nb.cells[0].source), ("markdown", "pi is {{ x | .2f }}, not {{ x * 2 | .1f }}")]


def _reading_minutes(src: Path) -> int:
    """The road map's rule: prose at 150 words a minute, code at 25 lines a minute, a minute per prediction,
    rounded up to five minutes."""
    import math
    import re

    nb = _builder().parse(src.read_text())
    words = sum(len(re.findall(r"\w+", c.source)) for c in nb.cells if c.cell_type == "markdown")
    code = sum(len(c.source.splitlines()) for c in nb.cells if c.cell_type == "code")
    predictions = sum(c.source.count("**Predict.**") + c.source.count("**Question.**")
                      for c in nb.cells if c.cell_type == "markdown")
    return 5 * math.ceil((words / 150 + code / 25 + predictions) / 5)


def test_the_road_map_lists_every_lesson_with_its_reading_time_from_its_word_count():
    import re

    road_map = (ROOT / "tools" / "notebooks" / "00_start_here.py").read_text()
    rows = dict(re.findall(r"^# \| (\d\d) [^\n]*\| (\d+) min \|$", road_map, re.M))
    assert sorted(rows) == [p.stem[:2] for p in SOURCES], "a lesson missing from the road map"
    stated = {k: int(v) for k, v in rows.items()}
    assert stated == {p.stem[:2]: _reading_minutes(p) for p in SOURCES}
    translated = (ROOT / "tools" / "notebooks" / "pt-BR" / "00_start_here.po").read_text()
    assert {k: int(v) for k, v in re.findall(r'^"\| (\d\d) [^\n]*\| (\d+) min \|\\n"$', translated, re.M)} == stated


def test_numbers_in_the_portuguese_prose_use_the_decimal_comma():
    build = _builder()
    assert build.local_number("1,024.50 MiB", "pt-BR") == "1.024,50 MiB"
    assert build.local_number("98.01 GiB", "pt-BR") == "98,01 GiB"
    assert build.local_number("98.01 GiB", "en") == "98.01 GiB"
    assert build.local_number(build.local_number("12.3", "pt-BR"), "pt-BR") == "12.3"
