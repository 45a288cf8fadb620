"""vramlab.sim.replay: a trace in torch's format, replayed through the allocator model."""

from __future__ import annotations

import random

from vramlab.sim.allocator import CachingAllocator
from vramlab.sim.replay import replay

MiB = 1 << 20
GiB = 1 << 30


def _trace_of_the_model(seed: int) -> list[dict]:
    """A trace recorded by the model itself, in torch's format (the same events torch records)."""
    rng = random.Random(seed)
    a = CachingAllocator(8 * GiB)
    a.record_trace = True
    live = []
    for _ in range(2000):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([512, 4096, 300_000, 1 * MiB, 3 * MiB + 17, 25 * MiB, 120 * MiB])
            live.append(a.malloc(size))
    return a.trace


def test_a_trace_of_the_model_replays_exactly():
    for seed in range(3):
        r = replay(_trace_of_the_model(seed), 8 * GiB)
        assert r.exact, r.text()
        assert r.checked > 1000 and r.peak_reserved_real == r.peak_reserved_model > 0


def test_a_different_allocator_is_caught_at_its_first_difference():
    # a 1 MiB request: torch (and the model) carve it from a 20 MiB segment; this "real" trace
    # says 2 MiB, as an allocator without the large pool's 20 MiB segments would
    events = [{"action": "segment_alloc", "addr": 0x1000, "size": 2 * MiB, "stream": 0},
              {"action": "alloc", "addr": 0x1000, "size": 1 * MiB + 1, "stream": 0},
              {"action": "free_requested", "addr": 0x1000, "size": 1 * MiB + 1, "stream": 0},
              {"action": "free_completed", "addr": 0x1000, "size": 1 * MiB + 1, "stream": 0}]
    r = replay(events, 8 * GiB)
    assert not r.exact and r.mismatches == 2
    assert r.first_mismatch == (1, "alloc", 1 * MiB + 1, 2 * MiB, 20 * MiB)
    assert "first at event 1" in r.text()


def test_frees_from_before_the_trace_and_several_streams_are_reported():
    events = [{"action": "free_completed", "addr": 0xdead, "size": 512, "stream": 0},
              {"action": "segment_alloc", "addr": 0x2000, "size": 2 * MiB, "stream": 7},
              {"action": "alloc", "addr": 0x2000, "size": 512, "stream": 7}]
    r = replay(events, 8 * GiB)
    assert r.unmatched_frees == 1 and not r.exact
    assert r.streams == [0, 7] and "2 streams" in r.text()
