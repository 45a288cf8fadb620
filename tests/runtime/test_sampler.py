import threading
import time

import pytest
from waiting import wait_for

from vramlab.runtime.sampler import DEFAULT_INTERVAL, RING_SIZE, MAX_CONSECUTIVE_ERRORS, Sampler, get_sampler


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "vramlab-sampler"]


def test_defaults():
    assert DEFAULT_INTERVAL == 0.5
    assert RING_SIZE * DEFAULT_INTERVAL == 2 * 3600


def test_samples_arrive_and_ring_is_bounded():
    s = Sampler(ring_size=5)
    s.start(0.01)
    try:
        assert wait_for(lambda: len(s.samples) == 5 and s.samples[-1].time > s.samples[0].time)
        time.sleep(0.1)
        assert len(s.samples) == 5
        assert s.latest is not None and s.samples[-1].rss > 0
    finally:
        s.stop()


def test_start_stop_idempotent_and_thirty_cycles_leave_no_thread():
    s = Sampler()
    s.stop()  # before any start: harmless
    for _ in range(30):
        s.start(0.01)
        s.start(0.01)
        s.stop()
        s.stop()
    assert not s.running
    assert sampler_threads() == []


def test_interval_change_applies_and_bad_interval_rejected():
    s = Sampler()
    s.start(0.25)
    try:
        assert s.interval == 0.25
        for bad in (0, -1, float("nan"), float("inf")):
            with pytest.raises(ValueError):
                s.start(bad)
    finally:
        s.stop()


def test_failing_reads_are_recorded_and_stop_cleanly(capsys):
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("probe exploded")

    s = Sampler(read=broken)
    s.start(0.01)
    assert wait_for(lambda: not s.running)
    assert len(calls) == MAX_CONSECUTIVE_ERRORS
    assert s.errors == MAX_CONSECUTIVE_ERRORS
    assert "probe exploded" in s.last_error
    assert "failed readings" in s.stopped_reason
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # never prints


def test_intermittent_failure_keeps_going():
    from vramlab import snapshot

    n = {"i": 0}

    def flaky():
        n["i"] += 1
        if n["i"] % 3 == 0:
            raise OSError("transient")
        return snapshot()

    s = Sampler(read=flaky)
    s.start(0.01)
    try:
        assert wait_for(lambda: len(s.samples) >= 10)
        assert s.running and s.errors >= 3 and "transient" in s.last_error
    finally:
        s.stop()


def test_listener_failure_is_recorded_and_listener_dropped():
    s = Sampler()
    seen = []

    def bad(snap, sampler):
        raise ValueError("monitor broke")

    def good(snap, sampler):
        seen.append(snap)

    s.add_listener(bad)
    s.add_listener(good)
    s.start(0.01)
    try:
        assert wait_for(lambda: len(seen) >= 3)
        assert "monitor broke" in s.last_error and s.running
    finally:
        s.stop()
    assert seen[-1] is None  # told that the sampler ended


def test_markers_and_cpu_accounting():
    s = get_sampler()
    s.mark("cell", "[1]")
    assert s.markers[-1].kind == "cell"
    s.start(0.02)
    try:
        assert wait_for(lambda: s.cpu_seconds > 0)
    finally:
        s.stop()
