"""The English strings passed to ``vramlab.i18n.tr`` (string literals, concatenated) by vramlab
and by the lessons' code cells (``tools/notebooks/*.py``: what a lesson prints and draws), for
the runtime catalog ``vramlab/locale/<lang>/LC_MESSAGES/vramlab.po``.

    python tools/extract_runtime_strings.py            # list them
    python tools/extract_runtime_strings.py --update   # add missing ones to each catalog (empty)
    python tools/extract_runtime_strings.py --check    # every tr() call passes the fields its message names
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import polib

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "vramlab"

LESSONS = ROOT / "tools" / "notebooks"


def _calls(tree: ast.AST) -> list[tuple[str, int]]:
    """``(message, line)`` of every call ``tr("literal", ...)`` or ``N_("literal")`` in ``tree``."""
    return [(node.args[0].value, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("tr", "N_")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


def lesson_cells() -> list[tuple[str, int, str]]:
    """``(lesson, cell index, Python source)`` of every code cell of the lessons, their IPython
    syntax (magics, shell escapes) turned into Python as IPython does."""
    from IPython.core.inputtransformer2 import TransformerManager

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from build_notebooks import parse
    finally:
        sys.path.pop(0)
    out = []
    for path in sorted(LESSONS.glob("*.py")):
        for i, c in enumerate(parse(path.read_text()).cells):
            if c.cell_type == "code":
                out.append((path.stem, i, TransformerManager().transform_cell(c.source)))
    return out


def tr_strings() -> dict[str, list[str]]:
    """Every literal first argument of a call to ``tr`` in the package and in the lessons' code
    cells, with where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for msg, line in _calls(ast.parse(path.read_text(), str(path))):
            found.setdefault(msg, []).append(f"{path.relative_to(ROOT)}:{line}")
    for lesson, cell, source in lesson_cells():
        for msg, _line in _calls(ast.parse(source, f"{lesson} cell {cell}")):
            found.setdefault(msg, []).append(f"tools/notebooks/{lesson}.py:cell{cell}")
    sys.path.insert(0, str(ROOT))
    from vramlab.model import DEVICE_LAYERS, HOST_LAYERS

    for label in (*HOST_LAYERS.values(), *DEVICE_LAYERS.values()):  # shown through tr() by the displays
        found.setdefault(label, []).append("layer labels (vramlab.model)")
    return found


def _fields(message: str) -> set[str]:
    import string

    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(message) if name}


def call_problems() -> list[str]:
    """Calls of ``tr`` in the lessons' code cells and in the package whose literal message names
    fields that the call does not pass, or passes fields the message does not name (a call with
    ``**kwargs`` is not judged)."""
    out = []
    sources = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted(PKG.rglob("*.py"))]
    sources += [(f"tools/notebooks/{lesson}.py cell {cell}", src) for lesson, cell, src in lesson_cells()]
    for where, src in sources:
        for node in ast.walk(ast.parse(src)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tr"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                continue
            if any(k.arg is None for k in node.keywords):
                continue
            given = {k.arg for k in node.keywords if k.arg}
            wanted = _fields(node.args[0].value)
            if given != wanted:
                out.append(f"{where}:{node.lineno}: {node.args[0].value!r} names {sorted(wanted)}, "
                           f"the call passes {sorted(given)}")
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        found = call_problems()
        print("\n".join(found) or "every tr() call passes the fields its message names")
        return 1 if found else 0
    strings = tr_strings()
    if "--update" not in argv:
        for s, where in strings.items():
            print(f"{where[0]}: {s}")
        return 0
    for po_path in sorted((PKG / "locale").glob("*/LC_MESSAGES/vramlab.po")):
        po = polib.pofile(str(po_path), wrapwidth=0)
        have = {e.msgid for e in po}
        for s, where in strings.items():
            if s not in have:
                po.append(polib.POEntry(msgid=s, msgstr="", occurrences=[(w, "") for w in where]))
        po.save(str(po_path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
