"""The live monitor, checked through its traits and through a recording comm."""

import json
import time

import numpy as np
import pytest

from vramlab.runtime.sampler import Sampler

MiB = 2**20


class RecordingComm:
    """Stands in for the kernel's comm and keeps every message the widgets send."""

    log: list = []

    def __init__(self, *args, **kwargs):
        self.comm_id = kwargs.get("comm_id") or f"c{len(RecordingComm.log)}"
        self.kernel = "recording"  # ipywidgets sends only through a comm with a kernel
        RecordingComm.log.append(("open", kwargs.get("data")))

    def open(self, *a, **k):
        pass

    def send(self, data=None, metadata=None, buffers=None):
        RecordingComm.log.append(("send", data))

    def close(self, *a, **k):
        RecordingComm.log.append(("close", None))

    def on_msg(self, cb):
        pass

    def on_close(self, cb):
        pass

    def handle_msg(self, msg):
        pass

    def handle_close(self, msg):
        pass


@pytest.fixture
def comm_log(monkeypatch):
    import comm
    import ipywidgets.widgets.widget as w

    RecordingComm.log = []
    monkeypatch.setattr(comm, "create_comm", RecordingComm)
    monkeypatch.setattr(w, "comm", comm, raising=False)
    yield RecordingComm.log


from waiting import wait_for  # noqa: E402


def make_monitor(interval=0.05):
    from vramlab.display.widget import Monitor

    s = Sampler()
    s.start(interval)  # as vramlab.watch() does: sampler first, then the monitor
    s.sample_now()
    m = Monitor(s)
    return s, m


def test_root_class_children_and_figures():
    s, m = make_monitor()
    try:
        assert "vramlab-monitor" in m._dom_classes
        bars = m._bars.value
        assert "host RAM" in bars and "this process" in bars and "iB" in bars
        assert "swap" in bars
        assert m._spark.value.startswith("<svg")
        assert "sampling every 0.05 s" in m._status.value
    finally:
        s.stop()
        m.close()


def test_repr_is_short_and_stable_and_bundle_has_static_html():
    s, m = make_monitor()
    try:
        assert repr(m) == "<vramlab monitor>"
        b = m._repr_mimebundle_()
        assert b["text/plain"] == "<vramlab monitor>"
        assert "vramlab-monitor-static" in b["text/html"] and "this process" in b["text/html"]
    finally:
        s.stop()
        m.close()


def test_updates_follow_memory_and_respect_rate_and_size(comm_log):
    s, m = make_monitor(interval=0.02)
    try:
        time.sleep(0.3)
        before = m._bars.value
        block = np.ones(200 * MiB // 8)
        assert wait_for(lambda: m._bars.value != before)
        during = m._bars.value
        del block
        assert wait_for(lambda: m._bars.value != during)
        time.sleep(1.0)
    finally:
        s.stop()
    sends = [(t, d) for t, d in comm_log if t == "send" and d and d.get("method") == "update"]
    assert sends, "trait changes went through the comm"
    for _, d in sends:
        assert len(json.dumps(d)) < 8192
    # never more than 4 renders a second, even sampling at 50 Hz
    elapsed = 0.3 + 1.0 + 0.5
    assert m.updates <= 4 * (elapsed + 2) + 2
    m.close()


def test_idle_monitor_sends_nothing_when_nothing_changes(comm_log):
    from vramlab.display.widget import Monitor

    snap_holder = {}

    def frozen():
        return snap_holder["snap"]

    from vramlab import snapshot

    snap_holder["snap"] = snapshot()
    s = Sampler(read=frozen)
    s.sample_now()
    m = Monitor(s)
    s.start(0.02)
    time.sleep(0.4)
    n = len([1 for t, _ in comm_log if t == "send"])
    time.sleep(0.6)
    s.stop()
    # the same reading every time: no new messages (the status line changes once, on stop)
    sends_after = [d for t, d in comm_log[:] if t == "send"]
    assert len(sends_after) - n <= 1
    m.close()


def test_stop_freezes_the_monitor():
    s, m = make_monitor()
    time.sleep(0.2)
    s.stop()
    assert wait_for(lambda: "stopped" in m._status.value)
    frozen = (m._bars.value, m._spark.value)
    np.ones(100 * MiB // 8)
    time.sleep(0.4)
    assert (m._bars.value, m._spark.value) == frozen
    m.close()


def test_sampling_error_shown_once_in_the_monitor():
    from vramlab import snapshot
    from vramlab.display.widget import Monitor

    n = {"i": 0}

    def flaky():
        n["i"] += 1
        if n["i"] == 3:
            raise OSError("cgroup vanished")
        return snapshot()

    s = Sampler(read=flaky)
    s.sample_now()
    m = Monitor(s)
    s.start(0.02)
    try:
        assert wait_for(lambda: "cgroup vanished" in m._status.value)
        assert m._status.value.count("sampling error") == 1
    finally:
        s.stop()
        m.close()


def test_sparkline_markers_and_warning(gpu_snapshot):
    from vramlab.display.widget import bars_html, sparkline_svg
    from vramlab.runtime.sampler import Marker, Sample

    now = 1000.0
    samples = [Sample(time=now - 10 + i, rss=i * MiB, peak=None, host_used=95 * MiB, available=5 * MiB,
                      limit=100 * MiB, swap_used=0, swap_in=0, swap_out=0,
                      devices=(("virtual:0", 0, 0, 50 * MiB, 100 * MiB),)) for i in range(10)]
    svg = sparkline_svg(samples, [Marker(now - 5, "cell", "[3]"), Marker(now - 2, "oom", "OOM in [4]")], now)
    assert svg.count("<polyline") == 3 and "OOM in [4]" in svg and "[3]" in svg
    assert len(svg) < 8192
    html = bars_html(gpu_snapshot)
    assert "cuda:0" in html and "tensors" in html


def test_bars_show_the_children(children_snapshot):
    from vramlab.display.widget import bars_html

    html = bars_html(children_snapshot)
    assert "child processes <b>16.00 MiB</b>" in html and "child processes <b>3.00 GiB</b>" in html
    assert "2 child processes" in html
