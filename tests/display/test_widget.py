"""The live monitor, checked through its traits and through a recording comm."""

import json
import time

import numpy as np
import pytest

from vramlab.facts import MarkerKind, Stop, StopReason
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    from vramlab.display.bars import bars_html
    from vramlab.display.sparkline import sparkline_svg
    from vramlab.model import DeviceSample
    from vramlab.runtime.sampler import Marker, Sample

    now = 1000.0
    samples = [Sample(time=now - 10 + i, rss=i * MiB, peak=None, host_used=95 * MiB, available=5 * MiB,
                      limit=100 * MiB, swap_used=0, swap_in=0, swap_out=0,
                      devices=(DeviceSample("virtual:0", 0, 0, 50 * MiB, 100 * MiB),)) for i in range(10)]
    svg = sparkline_svg(samples, [Marker(now - 5, MarkerKind.CELL, 3), Marker(now - 2, MarkerKind.OOM, 4)], now)
    assert svg.count("<polyline") == 3 and "OOM in [4]" in svg and "[3]" in svg
    assert len(svg) < 8192
    html = bars_html(gpu_snapshot)
    assert "cuda:0" in html and "tensors" in html


def test_bars_show_the_children(children_snapshot):
    from vramlab.display.bars import bars_html

    html = bars_html(children_snapshot)
    assert "child processes <b>16.00 MiB</b>" in html and "child processes <b>3.00 GiB</b>" in html
    assert "2 child processes" in html


def _sample(t, rss=MiB, used=50 * MiB, devices=None):
    from vramlab.model import DeviceSample, Sample

    if devices is None:
        devices = (DeviceSample("cuda:0", 0, 0, used, 100 * MiB),)
    return Sample(time=t, rss=rss, peak=None, host_used=10 * MiB, available=90 * MiB, limit=100 * MiB, swap_used=0,
                  swap_in=0, swap_out=0, devices=devices)


def test_the_window_kept_as_samples_come_is_what_filtering_the_ring_gives():
    """Samples arrive a few at a time into a small ring, with gaps, a device that comes and goes and
    a clock that steps back once; after each update the window holds exactly the old full filter's
    samples and draws the same sparkline as a window filtered from scratch."""
    import collections
    import random

    from vramlab.display.sparkline import SampleWindow, sparkline_svg
    from vramlab.model import DeviceSample

    rng = random.Random(7)
    ring = collections.deque(maxlen=60)
    win = SampleWindow(window_s=20.0)
    t = 1000.0
    for step in range(300):
        for _ in range(rng.choice([0, 1, 1, 2, 5, 70])):
            t += rng.choice([0.1, 0.5, 2.0, 15.0])
            devs = (DeviceSample("cuda:0", 0, 0, rng.randrange(100) * MiB, 100 * MiB),)
            if step % 50 > 25:
                devs += (DeviceSample("cuda:1", None, None, None, None),)  # lost for a while
            ring.append(_sample(t, rss=rng.randrange(100) * MiB, devices=devs))
        if step == 150:
            t -= 30.0  # the clock stepped back
        now = t + rng.choice([0.0, 0.3])
        win.update(ring, now)
        want = [s for s in ring if s.time >= now - 20.0]
        assert list(win.samples) == want, step
        assert sparkline_svg(win, [], now, 20.0) == sparkline_svg(want, [], now, 20.0), step


def test_sparkline_points_are_bounded_and_keep_a_spike():
    import re

    from vramlab.display.sparkline import SPARK_POINTS, sparkline_svg

    now = 100_000.0
    n = 14_400  # a full ring, all in the window
    samples = [_sample(now - 290 + i * 290 / n, rss=(97 * MiB if i == 5_000 else MiB)) for i in range(n)]
    svg = sparkline_svg(samples, [], now)
    lines = re.findall(r'<polyline [^>]*points="([^"]*)"', svg)
    assert len(lines) == 3
    for pts in lines:
        assert 1 <= len(pts.split()) <= SPARK_POINTS
    assert "0–100% of capacity" in svg  # the one 97 % reading set the axis: it was not thinned away


def test_the_monitor_keeps_its_window_without_refiltering_the_ring():
    from vramlab.display.widget import Monitor

    s = Sampler()
    for _ in range(3):
        s.sample_now()
    m = Monitor(s)
    try:
        first = list(m._window.samples)
        assert first == list(s.samples)
        s.sample_now()
        m.refresh()
        assert list(m._window.samples) == list(s.samples) and m._window.samples[0] is first[0]
    finally:
        m.close()


def _lost_snapshot(nvml_sim, scenario):
    import vramlab

    nvml_sim(scenario)
    return vramlab.snapshot()


@pytest.mark.parametrize("which", ["one of three", "every GPU"])
def test_a_gpu_nvml_cannot_read_keeps_its_row_with_the_reason(nvml_sim, which):
    import driver_scenarios as sc
    from vramlab.display.widget import Monitor

    if which == "one of three":
        scenario, lost = sc.lost_among_three(), ["cuda:1"]
    else:
        scenario, lost = sc.machine(sc.gpu(0, lost=True), sc.gpu(1, lost=True)), ["cuda:0", "cuda:1"]
    snap = _lost_snapshot(nvml_sim, scenario)
    s = Sampler(read=lambda: snap)
    s.sample_now()
    m = Monitor(s)
    try:
        why = "NVML cannot read this device: the GPU is lost"
        for html in (m._bars.value, m.static_html(), m.static_html(stopped=True)):
            for id_ in lost:
                assert f"<b>{id_}</b>" in html
            assert html.count(why) == len(lost)
        assert all(id_ in m._status.value for id_ in lost) and "cannot be read" in m._status.value
        if which == "one of three":
            assert "<b>cuda:0</b>" in m._bars.value and "<b>cuda:2</b>" in m._bars.value
    finally:
        m.close()


def test_the_monitor_speaks_english_or_portuguese(children_snapshot, speak):
    """The status line, the bars, the timeline, the static copy and the text/plain of a stopped monitor."""
    from vramlab.display.widget import Monitor
    from vramlab.runtime.sampler import Marker

    import dataclasses

    host = dataclasses.replace(children_snapshot.host, swap_total=2 * 2**30, swap_used=2**30, swap_in=0, swap_out=0)
    snaps = iter([dataclasses.replace(children_snapshot, host=host, time=children_snapshot.time + i) for i in range(2)])
    s = Sampler(read=lambda: next(snaps))
    s.sample_now()
    s.sample_now()  # two readings a second apart: a paging rate
    s.markers.append(Marker(s.latest.time, MarkerKind.OOM, 4))
    m = Monitor(s)
    try:
        def render():
            s.stopped_reason = Stop(StopReason.UNLOADED)
            return {"live": m.static_html(), "stopped": m.static_html(stopped=True),
                    "status": m._status_html(), "plain": m._repr_mimebundle_()["text/plain"],
                    "frozen": m._frozen_bundle()["text/plain"]}

        speak("en")
        en = render()
        speak("pt-BR")
        pt = render()
    finally:
        m.close()
    assert en["plain"] == "<vramlab monitor>" and pt["plain"] == "<monitor do vramlab>"
    assert en["frozen"].startswith("<vramlab monitor: stopped>\nvramlab snapshot")
    assert pt["frozen"].startswith("<monitor do vramlab: parado>\nvramlab, leitura de")
    assert "· stopped</span>" in en["status"] and "· parado</span>" in pt["status"]
    pairs = [("static copy of the live monitor, reading of", "cópia estática do monitor ao vivo, leitura de"),
             ("host RAM", "RAM do host"), ("this process", "este processo"), ("2 child processes", "2 processos filhos"),
             ("child processes <b>16.00 MiB</b>", "processos filhos <b>16.00 MiB</b>"),
             ("paging in 0 B/s · out 0 B/s", "paginação: entrada 0 B/s · saída 0 B/s"),
             ("OOM in [4]", "OOM na célula [4]"), ("host used", "host em uso"), ("cuda:0 used", "cuda:0 em uso"),
             ("of capacity", "da capacidade")]
    for english, portuguese in pairs:
        assert english in en["live"] and portuguese in pt["live"], (english, portuguese)
        assert english not in pt["live"] and english not in pt["stopped"], english
    stopped = [("stopped (extension unloaded) · last reading", "parado (extensão descarregada) · última leitura em")]
    for english, portuguese in stopped:
        assert english in en["stopped"] and portuguese in pt["stopped"], (english, portuguese)
        assert english not in pt["stopped"]


def test_the_monitor_says_swap_is_missing_and_the_sampling_error_in_portuguese(speak):
    import dataclasses
    import types

    import vramlab
    from vramlab.display.bars import bars_html
    from vramlab.display.widget import Monitor

    snap = vramlab.snapshot()
    snap = dataclasses.replace(snap, host=dataclasses.replace(snap.host, swap_total=0, swap_used=0))
    speak("en")
    assert "none configured" in bars_html(snap)
    speak("pt-BR")
    assert "nenhum configurado" in bars_html(snap) and "none configured" not in bars_html(snap)
    # a sampler that is running, with an error from its last reading
    s = types.SimpleNamespace(latest=snap, samples=[], markers=[], running=True, interval=0.5, stopped_reason=None,
                              last_error="OSError: cgroup vanished", add_listener=lambda f: None,
                              remove_listener=lambda f: None)
    m = Monitor(s)
    try:
        status = m._status_html()
        assert "amostrando a cada 0.5 s" in status and "erro de amostragem: OSError: cgroup vanished" in status
        assert "sampling" not in status
        s.stopped_reason = Stop(StopReason.FAILED_READINGS, 3, "OSError: cgroup vanished")
        status = m._status_html(stopped=True)
        assert "parado (parado após 3 leituras com falha: OSError: cgroup vanished)" in status
        speak("en")
        assert "stopped (stopped after 3 failed readings: OSError: cgroup vanished)" in m._status_html(stopped=True)
    finally:
        m.close()


def test_a_small_process_on_a_large_machine_shows_its_rise():
    """The sparkline was scaled to the whole machine's use, so a 600 MB rise on a host half used
    barely showed (hardening, display nits): the scale follows this process (and the devices),
    and the host's whole use, above it, runs along the top and says how high it went."""
    import re

    from vramlab.display.sparkline import sparkline_svg
    from vramlab.model import Sample

    GiB = 2**30
    now = 1000.0
    samples = [Sample(time=now - 20 + i, rss=(200 * MiB if i < 10 else 800 * MiB), peak=None, host_used=12 * GiB,
                      available=12 * GiB, limit=24 * GiB, swap_used=0, swap_in=0, swap_out=0, devices=())
               for i in range(20)]
    svg = sparkline_svg(samples, [], now)
    assert "0–5% of capacity" in svg  # 800 MiB of 24 GiB is 3.3 %
    assert "host used (above the scale, up to 50%)" in svg
    rss = re.findall(r'<polyline [^>]*points="([^"]*)"', svg)[0]
    ys = [float(p.split(",")[1]) for p in rss.split()]
    assert max(ys) - min(ys) > 15  # the 600 MiB rise takes about half the height (under 2 px at 0–50 %)
