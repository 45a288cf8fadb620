"""The Portuguese edition of the workbook: one source per lesson, code cells shared byte for byte,
every markdown cell translated and none stale (tools/i18n.py, gettext catalogs read with polib)."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import polib
import pytest
from tool_modules import load_tool

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "tools" / "notebooks").glob("*.py"))
LANGS = ["pt-BR"]


i18n = load_tool("i18n")
build = load_tool("build_notebooks")
CASES = [(lang, src.stem) for lang in LANGS for src in SOURCES]


@pytest.mark.parametrize("lang,name", CASES, ids=[f"{lang}-{n}" for lang, n in CASES])
def test_every_cell_is_translated_and_none_is_stale(lang, name):
    found = i18n.problems(lang, name)
    assert not found, found.text() + "\n(python tools/i18n.py update, translate, then rebuild)"


@pytest.mark.parametrize("lang,name", CASES, ids=[f"{lang}-{n}" for lang, n in CASES])
def test_committed_edition_is_the_source_translated_and_executed(lang, name):
    want = i18n.translate(build.parse((ROOT / "tools" / "notebooks" / f"{name}.py").read_text()), lang, name)
    path = ROOT / "notebooks" / lang / f"{name}.ipynb"
    assert path.exists(), f"python tools/build_notebooks.py --lang {lang} {name}"
    nb = nbformat.read(path, as_version=4)
    assert build.committed_view(nb) == build.committed_view(want), \
        f"notebooks/{lang}/{name}.ipynb is not its source and catalog: rebuild it"
    assert build.folded_solutions(nb) == [c.source.rstrip() for c in want.cells if build.is_solution(c)]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "committed without running every cell"


@pytest.mark.parametrize("lang,name", CASES, ids=[f"{lang}-{n}" for lang, n in CASES])
def test_code_cells_are_the_english_editions(lang, name):
    en = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    tr = nbformat.read(ROOT / "notebooks" / lang / f"{name}.ipynb", as_version=4)
    assert [c.cell_type for c in tr.cells] == [c.cell_type for c in en.cells]  # cell for cell
    en_code = [c.source for c in en.cells if c.cell_type == "code"]
    tr_code = [c.source for c in tr.cells if c.cell_type == "code"]
    # the code is the English edition's; only its comments are translated
    assert [i18n.strip_comments(c) for c in tr_code] == [i18n.strip_comments(c) for c in en_code]
    comments = [u.text for c in tr_code for u in i18n.comment_units(c)]
    en_comments = [u.text for c in en_code for u in i18n.comment_units(c)]
    assert len(comments) == len(en_comments)
    assert sum(a != b for a, b in zip(comments, en_comments)) >= len(comments) // 2, "comments left in English"
    prose = [(a.source, b.source) for a, b in zip(en.cells, tr.cells) if a.cell_type == "markdown"]
    assert all(a != b for a, b in prose), "a markdown cell was left in English"


def test_a_code_cells_comments_are_translated_and_nothing_else():
    source = ('x = 1  # a note after code\n'
              '# a comment over\n# two lines\n'
              'if x:\n    # indented\n    s = "# not a comment"  # after a string\n'
              '# NBVAL_IGNORE_OUTPUT\n')
    units = i18n.comment_units(source)
    assert [u.text for u in units] == ["a note after code", "a comment over\ntwo lines", "indented", "after a string"]
    done = i18n.translate_comments(source, {"a note after code": "uma nota", "a comment over\ntwo lines": "um comentário",
                                            "indented": "recuado", "after a string": "depois de um texto"})
    assert done == ('x = 1  # uma nota\n# um comentário\nif x:\n    # recuado\n'
                    '    s = "# not a comment"  # depois de um texto\n# NBVAL_IGNORE_OUTPUT\n')
    assert i18n.strip_comments(done) == i18n.strip_comments(source)


@pytest.mark.slow
def test_every_lesson_tr_call_passes_the_fields_its_message_names():
    extract = load_tool("extract_runtime_strings")
    assert extract.call_problems() == []


def test_no_edition_has_a_notebook_without_a_source():
    for lang in LANGS:
        assert sorted(p.stem for p in (ROOT / "notebooks" / lang).glob("*.ipynb")) == [p.stem for p in SOURCES]
        assert sorted(p.stem for p in (ROOT / "tools" / "notebooks" / lang).glob("*.po")) == [p.stem for p in SOURCES]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A copy of one lesson's source and catalog, for the tools to change."""
    src = tmp_path / "tools" / "notebooks"
    (src / "pt-BR").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "notebooks" / "11_fine_tuning_a_7b_model.py", src)
    shutil.copy(ROOT / "tools" / "notebooks" / "pt-BR" / "11_fine_tuning_a_7b_model.po", src / "pt-BR")
    monkeypatch.setattr(i18n, "SRC", src)
    return src / "11_fine_tuning_a_7b_model.py"


def test_a_changed_english_cell_makes_its_translation_stale_and_the_build_refuses(scratch):
    name = scratch.stem
    assert not i18n.problems("pt-BR", name)
    text = scratch.read_text()
    old = "# Lesson 10 checked `vramlab.estimate` against a measured step"
    assert old in text
    scratch.write_text(text.replace(old, "# Lesson 10 checked `vramlab.estimate` against one measured step"))
    found = i18n.problems("pt-BR", name)
    assert len(found.missing) == 1 and "11 ·" in found.missing[0]  # the English cell has no translation now
    nb = build.parse(scratch.read_text())
    with pytest.raises(i18n.TranslationError, match="1 missing"):
        i18n.translate(nb, "pt-BR", name)
    # update carries the old translation over, marked fuzzy (stale), with the previous English text
    i18n.update_catalog("pt-BR", name)
    found = i18n.problems("pt-BR", name)
    assert not found.missing and len(found.fuzzy) == 1
    entry = next(e for e in polib.pofile(str(i18n.catalog_path("pt-BR", name))) if "fuzzy" in e.flags)
    assert old.lstrip("# ") in entry.previous_msgid and "11 ·" in entry.msgstr
    with pytest.raises(i18n.TranslationError, match="1 stale"):
        i18n.translate(build.parse(scratch.read_text()), "pt-BR", name)
    # a translator checks it and removes the flag: the build goes through
    po = polib.pofile(str(i18n.catalog_path("pt-BR", name)))
    for e in po:
        e.flags = [f for f in e.flags if f != "fuzzy"]
    po.save()
    assert not i18n.problems("pt-BR", name)
    i18n.translate(build.parse(scratch.read_text()), "pt-BR", name)


def test_a_new_english_cell_is_missing(scratch):
    scratch.write_text(scratch.read_text() + "\n# %% [markdown]\n# A new paragraph.\n")
    found = i18n.problems("pt-BR", scratch.stem)
    assert found.missing == ["A new paragraph."]
    i18n.update_catalog("pt-BR", scratch.stem)
    assert i18n.problems("pt-BR", scratch.stem).missing == ["A new paragraph."]  # empty entry, still missing


# Renderings the term list (docs/pt-BR/termos.md) rules out: calques found in review, and the
# second word for an idea that has one ("lança" for raise, "áreas de trabalho" for workspaces)
_RULED_OUT = ("levanta", "conta de guardanapo", "botões da CNN", "caminhos de travessia", "apoiado num arquivo",
              "arquivo por trás", "reinicia o pico", "coletas", "o que cada um tem sozinho")


def test_the_portuguese_edition_uses_one_word_per_idea_and_none_of_the_calques():
    import re

    import polib

    texts = {str(p.relative_to(ROOT)): "\n".join(e.msgstr for e in polib.pofile(str(p)))
             for p in [*(ROOT / "tools" / "notebooks" / "pt-BR").glob("*.po"),
                       ROOT / "vramlab" / "locale" / "pt_BR" / "LC_MESSAGES" / "vramlab.po"]}
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in [*(ROOT / "docs" / "pt-BR").glob("*.md"),
                                                                   ROOT / "README.pt-BR.md"]
                  if p.name != "termos.md"})  # the term list names what it rules out
    found = [(name, bad) for name, text in texts.items() for bad in _RULED_OUT if bad in text.lower()]
    assert not found, found
    # workspaces: the Portuguese word, with the English one beside it at most
    bare = [(name, m.group(0)) for name, text in texts.items()
            for m in re.finditer(r".{0,30}\bworkspaces?\b.{0,20}", text, re.S)
            if not re.search(r"áreas?\s+de\s+trabalho", m.group(0))]
    assert not bare, bare
