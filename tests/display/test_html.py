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
