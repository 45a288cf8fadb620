"""The plain-text renderers."""

from vramlab.display.words import note_text
from vramlab.display.text import record_line, record_text, snapshot_text, text_bar
from vramlab.reconcile import snapshot
from vramlab.units import format_bytes

GiB = 1 << 30


def test_text_tells_every_layer_with_figures(gpu_snapshot):
    t = snapshot_text(gpu_snapshot)
    for label, n in [("tensors", 12), ("torch cache", 4), ("context & non-torch", 4), ("other processes", 10),
                     ("free", 50)]:
        line = next(line for line in t.splitlines() if label in line)
        assert format_bytes(n * GiB) in line
    assert "peak allocated 14.00 GiB" in t and "fragmented 1.00 GiB" in t and "OOMs 1" in t


def test_text_lines_are_aligned(gpu_snapshot):
    t = snapshot_text(gpu_snapshot)
    rows = [line for line in t.splitlines() if line.startswith("  ") and "iB" in line and "%" in line[-8:]]
    ends = {line.index("iB") for line in rows}
    assert len(ends) == 1


def test_text_bar_width_and_order():
    bar = text_bar((("tensors", 1), ("free", 3)), width=8)
    assert bar == "[##......]"


def test_notes_are_shown():
    s = snapshot()
    for n in s.notes:
        assert note_text(n) in snapshot_text(s)


def test_children_have_their_own_lines_on_the_host_and_the_device(children_snapshot):
    t = snapshot_text(children_snapshot)
    host_line = next(line for line in t.splitlines() if "child processes" in line)
    assert format_bytes(16 * 2**20) in host_line and "2 processes" in host_line
    assert "USS" in host_line and "RSS summed 64.00 MiB" in host_line and "PSS 40.00 MiB" in host_line
    gpu_lines = [line for line in t.splitlines()[t.splitlines().index("cuda:0  Test GPU  total 80.00 GiB  util 50%"):]
                 if "child processes" in line]
    assert len(gpu_lines) == 1 and format_bytes(3 * GiB) in gpu_lines[0]
    other = next(line for line in t.splitlines() if "other processes" in line)
    assert format_bytes(7 * GiB) in other
    rows = [line for line in t.splitlines() if line.startswith("  ") and "iB" in line and "%" in line]
    assert len({line.index("iB") for line in rows}) == 1  # still aligned


def test_no_children_no_children_line(gpu_snapshot):
    import dataclasses

    from vramlab.reconcile import host_layers

    h = dataclasses.replace(gpu_snapshot.host, children_count=0, children_rss=0, children_uss=None, children_pids=())
    h = dataclasses.replace(h, layers=host_layers(h))
    assert "child processes" not in snapshot_text(dataclasses.replace(gpu_snapshot, host=h))


def test_rss_summed_is_said_to_count_shared_pages(children_snapshot):
    import dataclasses

    from vramlab.reconcile import host_layers

    h = dataclasses.replace(children_snapshot.host, children_uss=None, children_pss=None)
    h = dataclasses.replace(h, layers=host_layers(h))
    t = snapshot_text(dataclasses.replace(children_snapshot, host=h))
    line = next(line for line in t.splitlines() if "child processes" in line)
    assert "RSS summed" in line and "shared pages" in line and "--uss" in line


def test_a_record_tells_the_children(children_record):
    assert "children" in record_text(children_record) and "0 -> 2 processes" in record_text(children_record)
    assert "+16.00 MiB" in record_text(children_record)  # the USS line
    assert "children +64.00 MiB RSS, USS +16.00 MiB (2 now)" in record_line(children_record)


def test_a_gpu_nvml_cannot_read_says_why_in_text_and_html(nvml_sim):
    import driver_scenarios as sc

    import vramlab
    from vramlab.display.html import snapshot_html

    nvml_sim(sc.lost_among_three())
    s = vramlab.snapshot()
    why = "NVML cannot read this device: the GPU is lost"
    assert why in snapshot_text(s) and why in snapshot_html(s)


def test_a_freed_count_is_never_a_negative_size():
    """%vram free reported "-3.00 MiB" freed when RSS rose meanwhile (hardening, small lies)."""
    from vramlab.model import FreedDevice, FreedReport

    text = FreedReport(host=-3 * 2**20, devices=(FreedDevice("cuda:0", 2**30, -2**20),)).text()
    assert "-" not in text.replace("[vramlab]", "").replace("cuda:0", "")
    assert "host RSS nothing (it rose by 3.00 MiB meanwhile)" in text
    assert "allocated 1.00 GiB, reserved nothing (it rose by 1.00 MiB meanwhile)" in text
    assert "freed: host RSS 2.00 MiB" in FreedReport(host=2 * 2**20).text()
