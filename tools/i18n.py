"""The workbook's translations: one gettext catalog (``.po``, read and written with polib) per
lesson and language, holding the lesson's markdown cells.

    python tools/i18n.py update [NAME ...]    # bring tools/notebooks/pt-BR/NAME.po in step with its source
    python tools/i18n.py check                # list what is missing or stale; exit 1 if anything is
    python tools/i18n.py compile              # vramlab/locale/<lang>/LC_MESSAGES/vramlab.po -> .mo

A lesson has one source, ``tools/notebooks/NAME.py``. Its code cells are shared by every
edition, byte for byte; only markdown cells are translated. Each markdown cell is one catalog
entry whose ``msgid`` is the English cell, so the English text is the key:

- an English cell that changed no longer matches its entry, so its translation is **missing**;
- ``update`` then carries the old translation over to the new ``msgid`` when the two English
  texts are close, and marks it ``fuzzy`` with the ``previous_msgid``, as ``msgmerge`` does: the
  translation is **stale** until a translator checks it and removes the flag;
- the build (``tools/build_notebooks.py --lang pt-BR``) refuses a lesson with a missing or
  fuzzy entry, listing them.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import polib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tools" / "notebooks"
LANGS = ("pt-BR",)
LOCALE = ROOT / "vramlab" / "locale"

__all__ = ["Problems", "catalog_path", "markdown_cells", "update_catalog", "problems", "translate", "compile_locale"]


def _parse(text: str) -> nbformat.NotebookNode:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from build_notebooks import parse
    finally:
        sys.path.pop(0)
    return parse(text)


def catalog_path(lang: str, name: str) -> Path:
    """``tools/notebooks/<lang>/<name>.po``."""
    return SRC / lang / f"{name}.po"


def markdown_cells(name: str) -> list[tuple[int, str]]:
    """``(cell index, source)`` of every markdown cell of the English source ``name``."""
    nb = _parse((SRC / f"{name}.py").read_text())
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def _new_catalog(lang: str, name: str) -> polib.POFile:
    po = polib.POFile(wrapwidth=0)
    po.metadata = {
        "Project-Id-Version": f"vramlab workbook {name}",
        "Language": lang.replace("-", "_"),
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    return po


def update_catalog(lang: str, name: str) -> polib.POFile:
    """Bring the catalog of ``name`` in step with its English source, and save it.

    New English cells get empty entries; a changed cell inherits the translation of the closest
    retired cell, marked fuzzy (stale); retired cells are dropped."""
    path = catalog_path(lang, name)
    old = polib.pofile(str(path), wrapwidth=0) if path.exists() else _new_catalog(lang, name)
    by_id = {e.msgid: e for e in old if not e.obsolete}
    cells = markdown_cells(name)
    wanted = {src for _, src in cells}
    retired = [e for e in old if e.msgid not in wanted and e.msgstr and not e.obsolete]
    po = _new_catalog(lang, name)
    po.metadata.update({k: v for k, v in old.metadata.items() if k not in po.metadata})
    seen: dict[str, polib.POEntry] = {}
    for i, src in cells:
        where = (f"tools/notebooks/{name}.py", f"cell{i}")
        if src in seen:
            seen[src].occurrences.append(where)
            continue
        e = by_id.get(src)
        if e is None:
            e = polib.POEntry(msgid=src, msgstr="")
            best = max(retired, key=lambda r: difflib.SequenceMatcher(None, r.msgid, src).ratio(), default=None)
            if best is not None and difflib.SequenceMatcher(None, best.msgid, src).ratio() > 0.5:
                e.msgstr, e.previous_msgid = best.msgstr, best.msgid
                e.flags = ["fuzzy"]
                retired.remove(best)
        e.occurrences = [where]
        seen[src] = e
        po.append(e)
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(path))
    return po


@dataclass
class Problems:
    """What keeps a lesson's translation from building: English cells (first line shown)."""

    name: str
    lang: str
    missing: list[str] = field(default_factory=list)
    fuzzy: list[str] = field(default_factory=list)
    quotes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.fuzzy or self.quotes)

    def text(self) -> str:
        lines = [f"{self.lang}/{self.name}: {len(self.missing)} missing, {len(self.fuzzy)} stale (fuzzy)"]
        lines += [f"  missing: {m}" for m in self.missing] + [f"  stale:   {f}" for f in self.fuzzy]
        lines += [f"  quotes:  {q} (the translation must quote the same {{{{ ... }}}} values, in order)"
                  for q in self.quotes]
        return "\n".join(lines)


_QUOTES = re.compile(r"\{\{\s*(.+?)\s*\}\}")  # the build's quoted values (tools/build_notebooks.py)


def _first_line(src: str) -> str:
    line = src.strip().splitlines()[0] if src.strip() else "(empty cell)"
    return line if len(line) <= 90 else line[:87] + "..."


def problems(lang: str, name: str) -> Problems:
    """The English cells of ``name`` with no translation, or only a stale (fuzzy) one."""
    path = catalog_path(lang, name)
    entries = {e.msgid: e for e in polib.pofile(str(path), wrapwidth=0) if not e.obsolete} if path.exists() else {}
    out = Problems(name, lang)
    for _, src in markdown_cells(name):
        e = entries.get(src)
        if e is None or not e.msgstr.strip():
            out.missing.append(_first_line(src))
        elif "fuzzy" in e.flags:
            out.fuzzy.append(_first_line(src))
        elif _QUOTES.findall(e.msgstr) != _QUOTES.findall(src):
            out.quotes.append(_first_line(src))
    return out


class TranslationError(ValueError):
    """A lesson's translation is missing or stale."""


def translate(nb: nbformat.NotebookNode, lang: str, name: str) -> nbformat.NotebookNode:
    """``nb`` (the parsed English source) with its markdown cells in ``lang``; code cells untouched.

    Raises:
        TranslationError: listing the missing and stale cells.
    """
    found = problems(lang, name)
    if found:
        raise TranslationError(found.text())
    entries = {e.msgid: e.msgstr for e in polib.pofile(str(catalog_path(lang, name)), wrapwidth=0)}
    for c in nb.cells:
        if c.cell_type == "markdown":
            c.source = entries[c.source]
    nb.metadata["language"] = lang
    return nb


def compile_locale() -> list[Path]:
    """Compile every ``vramlab/locale/*/LC_MESSAGES/vramlab.po`` into its ``.mo`` (for the
    runtime's strings: :mod:`vramlab.i18n`)."""
    out = []
    for po_path in sorted(LOCALE.glob("*/LC_MESSAGES/vramlab.po")):
        mo = po_path.with_suffix(".mo")
        polib.pofile(str(po_path)).save_as_mofile(str(mo))
        out.append(mo)
    return out


def _names(argv: list[str]) -> list[str]:
    return argv or sorted(p.stem for p in SRC.glob("*.py"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("update", "check", "compile"):
        print("usage: python tools/i18n.py update|check|compile [NAME ...]", file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "compile":
        for mo in compile_locale():
            print(f"wrote {mo.relative_to(ROOT)}")
        return 0
    bad = 0
    for lang in LANGS:
        for name in _names(rest):
            if cmd == "update":
                update_catalog(lang, name)
            found = problems(lang, name)
            print(found.text() if found else f"{lang}/{name}: complete")
            bad += bool(found)
    return 1 if bad and cmd == "check" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
