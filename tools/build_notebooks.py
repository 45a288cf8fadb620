"""Build the workbook's notebooks from their percent-format sources, and execute them.

    python tools/build_notebooks.py              # every source in tools/notebooks/
    python tools/build_notebooks.py 00_start_here
    python tools/build_notebooks.py --lang pt-BR 00_start_here   # the Brazilian Portuguese edition

A source is a Python file in jupytext's percent format: cells start with ``# %%`` (code)
or ``# %% [markdown]`` (markdown; each line starts with ``# ``), and a cell may carry
metadata such as ``# %% tags=["raises-exception"]``. The notebook is written to
``notebooks/<name>.ipynb``, executed top to bottom in a fresh kernel, and saved with its
outputs, as the workbook is committed.

``--lang pt-BR`` builds the same source with its markdown cells taken from the lesson's gettext
catalog, ``tools/notebooks/pt-BR/<name>.po`` (``tools/i18n.py``), into
``notebooks/pt-BR/<name>.ipynb``, executed there. The code cells are the English edition's with
their comments translated; run from that folder, what they print and draw speaks Portuguese
(``vramlab.i18n.tr``). A missing or stale (fuzzy) translation stops the build, listing the cells.

An exercise's solution is a code cell tagged ``solution`` (``# %% tags=["solution"]``) right after
the markdown cell that holds the exercise's ``<details>`` block. The build runs it with the rest,
so every solution is checked in every build, then folds it into that collapsed block: its code
and what it printed, between ``<!-- vramlab:solution -->`` markers. The committed notebook has
no executed cell under a question, and nbval never re-runs a solution.

Prose that quotes a measured number reads it from the run: ``{{ expr }}`` or ``{{ expr | .1f }}``
in a markdown cell is the value of ``expr`` (formatted with the spec) in the kernel, at the moment
the cells above it have run. The build evaluates it in a cell of its own, inserted before that
markdown cell and removed after the run, and keeps the template and the values in the cell's
metadata (``vramlab.template``, ``vramlab.quotes``), so a test can check that the source is
unchanged and that each quoted value was printed above it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tools" / "notebooks"
OUT = ROOT / "notebooks"


def parse(text: str) -> nbformat.NotebookNode:
    """Read a percent-format source with jupytext; the notebook gets a plain Python 3 kernelspec."""
    nb = jupytext.reads(text, fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


SOLUTION_TAG = "solution"
SOLUTION_OPEN, SOLUTION_CLOSE = "<!-- vramlab:solution -->", "<!-- /vramlab:solution -->"
_SOLUTION_WORDS = {
    "en": ("The code (paste it into a new cell at the end of the notebook to run it):",
           "What it printed when the workbook was built:"),
    "pt-BR": ("O código (cole-o numa célula nova no fim do notebook para rodá-lo):",
              "O que ele imprimiu quando o workbook foi construído:"),
}


def _stream_text(cell: nbformat.NotebookNode) -> str:
    """What an executed code cell printed (its stdout and stderr streams, in order)."""
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def is_solution(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def fold_solutions(nb: nbformat.NotebookNode, lang: str = "en") -> nbformat.NotebookNode:
    """Move each executed ``solution`` cell, code and printed text, into the ``<details>`` block above it.

    Raises:
        ValueError: a solution cell has no ``<details>`` block above it, or it raised.
    """
    code_words, printed_words = _SOLUTION_WORDS[lang]
    cells: list[nbformat.NotebookNode] = []
    for cell in nb.cells:
        if not is_solution(cell):
            cells.append(cell)
            continue
        target = next((c for c in reversed(cells) if c.cell_type == "markdown" and "</details>" in c.source), None)
        if target is None:
            raise ValueError(f"a solution cell without a <details> block above it: {cell.source[:60]!r}")
        if any(o.output_type == "error" for o in cell.get("outputs", [])):
            raise ValueError(f"a solution cell raised: {cell.source[:60]!r}")
        printed = _stream_text(cell).rstrip()
        block = f"{SOLUTION_OPEN}\n*{code_words}*\n\n```python\n{cell.source.rstrip()}\n```\n\n"
        if printed:
            block += f"*{printed_words}*\n\n```text\n{printed}\n```\n\n"
        block += f"{SOLUTION_CLOSE}\n\n"
        head, sep, tail = target.source.rpartition("</details>")
        target.source = head + block + sep + tail
    nb.cells = cells
    return nb


def committed_view(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """The cells as a source gives them: folded solutions taken out of the markdown, solution cells dropped.

    A committed notebook and its parsed source have the same view (``tests/test_build_notebooks.py``).
    """
    fold = re.compile(re.escape(SOLUTION_OPEN) + ".*?" + re.escape(SOLUTION_CLOSE) + "\n\n", re.S)

    def source(c: nbformat.NotebookNode) -> str:
        if c.cell_type != "markdown":
            return c.source
        return fold.sub("", c.get("metadata", {}).get("vramlab", {}).get("template", c.source))

    return [(c.cell_type, source(c)) for c in nb.cells if not is_solution(c)]


def folded_solutions(nb: nbformat.NotebookNode) -> list[str]:
    """The code of every solution folded into a committed notebook's markdown, in order."""
    pat = re.compile(re.escape(SOLUTION_OPEN) + r"\n\*[^\n]*\*\n\n```python\n(.*?)\n```", re.S)
    return [m.group(1) for c in nb.cells if c.cell_type == "markdown" for m in pat.finditer(c.source)]


QUOTE = re.compile(r"\{\{\s*(.+?)\s*\}\}")
_QUOTE_MARK = "vramlab-quotes:"


def _quote_parts(placeholder: str) -> tuple[str, str]:
    expr, _, spec = placeholder.partition(" | ")
    return expr.strip(), spec.strip()


def insert_quote_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Before each markdown cell with ``{{ ... }}``, a code cell that prints the quoted values as JSON."""
    cells: list[nbformat.NotebookNode] = []
    for cell in nb.cells:
        found = QUOTE.findall(cell.source) if cell.cell_type == "markdown" else []
        if found:
            pairs = [_quote_parts(f) for f in found]
            code = ("import json as _vq_json\n"
                    f"print({_QUOTE_MARK!r} + _vq_json.dumps([format(eval(e), f) for e, f in {pairs!r}]))\n"
                    "del _vq_json")
            cells.append(nbformat.v4.new_code_cell(code, metadata={"tags": ["vramlab-quote"]}))
        cells.append(cell)
    nb.cells = cells
    return nb


_NUMBER = re.compile(r"\d[\d,]*\.?\d*")


def local_number(value: str, lang: str) -> str:
    """``value`` with its numbers written as the edition writes them in prose: in pt-BR the decimal
    separator is a comma and the thousands one a point (``docs/pt-BR/termos.md``); outputs keep
    Python's."""
    if lang != "pt-BR":
        return value
    return _NUMBER.sub(lambda m: m.group(0).translate(str.maketrans(",.", ".,")), value)


def fill_quotes(nb: nbformat.NotebookNode, lang: str = "en") -> nbformat.NotebookNode:
    """Put each quote cell's values into the markdown cell after it, then drop the quote cells.

    Raises:
        ValueError: a quoted expression failed in the kernel.
    """
    cells: list[nbformat.NotebookNode] = []
    values: list[str] | None = None
    for cell in nb.cells:
        if cell.cell_type == "code" and "vramlab-quote" in cell.get("metadata", {}).get("tags", []):
            text = _stream_text(cell)
            line = next((ln for ln in text.splitlines() if ln.startswith(_QUOTE_MARK)), None)
            if line is None:
                errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
                          if o.output_type == "error"]
                raise ValueError(f"a quote in the prose failed: {cell.source.splitlines()[1]} {errors}")
            import json

            values = [local_number(v, lang) for v in json.loads(line[len(_QUOTE_MARK):])]
            continue
        if values is not None and cell.cell_type == "markdown":
            template = cell.source
            found = QUOTE.findall(template)
            cell.source = fill(template, values)
            cell.metadata.setdefault("vramlab", {})
            cell.metadata["vramlab"]["template"] = template
            cell.metadata["vramlab"]["quotes"] = [[f, v] for f, v in zip(found, values)]
            values = None
        cells.append(cell)
    count = 0
    for cell in cells:  # number the cells the reader sees without gaps
        if cell.cell_type == "code" and cell.get("execution_count") is not None:
            count += 1
            cell.execution_count = count
            for o in cell.outputs:
                if o.output_type == "execute_result":
                    o.execution_count = count
    nb.cells = cells
    return nb


def fill(template: str, values: list[str]) -> str:
    """``template`` with its ``{{ ... }}`` placeholders replaced, in order, by ``values``."""
    it = iter(values)
    return QUOTE.sub(lambda _: next(it), template)


def build(name: str, timeout: int = 600, lang: str = "en") -> float:
    nb = parse((SRC / f"{name}.py").read_text())
    out = OUT
    if lang != "en":
        sys.path.insert(0, str(ROOT / "tools"))
        from i18n import translate

        nb = translate(nb, lang, name)  # TranslationError: what is missing or stale
        out = OUT / lang
    out.mkdir(exist_ok=True)
    insert_quote_cells(nb)
    t0 = time.perf_counter()
    # the kernel draws figures inline (a non-interactive MPLBACKEND such as CI's Agg would leave
    # every plot cell of the committed notebook empty)
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()
    except Exception:
        failed = ROOT / "artifacts" / f"{name}{'' if lang == 'en' else '.' + lang}.failed.ipynb"
        failed.parent.mkdir(exist_ok=True)
        nbformat.write(nb, failed)
        print(f"{name}: FAILED; the partly executed notebook is in {failed.relative_to(ROOT)}")
        raise
    dt = time.perf_counter() - t0
    fold_solutions(nb, lang)
    fill_quotes(nb, lang)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:03d}"
    nbformat.write(nb, out / f"{name}.ipynb")
    return dt


def main(argv: list[str]) -> int:
    lang = "en"
    if argv[:1] == ["--lang"]:
        if len(argv) < 2:
            print("usage: python tools/build_notebooks.py [--lang pt-BR] [NAME ...]")
            return 2
        lang, argv = argv[1], argv[2:]
    names = argv or sorted(p.stem for p in SRC.glob("*.py"))
    for n in names:
        dt = build(n, lang=lang)
        print(f"{n}{'' if lang == 'en' else ' (' + lang + ')'}: executed in {dt:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
