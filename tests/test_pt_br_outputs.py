"""The Portuguese edition speaks Portuguese in what its cells print and draw, not only in its prose.

A line of output "has words" when it holds a word that is neither a number, a unit, an identifier
(``snake_case``, ``dotted.names``, ``calls()``) nor code in backticks. Such a line must hold a
Portuguese word and no English function word ("the", "of", "and", ...). The two vocabularies come
from the project's own catalogs: a word that the Portuguese translations use and the English
sources never do is Portuguese; a word of the English sources that no translation uses is English.
Words both use (batch, GPU, offload) count for neither.

A cell that shows a tool's own output (``ps``, ``top``, ``free``, ``nvidia-smi``, memory_profiler's
``%memit``) is tagged ``quotes-tool-output``: its lines are the tool's words, exempt here. Such a
cell holds no words of the lesson's own, which the lesson prints in another cell.

Each figure of the edition carries its labels in its PNG's metadata (``vramlab.lessons.figures``):
every label with words follows the same rule, and every figure has a Portuguese label.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import nbformat
import polib
import pytest

ROOT = Path(__file__).resolve().parent.parent
PT_NOTEBOOKS = sorted((ROOT / "notebooks" / "pt-BR").glob("*.ipynb"))
CATALOGS = sorted((ROOT / "tools" / "notebooks" / "pt-BR").glob("*.po")) + [
    ROOT / "vramlab" / "locale" / "pt_BR" / "LC_MESSAGES" / "vramlab.po"]
TOOL_TAG = "quotes-tool-output"
TOOLS = ("ps", "top", "free", "nvidia-smi", "memit")
LABELS_KEY = "vramlab/labels"

#: English words that are never Portuguese: one of them marks a line as (partly) English
ENGLISH_FUNCTION_WORDS = frozenset(
    "the and of is are to with from after before when which this that was were not than its it by "
    "on in at be been has have will would can could each only still into over under".split())

_WORD = re.compile(r"(?<![\w./\\=-])[A-Za-zÀ-ÿ]{2,}(?![\w./(\\=-])")
_CODE = re.compile(r"```.*?```|`[^`]*`|%%?vram(?: [a-z]+)*", re.S)  # code blocks, inline code, magics


def words(text: str) -> list[str]:
    """The words of ``text``, lower case: no numbers, units glued to numbers, identifiers or code."""
    return [w.lower() for w in _WORD.findall(_CODE.sub(" ", text)) if not (w[1:].lower() != w[1:] and w.upper() != w)]


@lru_cache(maxsize=None)
def vocabularies() -> tuple[frozenset[str], frozenset[str]]:
    """(Portuguese words, English words), read from the catalogs' translations and their English keys."""
    pt: set[str] = set()
    en: set[str] = set()
    fields_and_quotes = re.compile(r"\{[^{}]*\}|\"[^\"\n]*\"|“[^”]*”")  # str.format fields; quoted English
    for path in CATALOGS:
        for e in polib.pofile(str(path)):
            pt.update(words(fields_and_quotes.sub(" ", e.msgstr)))
            en.update(words(fields_and_quotes.sub(" ", e.msgid)))
    return frozenset(pt - en), frozenset(en - pt)


def english(line: str) -> bool:
    """Whether ``line`` speaks English: an English function word, or English words and no Portuguese one."""
    ws = words(line)
    pt, en = vocabularies()
    if any(w in ENGLISH_FUNCTION_WORDS for w in ws):
        return True
    return any(w in en for w in ws) and not any(w in pt for w in ws)


def printed_lines(cell: nbformat.NotebookNode) -> list[str]:
    """What a code cell shows as text: its streams, and the plain text of results that have no richer form."""
    out: list[str] = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out += o.text.splitlines()
        elif o.output_type in ("execute_result", "display_data"):
            data = o.get("data", {})
            if set(data) == {"text/plain"}:
                out += data["text/plain"].splitlines()
    return out


def test_the_classifier_tells_the_languages_apart():
    assert english("batch 1: peak 14.23 MiB, it fits")
    assert english("variance falls 16.5x from B=16 to B=256 (nenhum palpite dado)")
    assert not english("batch 1: pico 14.23 MiB, cabe")
    assert not english("fp32  16.06 MiB  `torch.float32`  A100-80GB")  # no words: nothing to judge
    assert words("vramlab.snapshot() peak_delta MiB GiB/s 3.2x the peak") == ["the", "peak"]
    assert not english("o de 4 -> 8 é x2.00 (2 se for linear)")  # "for" is Portuguese too


@pytest.mark.parametrize("path", PT_NOTEBOOKS, ids=[p.stem for p in PT_NOTEBOOKS])
def test_every_printed_line_with_words_is_portuguese(path):
    nb = nbformat.read(path, as_version=4)
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or TOOL_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        bad += [f"cell {i}: {line.strip()}" for line in printed_lines(cell) if english(line)]
    assert not bad, f"{len(bad)} English lines in notebooks/pt-BR/{path.name}:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", PT_NOTEBOOKS, ids=[p.stem for p in PT_NOTEBOOKS])
def test_cells_that_quote_a_tool_name_it_and_print_no_lesson_words(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and TOOL_TAG in cell.get("metadata", {}).get("tags", []):
            assert any(re.search(rf"\b{re.escape(t)}\b", cell.source) for t in TOOLS), cell.source
            assert "tr(" not in cell.source, "the lesson's own words belong in a cell of their own"


def _label_texts(labels: dict) -> list[str]:
    texts = [labels.get(k, "") for k in ("suptitle", "supxlabel", "supylabel")] + list(labels.get("legend", []))
    for ax in labels.get("axes", []):
        texts += [ax.get("title", ""), ax.get("xlabel", ""), ax.get("ylabel", ""), ax.get("legend_title", "")]
        texts += list(ax.get("legend", []))
    return [t for t in texts if t and words(t)]


@pytest.mark.parametrize("path", PT_NOTEBOOKS, ids=[p.stem for p in PT_NOTEBOOKS])
def test_every_figure_is_labelled_in_portuguese(path):
    nb = nbformat.read(path, as_version=4)
    pt, _ = vocabularies()
    bad = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if "image/png" not in o.get("data", {}):
                continue
            labels = o.get("metadata", {}).get("image/png", {}).get(LABELS_KEY)
            assert labels is not None, f"cell {i}: a figure without its labels in its metadata"
            texts = _label_texts(labels)
            bad += [f"cell {i}: {t!r}" for t in texts if english(t)]
            if not any(w in pt for t in texts for w in words(t)):
                bad.append(f"cell {i}: no Portuguese label among {texts}")
    assert not bad, f"notebooks/pt-BR/{path.name}:\n" + "\n".join(bad)
