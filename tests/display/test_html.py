"""The HTML renderers."""

from vramlab.display.html import record_html, snapshot_html


def test_html_has_bar_segments_and_warning(gpu_snapshot):
    h = snapshot_html(gpu_snapshot)
    assert h.count("vramlab-bar") == 2
    assert "tensors: 12.00 GiB (15.0%)" in h
    assert "<script" not in h


def test_children_are_a_segment_and_a_legend_entry(children_snapshot):
    h = snapshot_html(children_snapshot)
    assert "child processes: 16.00 MiB" in h  # the host bar's segment title
    assert "child processes: 3.00 GiB" in h  # the device bar's
    assert "2 processes, USS (RSS summed 64.00 MiB" in h


def test_a_record_has_a_children_row(children_record):
    h = record_html(children_record)
    assert "children" in h and "+64.00 MiB" in h and "0 → 2 processes" in h and "+16.00 MiB" in h


def _all_of_it(snap, record):
    return snapshot_html(snap) + record_html(record)


def test_the_vram_table_speaks_english_or_portuguese(children_snapshot, children_record, speak):
    import dataclasses

    from vramlab.display.html import oom_html
    from vramlab.model import OOMExplanation

    host = dataclasses.replace(children_snapshot.host, peak_exact=False, swap_total=0, swap_used=0)
    snap = dataclasses.replace(children_snapshot, host=host)
    bare = dataclasses.replace(snap, devices=())
    record = dataclasses.replace(children_record, error="OutOfMemoryError")
    speak("en")
    en = _all_of_it(snap, record) + snapshot_html(bare)
    speak("pt-BR")
    pt = _all_of_it(snap, record) + snapshot_html(bare)
    pairs = [("vramlab snapshot", "vramlab, leitura de"), ("this process", "este processo"),
             ("peak RSS", "pico de RSS"), ("(lifetime)", "(desde o início do processo)"), ("no swap", "sem swap"),
             ("peak allocated 14.00 GiB · peak reserved 16.00 GiB", "pico alocado 14.00 GiB · pico reservado 16.00 GiB"),
             ("fragmented 1.00 GiB", "fragmentada 1.00 GiB"), ("util 50%", "uso 50%"),
             ("accelerators", "aceleradores"), ("vramlab · cell 4", "vramlab · célula 4"),
             ("raised OutOfMemoryError", "lançou OutOfMemoryError"), ("peak during cell", "pico na célula"),
             ("0 → 2 processes", "0 → 2 processos"), ("child processes", "processos filhos")]
    for english, portuguese in pairs:
        assert english in en and portuguese in pt, (english, portuguese)
        assert english not in pt, english
    for word in (">limit ", ">delta<", ">children<", ">none<"):
        assert word in en and word not in pt, word
    # numbers and units stay as they are
    assert "12.00 GiB" in pt and "+64.00 MiB" in pt
    ex = OOMExplanation(message="m", requested=2 * 2**30, total=None, free=2**30, reserved_unallocated=None,
                        torch_allocated=None, shortfall=2**30, consumers=(), fragmentation_is_cause=False,
                        suggestions=())
    assert "falta de memória" in oom_html(ex) and "out of memory" not in oom_html(ex)


def test_the_vram_table_warns_in_the_notebooks_language(gpu_snapshot, speak):
    import dataclasses

    from vramlab.reconcile import device_layers

    GiB = 2**30
    full = dataclasses.replace(gpu_snapshot.devices[0], layers=device_layers(
        80 * GiB, 79 * GiB, process_used=20 * GiB, torch_reserved=16 * GiB, torch_allocated=12 * GiB))
    snap = dataclasses.replace(gpu_snapshot, devices=(full,))
    speak("en")
    assert "≥ 90% of the device in use" in snapshot_html(snap)
    speak("pt-BR")
    pt = snapshot_html(snap)
    assert "≥ 90% do dispositivo em uso" in pt and "of the device" not in pt
