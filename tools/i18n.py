"""The workbook's translations: one gettext catalog (``.po``, read and written with polib) per
lesson and language, holding the lesson's markdown cells.

    python tools/i18n.py update [NAME ...]    # bring tools/notebooks/pt-BR/NAME.po in step with its source
    python tools/i18n.py check                # list what is missing or stale; exit 1 if anything is
    python tools/i18n.py compile              # vramlab/locale/<lang>/LC_MESSAGES/vramlab.po -> .mo

A lesson has one source, ``tools/notebooks/NAME.py``. Its code is shared by every edition; what
a learner reads is translated:

- each markdown cell is one catalog entry whose ``msgid`` is the English cell;
- each comment in a code cell (a run of full-line comments at one indentation, or a comment after
  code) is one entry with the context ``code comment`` (:data:`COMMENT_CONTEXT`), whose ``msgid``
  is the comment's text without its ``#`` marks. The translated code cell differs from the
  English one in its comments only (:func:`strip_comments` of both is the same code);
- what the code prints and draws speaks the edition's language at run time, through
  ``vramlab.i18n.tr`` and the runtime catalog (``tools/extract_runtime_strings.py`` reads the
  lessons' ``tr("...")`` calls too).

The English text is the key of every entry:

- an English cell that changed no longer matches its entry, so its translation is **missing**;
- ``update`` then carries the old translation over to the new ``msgid`` when the two English
  texts are close, and marks it ``fuzzy`` with the ``previous_msgid``, as ``msgmerge`` does: the
  translation is **stale** until a translator checks it and removes the flag;
- the build (``tools/build_notebooks.py --lang pt-BR``) refuses a lesson with a missing or
  fuzzy entry, listing them.
"""

from __future__ import annotations

import difflib
import io
import re
import tokenize
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import polib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tools" / "notebooks"
LANGS = ("pt-BR",)
LOCALE = ROOT / "vramlab" / "locale"

__all__ = ["COMMENT_CONTEXT", "Problems", "catalog_path", "markdown_cells", "code_comments", "comment_units",
           "translate_comments", "strip_comments", "update_catalog", "problems", "translate", "compile_locale"]

#: the ``msgctxt`` of a code cell's comment in a lesson's catalog
COMMENT_CONTEXT = "code comment"
#: comments that are instructions to a tool, not words for the learner: never translated
_PRAGMAS = re.compile(r"#\s*(NBVAL_|noqa|type:|pragma|fmt:|%%)")


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


@dataclass
class CommentUnit:
    """One translatable comment of a code cell: a run of full-line comments at one indentation
    (``rows``, 0-based, consecutive) or one comment after code (``trailing``)."""

    rows: list[int]
    col: int
    trailing: bool
    text: str


def _comment_tokens(source: str) -> list[tuple[int, int, str]]:
    """``(row, column, token)`` of each ``#`` comment of a code cell (0-based rows); magics and
    shell escapes are read as the tokenizer reads them, which never mistakes a ``#`` in a string."""
    found: list[tuple[int, int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found.append((tok.start[0] - 1, tok.start[1], tok.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        lines = source.split("\n")
        found = [(i, len(ln) - len(ln.lstrip()), ln.strip()) for i, ln in enumerate(lines) if ln.lstrip().startswith("#")]
    return [t for t in found if not _PRAGMAS.match(t[2])]


def _comment_text(token: str) -> str:
    body = token[1:]
    return body[1:] if body.startswith(" ") else body


def comment_units(source: str) -> list[CommentUnit]:
    """The translatable comments of a code cell, in order."""
    lines = source.split("\n")
    units: list[CommentUnit] = []
    for row, col, tok in _comment_tokens(source):
        trailing = bool(lines[row][:col].strip())
        last = units[-1] if units else None
        if (not trailing and last is not None and not last.trailing and last.col == col
                and last.rows[-1] == row - 1):
            last.rows.append(row)
            last.text += "\n" + _comment_text(tok)
        else:
            units.append(CommentUnit([row], col, trailing, _comment_text(tok)))
    return units


def code_comments(name: str) -> list[tuple[int, str]]:
    """``(cell index, comment text)`` of every translatable comment in the code cells of ``name``."""
    nb = _parse((SRC / f"{name}.py").read_text())
    return [(i, u.text) for i, c in enumerate(nb.cells) if c.cell_type == "code" for u in comment_units(c.source)]


def _as_comment(text: str) -> str:
    return "#" + (" " + text if text else "")


def translate_comments(source: str, comments: dict[str, str]) -> str:
    """``source`` (a code cell) with each comment replaced by its translation in ``comments``
    (English text -> translated text); a comment without one is left as it is."""
    lines = source.split("\n")
    for u in reversed(comment_units(source)):
        new = comments.get(u.text)
        if new is None:
            continue
        if u.trailing:
            row = u.rows[0]
            lines[row] = lines[row][:u.col] + _as_comment(" ".join(new.split("\n")))
        else:
            indent = lines[u.rows[0]][:u.col]
            lines[u.rows[0]:u.rows[-1] + 1] = [indent + _as_comment(t) for t in new.split("\n")]
    return "\n".join(lines)


def strip_comments(source: str) -> str:
    """``source`` without its translatable comments (and without the lines they leave empty):
    the code an edition must share with the English one."""
    lines = source.split("\n")
    for u in reversed(comment_units(source)):
        if u.trailing:
            lines[u.rows[0]] = lines[u.rows[0]][:u.col].rstrip()
        else:
            del lines[u.rows[0]:u.rows[-1] + 1]
    return "\n".join(lines)


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


def _key(e: polib.POEntry) -> tuple[str, str]:
    return (e.msgctxt or "", e.msgid)


def _wanted(name: str) -> list[tuple[str, int, str]]:
    """``(context, cell index, English text)`` of every entry the catalog of ``name`` needs."""
    return ([("", i, src) for i, src in markdown_cells(name)]
            + [(COMMENT_CONTEXT, i, text) for i, text in code_comments(name)])


def update_catalog(lang: str, name: str) -> polib.POFile:
    """Bring the catalog of ``name`` in step with its English source, and save it.

    New English cells and comments get empty entries; a changed one inherits the translation of
    the closest retired entry of its kind, marked fuzzy (stale); retired entries are dropped."""
    path = catalog_path(lang, name)
    old = polib.pofile(str(path), wrapwidth=0) if path.exists() else _new_catalog(lang, name)
    by_key = {_key(e): e for e in old if not e.obsolete}
    wanted = _wanted(name)
    keys = {(ctx, src) for ctx, _, src in wanted}
    retired = [e for e in old if _key(e) not in keys and e.msgstr and not e.obsolete]
    po = _new_catalog(lang, name)
    po.metadata.update({k: v for k, v in old.metadata.items() if k not in po.metadata})
    seen: dict[tuple[str, str], polib.POEntry] = {}
    for ctx, i, src in wanted:
        where = (f"tools/notebooks/{name}.py", f"cell{i}")
        if (ctx, src) in seen:
            seen[(ctx, src)].occurrences.append(where)
            continue
        e = by_key.get((ctx, src))
        if e is None:
            e = polib.POEntry(msgid=src, msgstr="", msgctxt=ctx or None)
            same_kind = [r for r in retired if (r.msgctxt or "") == ctx]
            best = max(same_kind, key=lambda r: difflib.SequenceMatcher(None, r.msgid, src).ratio(), default=None)
            if best is not None and difflib.SequenceMatcher(None, best.msgid, src).ratio() > 0.5:
                e.msgstr, e.previous_msgid = best.msgstr, best.msgid
                e.flags = ["fuzzy"]
                retired.remove(best)
        e.occurrences = [where]
        seen[(ctx, src)] = e
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


def _entries(lang: str, name: str) -> dict[tuple[str, str], polib.POEntry]:
    path = catalog_path(lang, name)
    return {_key(e): e for e in polib.pofile(str(path), wrapwidth=0) if not e.obsolete} if path.exists() else {}


def problems(lang: str, name: str) -> Problems:
    """The English cells and comments of ``name`` with no translation, or only a stale (fuzzy) one."""
    entries = _entries(lang, name)
    out = Problems(name, lang)
    for ctx, _, src in _wanted(name):
        e = entries.get((ctx, src))
        shown = _first_line(src) if not ctx else f"# {_first_line(src)}"
        if e is None or not e.msgstr.strip():
            out.missing.append(shown)
        elif "fuzzy" in e.flags:
            out.fuzzy.append(shown)
        elif _QUOTES.findall(e.msgstr) != _QUOTES.findall(src):
            out.quotes.append(shown)
    return out


class TranslationError(ValueError):
    """A lesson's translation is missing or stale."""


def translate(nb: nbformat.NotebookNode, lang: str, name: str) -> nbformat.NotebookNode:
    """``nb`` (the parsed English source) with its markdown cells and code comments in ``lang``.

    Raises:
        TranslationError: listing the missing and stale cells.
    """
    found = problems(lang, name)
    if found:
        raise TranslationError(found.text())
    entries = _entries(lang, name)
    comments = {src: e.msgstr for (ctx, src), e in entries.items() if ctx == COMMENT_CONTEXT}
    for c in nb.cells:
        if c.cell_type == "markdown":
            c.source = entries[("", c.source)].msgstr
        elif c.cell_type == "code":
            c.source = translate_comments(c.source, comments)
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
