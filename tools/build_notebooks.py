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
``notebooks/pt-BR/<name>.ipynb``, executed there. The code cells are the English edition's. A
missing or stale (fuzzy) translation stops the build, listing the cells.
"""

from __future__ import annotations

import os
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


def build(name: str, timeout: int = 600, lang: str = "en") -> float:
    nb = parse((SRC / f"{name}.py").read_text())
    out = OUT
    if lang != "en":
        sys.path.insert(0, str(ROOT / "tools"))
        from i18n import translate

        nb = translate(nb, lang, name)  # TranslationError: what is missing or stale
        out = OUT / lang
    out.mkdir(exist_ok=True)
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
