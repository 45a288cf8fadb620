"""The HTML renderers."""

from vramlab.display.html import snapshot_html


def test_html_has_bar_segments_and_warning(gpu_snapshot):
    h = snapshot_html(gpu_snapshot)
    assert h.count("vramlab-bar") == 2
    assert "tensors: 12.00 GiB (15.0%)" in h
    assert "<script" not in h
