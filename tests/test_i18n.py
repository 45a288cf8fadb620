"""vramlab.i18n: which language vramlab speaks, and the runtime catalog behind it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polib
import pytest

from vramlab.i18n import lang, set_lang, tr

ROOT = Path(__file__).resolve().parent.parent
CATALOGS = sorted((ROOT / "vramlab" / "locale").glob("*/LC_MESSAGES/vramlab.po"))
sys.path.insert(0, str(ROOT / "tools"))
from extract_runtime_strings import tr_strings  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for k in ("VRAMLAB_LANG", "JPY_SESSION_NAME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    set_lang(None)
    yield
    set_lang(None)


def test_english_by_default():
    assert lang() == "en"
    assert tr("no prediction given") == "no prediction given"
    assert tr("predicted {text}", text="x2") == "predicted x2"


def test_set_lang_wins_and_rejects_what_vramlab_does_not_speak(monkeypatch):
    monkeypatch.setenv("VRAMLAB_LANG", "en")
    set_lang("pt_BR")
    assert lang() == "pt-BR"
    with pytest.raises(ValueError, match="pt-BR"):
        set_lang("fr")
    set_lang(None)
    assert lang() == "en"


def test_the_environment_variable(monkeypatch):
    monkeypatch.setenv("VRAMLAB_LANG", "pt-BR")
    assert lang() == "pt-BR" and tr("no prediction given") == "nenhum palpite dado"
    monkeypatch.setenv("VRAMLAB_LANG", "klingon")  # not a language vramlab speaks: the next rule decides
    assert lang() == "en"


def test_the_notebook_path_jupyter_gives_the_kernel(monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/course/notebooks/pt-BR/01_gpu_basics.ipynb")
    assert lang() == "pt-BR"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/course/notebooks/01_gpu_basics.ipynb")
    assert lang() == "en"


def test_the_kernel_started_in_the_portuguese_folder(tmp_path, monkeypatch):
    folder = tmp_path / "notebooks" / "pt-BR"
    folder.mkdir(parents=True)
    monkeypatch.chdir(folder)
    assert lang() == "pt-BR"


def test_a_message_the_catalog_lacks_comes_back_in_english():
    set_lang("pt-BR")
    assert tr("a sentence no catalog has, {n}", n=3) == "a sentence no catalog has, 3"


@pytest.mark.parametrize("po_path", CATALOGS, ids=lambda p: p.parent.parent.name)
@pytest.mark.slow
def test_every_runtime_string_is_translated_with_its_fields(po_path):
    po = {e.msgid: e for e in polib.pofile(str(po_path))}
    for msgid in tr_strings():
        assert msgid in po, f"{po_path.parent.parent.name} lacks {msgid!r} (python tools/extract_runtime_strings.py --update)"
        e = po[msgid]
        assert e.msgstr.strip() and "fuzzy" not in e.flags, msgid
        assert sorted(re.findall(r"{\w*}", e.msgstr)) == sorted(re.findall(r"{\w*}", msgid)), msgid


@pytest.mark.parametrize("po_path", CATALOGS, ids=lambda p: p.parent.parent.name)
def test_the_compiled_catalog_is_the_catalog(po_path):
    mo = po_path.with_suffix(".mo")
    assert mo.exists(), "python tools/i18n.py compile"
    want = {e.msgid: e.msgstr for e in polib.pofile(str(po_path)) if e.msgid and not e.obsolete}
    have = {e.msgid: e.msgstr for e in polib.mofile(str(mo)) if e.msgid}
    assert have == want, "the .mo is older than its .po: python tools/i18n.py compile"


def test_notes_are_translated_reason_and_detail():
    from vramlab.display.words import note_text
    from vramlab.facts import Note, NoteCode, Problem, Reason

    set_lang("pt-BR")
    try:
        assert note_text(Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.NO_LIBRARY))) == \
            "NVML indisponível: sem a biblioteca NVML (nenhum driver NVIDIA instalado)"
        assert note_text(Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.ERROR, "some driver text"))) == \
            "NVML indisponível: some driver text"
    finally:
        set_lang("en")
    assert note_text(Note(NoteCode.NVML_UNAVAILABLE, problem=Problem(Reason.ERROR, "x"))) == "NVML unavailable: x"


def test_the_batch_from_two_runs_in_portuguese():
    from vramlab.model import CellRecord, DeviceDelta, HostDelta
    from vramlab.runtime.oom import explain_oom

    host = HostDelta(rss_start=0, rss_end=0, rss_delta=0, peak=None, peak_delta=None, swap_delta=None, peak_exact=False)

    def record(peak: int, error: str | None, batch: int) -> CellRecord:
        dev = DeviceDelta(id="cuda:0", allocated_start=0, allocated_delta=peak, peak_allocated=peak,
                          peak_allocated_delta=peak, reserved_delta=0, nvml_delta=None)
        return CellRecord(execution_count=1, started=0.0, wall_s=0.1, error=error, host=host, devices=(dev,),
                          cell_key="k", batch_size=batch)

    set_lang("pt-BR")
    msg = ("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which "
           "512.00 MiB is free. Of the allocated memory 7.00 GiB is allocated by PyTorch, and 0 bytes is "
           "reserved by PyTorch but unallocated.")
    ok, failed = record(2 * 2**30, None, 512), record(7 * 2**30, "OutOfMemoryError", 4096)
    ex = explain_oom(RuntimeError(msg), {"batch_size": 4096}, failed, history=[ok, failed])
    assert ex.fitting_batch_size == 512  # the batch that ran
    assert "tamanho do batch 4096 -> 512 cabe: esta célula rodou com batch 512" in ex.text()
    alone = explain_oom(RuntimeError(msg), {"batch_size": 4096}, failed, history=[])
    assert "um limite superior tirado só desta célula" in alone.text()


def _run(code: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k not in ("VRAMLAB_LANG", "JPY_SESSION_NAME")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=e,
                          cwd=ROOT).stdout


def test_a_snapshot_speaks_portuguese_in_a_fresh_process():
    code = "import vramlab; print(vramlab.snapshot()._repr_mimebundle_()['text/plain'])"
    pt = _run(code, VRAMLAB_LANG="pt-BR")
    en = _run(code)
    assert "notas:" in pt and "o torch não foi importado" in pt  # torch is not imported in that process
    assert "notes:" in en and "torch is not imported" in en
    assert re.findall(r"\d+\.\d\d [KMG]iB", pt)[:3] and "GiB" in pt  # numbers and units are not translated


def test_oom_advice_in_portuguese():
    from vramlab.runtime.oom import explain_oom

    set_lang("pt-BR")
    msg = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.00 GiB of which "
           "1.00 GiB is free. Of the allocated memory 12.00 GiB is allocated by PyTorch, and 1.50 GiB is "
           "reserved by PyTorch but unallocated.")
    text = explain_oom(RuntimeError(msg), {"batch_size": 64}).text()
    assert "[vramlab] falta de memória" in text and "precisão mista" in text and "2.00 GiB" in text
    assert "expandable_segments:True" in text and "fragmentação" in text
    assert "%vram free" in text


def test_the_text_displays_speak_the_notebooks_language_layer_labels_included():
    from vramlab.display.text import freed_text, history_text, record_line, record_text, snapshot_text
    from vramlab.model import CellRecord, DeviceDelta, FreedDevice, FreedReport, History, HostDelta
    from vramlab.reconcile import snapshot

    host = HostDelta(rss_start=0, rss_end=2**20, rss_delta=2**20, peak=2**21, peak_delta=2**21, swap_delta=None,
                     peak_exact=True)
    dev = DeviceDelta(id="cuda:0", allocated_start=0, allocated_delta=2**20, peak_allocated=2**22,
                      peak_allocated_delta=2**22, reserved_delta=2**21, nvml_delta=None)
    rec = CellRecord(execution_count=3, started=0.0, wall_s=0.25, error="OutOfMemoryError", host=host, devices=(dev,))
    freed = FreedReport(host=2**20, devices=(FreedDevice(id="cuda:0", allocated=2**20, reserved=2**21),),
                        cleared=("sys.last_value",))
    snap = snapshot()

    def render() -> str:
        return "\n".join([snapshot_text(snap), record_text(rec), record_line(rec),
                          history_text(History(cells=(rec,), samples=(), markers=())), history_text(History((), (), ())),
                          freed_text(freed)])

    set_lang("pt-BR")
    pt = render()
    set_lang("en")
    en = render()
    for english, portuguese in [("this process", "este processo"), ("available", "disponível"),
                                ("peak during cell", "pico na célula"), ("raised OutOfMemoryError", "lançou OutOfMemoryError"),
                                ("no cell records yet", "ainda não há registros de células"),
                                ("[vramlab] freed: host RSS", "[vramlab] liberado: RSS do host"),
                                ("reserved", "reservada")]:
        assert english in en and portuguese in pt, (english, portuguese)
        assert english not in pt, english


def test_the_html_table_names_the_layers_in_the_notebooks_language():
    from vramlab.display.html import snapshot_html
    from vramlab.reconcile import snapshot

    snap = snapshot()
    set_lang("pt-BR")
    pt = snapshot_html(snap)
    set_lang("en")
    en = snapshot_html(snap)
    assert "este processo" in pt and "disponível" in pt and "this process" not in pt
    assert "this process" in en and "available" in en
