import threading
import time

import pytest

from vramlab.facts import MarkerKind, Stop, StopReason
from waiting import wait_for

from vramlab.runtime.sampler import DEFAULT_INTERVAL, RING_SIZE, MAX_CONSECUTIVE_ERRORS, Sampler, get_sampler
from vramlab.model import DeviceSample


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
    assert s.stopped_reason.reason is StopReason.FAILED_READINGS and s.stopped_reason.count >= 1
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
    s.mark(MarkerKind.CELL, 1)
    assert s.markers[-1].kind == "cell"
    s.start(0.02)
    try:
        assert wait_for(lambda: s.cpu_seconds > 0)
    finally:
        s.stop()


def test_the_sampler_makes_no_cuda_runtime_call(monkeypatch):
    """During CUDA graph capture a runtime call from another thread (mem_get_info, a device
    switch, a synchronize) can invalidate the capture: the sampler reads the allocator's
    host-side statistics only. torch.cuda is replaced by a recorder that says CUDA is up."""
    torch = pytest.importorskip("torch")
    GiB = 2**30
    calls = []

    class RecordingCuda:
        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append(name)
                if name == "is_initialized":
                    return True
                if name == "device_count":
                    return 1
                if name == "memory_stats":
                    return {"allocated_bytes.all.current": GiB, "reserved_bytes.all.current": 2 * GiB,
                            "allocated_bytes.all.peak": GiB, "reserved_bytes.all.peak": 2 * GiB}
                if name == "mem_get_info":
                    return (14 * GiB, 16 * GiB)
                raise AssertionError(f"unexpected torch.cuda.{name}")

            return call

    from vramlab.probes import torch_alloc

    monkeypatch.setattr(torch, "cuda", RecordingCuda())
    monkeypatch.setattr(torch_alloc, "_NAMES", {})
    s = Sampler()
    s.start(0.02)
    try:
        assert wait_for(lambda: len(s.samples) >= 5)
    finally:
        s.stop()
    assert s.errors == 0, s.last_error
    assert any(d.id == "cuda:0" and d.allocated == GiB and d.reserved == 2 * GiB for d in s.samples[-1].devices)
    assert all(type(d) is DeviceSample for d in s.samples[-1].devices)
    assert set(calls) <= {"is_initialized", "device_count", "memory_stats"}, sorted(set(calls))
    # a reading on the calling thread may ask the runtime (free memory, the device's name)
    from vramlab.reconcile import snapshot

    calls.clear()
    snapshot()
    assert "mem_get_info" in calls


def test_restart_never_joins_under_the_lock_the_thread_needs():
    """A listener that fails while start() restarts the thread: removing it takes the
    sampler's lock, so start() must not hold that lock while it joins the old thread
    (it would stall for the join's timeout, then leave two threads)."""
    s = Sampler()
    entered, release = threading.Event(), threading.Event()

    def failing_listener(snap, sampler):
        if snap is None:
            return
        entered.set()
        release.wait(10)
        raise RuntimeError("listener fails while the sampler restarts")

    s.add_listener(failing_listener)
    s.start(0.01)
    try:
        assert entered.wait(10)
        old = s._thread
        old_stop = s._stop
        restarted = threading.Thread(target=s.start, args=(0.02,))
        restarted.start()
        assert wait_for(old_stop.is_set)  # start() has told the old thread to stop and now joins it
        # while start() waits for the old thread, the lock that thread needs is free
        got = s._lock.acquire(timeout=2)
        if got:
            s._lock.release()
        assert got, "start() holds the sampler's lock while it joins the thread"
        release.set()  # the listener raises; its removal needs the lock
        restarted.join(10)
        assert not restarted.is_alive()
        assert not old.is_alive(), "start() returned before the old thread ended"
        assert len(sampler_threads()) == 1 and s.running and s.interval == 0.02
        assert failing_listener not in s._listeners and "listener fails" in s.last_error
    finally:
        release.set()
        s.stop()
    assert sampler_threads() == []


def test_a_restart_does_not_tell_monitors_the_sampler_stopped():
    s = Sampler()
    ended = []
    s.add_listener(lambda snap, sampler: ended.append(True) if snap is None else None)
    s.start(0.01)
    try:
        for _ in range(5):
            s.start(0.01)
        assert ended == []
    finally:
        s.stop()
    assert wait_for(lambda: ended == [True])


def test_a_sampler_is_a_context_manager_that_always_stops():
    from vramlab.runtime.sampler import Sampler

    s = Sampler()
    with pytest.raises(KeyError), s as same:
        assert same is s and s.running
        raise KeyError("in the block")
    assert not s.running and s.stopped_reason == Stop(StopReason.STOPPED)


def test_an_interval_no_thread_can_wait_is_refused():
    import threading

    from vramlab.runtime.sampler import Sampler

    s = Sampler()
    with pytest.raises(ValueError, match="at most"):
        s.start(threading.TIMEOUT_MAX * 2)
    assert not s.running
