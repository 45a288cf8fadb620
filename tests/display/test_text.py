"""The plain-text renderers."""

from vramlab.display.text import snapshot_text, text_bar
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
        assert n in snapshot_text(s)
