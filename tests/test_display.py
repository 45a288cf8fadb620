from vramlab.units import format_bytes
from vramlab.reconcile import DeviceSnapshot, Snapshot, device_layers, snapshot
from vramlab.display import snapshot_html, snapshot_text
from vramlab.display.text import text_bar

GiB = 1 << 30


def fake_gpu():
    layers = device_layers(80 * GiB, 30 * GiB, process_used=20 * GiB, torch_reserved=16 * GiB,
                           torch_allocated=12 * GiB)
    return DeviceSnapshot(id="cuda:0", kind="cuda", name="Test GPU", uuid="GPU-x", source="nvml+torch", nvml_index=0,
                          total=80 * GiB, free=50 * GiB, used=30 * GiB, driver_reserved=None,
                          process_used=20 * GiB, other_processes_used=10 * GiB, utilization=50,
                          torch_allocated=12 * GiB, torch_reserved=16 * GiB, torch_active=12 * GiB,
                          torch_inactive_split=GiB, torch_peak_allocated=14 * GiB, torch_peak_reserved=16 * GiB,
                          num_ooms=1, num_alloc_retries=0, mem_info_free=None, mem_info_total=None,
                          unified_memory=False, layers=layers)


def with_gpu():
    s = snapshot()
    return Snapshot(time=s.time, host=s.host, devices=(fake_gpu(),), notes=())


def test_text_tells_every_layer_with_figures():
    t = snapshot_text(with_gpu())
    for label, n in [("tensors", 12), ("torch cache", 4), ("context & non-torch", 4), ("other processes", 10),
                     ("free", 50)]:
        line = next(line for line in t.splitlines() if label in line)
        assert format_bytes(n * GiB) in line
    assert "peak allocated 14.00 GiB" in t and "fragmented 1.00 GiB" in t and "OOMs 1" in t


def test_text_lines_are_aligned():
    t = snapshot_text(with_gpu())
    rows = [line for line in t.splitlines() if line.startswith("  ") and "iB" in line and "%" in line[-8:]]
    ends = {line.index("iB") for line in rows}
    assert len(ends) == 1


def test_html_has_bar_segments_and_warning():
    h = snapshot_html(with_gpu())
    assert h.count("vramlab-bar") == 2
    assert "tensors: 12.00 GiB (15.0%)" in h
    assert "<script" not in h


def test_text_bar_width_and_order():
    bar = text_bar((("tensors", 1), ("free", 3)), width=8)
    assert bar == "[##......]"


def test_notes_are_shown():
    s = snapshot()
    for n in s.notes:
        assert n in snapshot_text(s)
