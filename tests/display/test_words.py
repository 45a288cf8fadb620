"""Facts into words (vramlab.display.words): every note, reason, stop and marker says itself in
both languages, the ones that name a device id or a count included, and no module of the package
parses vramlab's own sentences back (issue: typed facts)."""

from __future__ import annotations

import ast
import json
import string
from pathlib import Path

import pytest

from vramlab.display import words
from vramlab.facts import MarkerKind, Note, NoteCode, Problem, Reason, Stop, StopReason
from vramlab.i18n import set_lang

PKG = Path(words.__file__).resolve().parents[1]


@pytest.fixture
def pt_br():
    set_lang("pt-BR")
    yield
    set_lang(None)


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def _full(code: NoteCode) -> Note:
    return Note(code, device="cuda:3", count=7, source="GPU-1234 / Tesla T4", detail="OSError: [Errno 5] boom",
                problem=Problem(Reason.NO_PERMISSION))


def test_every_code_and_reason_has_its_words():
    assert set(words.NOTE_TEMPLATES) == set(NoteCode)
    assert set(words.REASON_TEXTS) == set(Reason) - {Reason.ERROR}
    allowed = {"device", "count", "source", "detail", "why"}
    for code, template in words.NOTE_TEMPLATES.items():
        assert _fields(template) <= allowed, code


@pytest.mark.parametrize("code", list(NoteCode), ids=lambda c: c.value)
def test_every_note_translates_with_its_ids_and_counts(code, pt_br):
    note = _full(code)
    template = words.NOTE_TEMPLATES[code]
    en = words.note_text(note, english=True)
    pt = words.note_text(note)
    assert pt != en, f"{code} has no Portuguese"
    assert "{" not in pt and "{" not in en
    for field, shown in (("device", "cuda:3"), ("count", "7"), ("source", "GPU-1234 / Tesla T4"),
                         ("detail", "OSError: [Errno 5] boom")):
        if field in _fields(template):
            assert shown in en and shown in pt, (code, field)  # ids, counts and details pass through as they are
    if "why" in _fields(template):
        assert words.problem_text(note.problem) in pt and words.problem_text(note.problem, english=True) in en


@pytest.mark.parametrize("reason", [r for r in Reason if r is not Reason.ERROR], ids=lambda r: r.value)
def test_every_reason_translates(reason, pt_br):
    p = Problem(reason, "ImportError: x")
    assert words.problem_text(p) != words.problem_text(p, english=True)


def test_an_error_s_own_words_are_shown_as_they_came(pt_br):
    assert words.problem_text(Problem(Reason.ERROR, "NVMLError_Unknown: weird")) == "NVMLError_Unknown: weird"


def test_json_carries_the_code_the_fields_and_english_text(pt_br):
    d = words.note_dict(Note(NoteCode.PIDS_HIDDEN, device="cuda:0", count=2))
    assert json.loads(json.dumps(d)) == {
        "code": "pids-hidden", "device": "cuda:0", "count": 2,
        "text": words.NOTE_TEMPLATES[NoteCode.PIDS_HIDDEN].format(device="cuda:0", count=2)}
    d = words.note_dict(Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.ERROR, "boom")))
    assert d["reason"] == "error" and d["reason_detail"] == "boom" and d["text"] == "NVML unavailable: boom"


def test_stops_and_markers_in_both_languages(pt_br):
    failed = Stop(StopReason.FAILED_READINGS, 3, "sampling: OSError: cgroup vanished")
    pt = words.stop_text(failed)
    assert "3" in pt and "cgroup vanished" in pt and "failed readings" not in pt
    assert words.stop_text(Stop(StopReason.UNLOADED)) != "extension unloaded"
    assert words.marker_text(MarkerKind.OOM, 4) not in ("OOM in [4]",) and "[4]" in words.marker_text(MarkerKind.OOM, 4)
    assert words.marker_text(MarkerKind.CELL, 4) == "[4]"
    set_lang("en")
    assert words.stop_text(failed) == "stopped after 3 failed readings: sampling: OSError: cgroup vanished"
    assert words.marker_text(MarkerKind.OOM, None) == "OOM in [?]"


#: The modules that may use regular expressions, and what each parses: text from outside vramlab
#: (a user's input, torch's own messages, a cell's source), never vramlab's own sentences.
REGEX_ALLOWED = {
    "units.py": "sizes and intervals a user types",
    "runtime/oom.py": "torch's out-of-memory message",
    "runtime/cells.py": "the source of a user's cell (batch-size literals)",
    "files.py": "the names of its own temporary files, to clean those of dead writers",
    "exposition.py": "Prometheus label names a user passes",
    "sim/allocator.py": "PYTORCH_CUDA_ALLOC_CONF, as torch's parser reads it",
    "sim/presets.py": "a card's name as a user types it",
}


def test_no_module_parses_vramlab_s_own_sentences_back():
    users = set()
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "re" for a in node.names) or \
                    isinstance(node, ast.ImportFrom) and node.module == "re":
                users.add(path.relative_to(PKG).as_posix())
    assert users == set(REGEX_ALLOWED), "a new regular expression: does it parse vramlab's own words back?"
