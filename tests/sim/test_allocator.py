"""sim/allocator.py: the CUDA caching allocator's policy, on hand-derived cases from the C++ rules
(c10/cuda/CUDACachingAllocator.cpp: round_size, get_allocation_size, should_split,
get_free_block, the retry chain, free_block, release_cached_blocks, expandable segments)."""

from __future__ import annotations

import pytest

from vramlab.sim.allocator import (K_LARGE_BUFFER, K_SMALL_BUFFER, AllocatorOOM, AllocConf, CachingAllocator,
                                   get_allocation_size, round_size)

MiB = 1 << 20
GiB = 1 << 30


# --------------------------------------------------------------------------- sizes


def test_round_size_is_512_byte_blocks() -> None:
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(1_048_577) == 1_049_088


def test_round_size_with_power2_divisions() -> None:
    four = AllocConf.parse("roundup_power2_divisions:4")
    assert round_size(1200, four) == 1536  # 1200 <= 512 * 4: plain 512-byte blocks
    assert round_size(1200 * MiB, four) == 1280 * MiB  # [1 GiB, 2 GiB) in 4 steps of 256 MiB
    assert round_size(3 * MiB + 1, four) == 3 * MiB + MiB // 2
    assert round_size(GiB, four) == GiB  # a power of 2 stays
    ranged = AllocConf.parse("roundup_power2_divisions:[256:1,512:2,>:8]")
    assert round_size(1200 * MiB, ranged) == 1280 * MiB  # 8 steps of 128 MiB above 512 MiB
    assert round_size(300 * MiB + 1, ranged) == 300 * MiB + 512  # 256 MiB..: 1 division, no rounding


def test_segment_sizes() -> None:
    assert get_allocation_size(512) == K_SMALL_BUFFER == 2 * MiB
    assert get_allocation_size(MiB) == 2 * MiB
    assert get_allocation_size(MiB + 512) == K_LARGE_BUFFER == 20 * MiB
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB
    assert get_allocation_size(30 * MiB + 1) == 32 * MiB


# --------------------------------------------------------------------------- the cases


def test_a_1000_byte_tensor_reserves_2_mib() -> None:
    a = CachingAllocator(GiB)
    b = a.malloc(1000)
    assert b.size == 1024 and a.allocated == 1024 and a.reserved == 2 * MiB


def test_3_mib_then_12_mib_share_one_20_mib_segment() -> None:
    a = CachingAllocator(GiB)
    x, y = a.malloc(3 * MiB), a.malloc(12 * MiB)
    assert x.segment is y.segment and a.reserved == 20 * MiB and len(a.segments) == 1
    assert a.allocated == 15 * MiB


def test_a_30_mib_tensor_reserves_exactly_30_mib() -> None:
    a = CachingAllocator(GiB)
    a.malloc(30 * MiB)
    assert a.reserved == 30 * MiB and a.allocated == 30 * MiB


def test_freed_blocks_stay_reserved_until_empty_cache() -> None:
    a = CachingAllocator(GiB)
    blocks = [a.malloc(n) for n in (1000, 3 * MiB, 30 * MiB)]
    for b in blocks:
        a.free(b)
    assert a.allocated == 0 and a.reserved == 2 * MiB + 20 * MiB + 30 * MiB
    a.empty_cache()
    assert a.reserved == 0 and not a.segments


def test_a_freed_block_is_reused_and_merged_with_its_neighbours() -> None:
    a = CachingAllocator(GiB)
    x, y = a.malloc(3 * MiB), a.malloc(12 * MiB)
    a.free(x)
    a.free(y)
    st = a.memory_stats()
    assert st["inactive_split.all.current"] == 0  # merged back into one whole 20 MiB block
    z = a.malloc(20 * MiB)  # fits the whole segment exactly: no new cudaMalloc
    assert z.segment is x.segment and a.reserved == 20 * MiB and st["num_device_alloc"] == 1


def test_best_fit_takes_the_smallest_cached_block_that_fits() -> None:
    a = CachingAllocator(GiB)
    big, small = a.malloc(40 * MiB), a.malloc(30 * MiB)
    a.free(big)
    a.free(small)
    c = a.malloc(25 * MiB)  # 30 MiB is the smallest that fits; 5 MiB remain (> 1 MiB: split)
    assert c.segment is small.segment and a.reserved == 70 * MiB


def test_small_requests_pack_into_2_mib_segments() -> None:
    a = CachingAllocator(GiB)
    blocks = [a.malloc(256 * 1024) for _ in range(8)]  # 8 x 256 KiB = 2 MiB: one small segment
    assert a.reserved == 2 * MiB and len({id(b.segment) for b in blocks}) == 1
    a.malloc(1)
    assert a.reserved == 4 * MiB  # the ninth needs a second segment


# --------------------------------------------------------------------------- fragmentation and OOM


def _pinned() -> tuple[CachingAllocator, list]:
    """Three 20 MiB segments, each holding a 2 MiB tensor that stays and an 18 MiB one freed:
    60 MiB reserved on a 60 MiB device, 54 MiB of it cached but in three separate pieces."""
    a = CachingAllocator(60 * MiB)
    a.record_trace = True
    keep, drop = [], []
    for _ in range(3):  # all six first: a freed 18 MiB piece would take the next 2 MiB tensor (best fit)
        keep.append(a.malloc(2 * MiB))
        drop.append(a.malloc(18 * MiB))
    for b in drop:
        a.free(b)
    return a, keep


def test_fragmentation_raises_oom_for_less_than_the_cached_total() -> None:
    a, _ = _pinned()
    assert a.reserved == 60 * MiB and a.reserved - a.allocated == 54 * MiB
    with pytest.raises(AllocatorOOM) as err:
        a.malloc(30 * MiB)  # 30 MiB < 54 MiB cached, but no piece holds it and no segment is whole
    e = err.value
    assert e.requested == 30 * MiB and e.free == 0 and e.reserved - e.allocated == 54 * MiB
    st = a.memory_stats()
    assert st["num_ooms"] == 1 and st["num_alloc_retries"] == 1  # the last try, after release_cached_blocks
    assert st["inactive_split.all.current"] == 3 and st["inactive_split_bytes.all.current"] == 54 * MiB


def test_the_last_retry_releases_whole_cached_segments_and_succeeds() -> None:
    a = CachingAllocator(60 * MiB)
    a.free(a.malloc(40 * MiB))  # one whole cached 40 MiB segment
    b = a.malloc(45 * MiB)  # 46 MiB segment: 40 + 46 > 60; the cached segment is released, then it fits
    # 45 MiB rounds to a 46 MiB segment; 1 MiB would remain, not more than 1 MiB: no split
    assert b.size == 46 * MiB and a.reserved == 46 * MiB and len(a.segments) == 1
    st = a.memory_stats()
    assert st["num_alloc_retries"] == 1 and st["num_ooms"] == 0 and st["num_device_free"] == 1


def test_expandable_segments_grow_into_what_a_fixed_segment_wastes() -> None:
    """A 50 MiB tensor freed, a 40 MiB one in its place, then 56 MiB on a 100 MiB device:
    the fixed segment keeps 10 MiB stranded and 50 MiB + 56 MiB does not fit (OOM); an
    expandable segment maps its pages after the free tail and the request fits."""
    for expandable, fits in ((False, False), (True, True)):
        a = CachingAllocator(100 * MiB, AllocConf(expandable_segments=expandable))
        a.free(a.malloc(50 * MiB))
        a.malloc(40 * MiB)
        if fits:
            z = a.malloc(56 * MiB)
            assert z.size == 56 * MiB and a.reserved == 100 * MiB
            assert a.memory_stats()["num_alloc_retries"] == 0
        else:
            with pytest.raises(AllocatorOOM):
                a.malloc(56 * MiB)
            assert a.reserved == 50 * MiB and a.allocated == 40 * MiB


def test_expandable_segments_map_whole_pages_and_unmap_free_ones() -> None:
    a = CachingAllocator(GiB, AllocConf(expandable_segments=True))
    x = a.malloc(30 * MiB)  # two 20 MiB pages
    assert a.reserved == 40 * MiB
    y = a.malloc(1)  # small pool: one 2 MiB page of its own segment
    assert a.reserved == 42 * MiB
    a.free(x)
    a.free(y)
    a.empty_cache()
    assert a.reserved == 0
    st = a.memory_stats()
    assert st["num_device_alloc"] == 2 and st["num_device_free"] == 2


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    conf = AllocConf.parse("max_split_size_mb:100")
    a = CachingAllocator(GiB, conf)
    a.free(a.malloc(200 * MiB))
    small = a.malloc(50 * MiB)  # an oversize cached block is not given to a smaller request
    assert a.reserved == 250 * MiB and small.size == 50 * MiB
    within = a.malloc(210 * MiB)  # oversize, but 200 + 20 MiB > 210: the cached 200 MiB is too small
    assert within.size == 210 * MiB and a.reserved == 460 * MiB
    st = a.memory_stats()
    assert st["oversize_allocations.current"] == 1 and st["oversize_segments.current"] == 2
    assert st["max_split_size"] == 100 * MiB


def test_release_available_cached_blocks_frees_an_oversize_block_for_a_new_segment() -> None:
    conf = AllocConf.parse("max_split_size_mb:100")
    a = CachingAllocator(300 * MiB, conf)
    a.free(a.malloc(200 * MiB))
    keep = a.malloc(50 * MiB)
    c = a.malloc(150 * MiB)  # 250 + 150 > 300: the cached 200 MiB oversize block is released first
    assert a.reserved == 200 * MiB and c.size == 150 * MiB and keep.allocated
    assert a.memory_stats()["num_alloc_retries"] == 0  # freed by the second step, not the last retry


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("text, match", [
    ("max_split_size_mb:20", "too small"),
    ("expandable_segments:yes", "True or False"),
    ("garbage_collection_threshold:1.5", r"\(0.0, 1.0\)"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("no_such_option:1", "unknown option"),
    ("expandable_segments", "key:value"),
])
def test_a_bad_alloc_conf_gets_one_clear_message(text, match) -> None:
    with pytest.raises(ValueError, match=match):
        AllocConf.parse(text)


def test_alloc_conf_reads_torchs_options() -> None:
    c = AllocConf.parse("max_split_size_mb:128,expandable_segments:True,garbage_collection_threshold:0.6,"
                        "roundup_power2_divisions:[256:1,>:4],pinned_use_cuda_host_register:True")
    assert c.max_split_size == 128 * MiB and c.expandable_segments and c.garbage_collection_threshold == 0.6
    assert c.divisions_for(100 * MiB) == 1 and c.divisions_for(2 * GiB) == 4


def test_garbage_collection_releases_the_oldest_cached_segments_under_a_memory_fraction() -> None:
    """Threshold 0.5 of 100 MiB: with 86 MiB reserved (40 and 46 MiB cached), a 50 MiB request
    first releases the older cached segment (the 40 MiB one: two searches old, against one),
    reclaiming 40 >= 36 MiB, and fits without the retry; without GC the retry empties the cache."""
    def run(conf: AllocConf) -> CachingAllocator:
        a = CachingAllocator(100 * MiB, conf, memory_fraction=1.0)
        a.free(a.malloc(40 * MiB))
        a.free(a.malloc(45 * MiB))  # 46 MiB, no cached block fits it
        a.malloc(50 * MiB)
        return a

    gc = run(AllocConf.parse("garbage_collection_threshold:0.5"))
    assert gc.reserved == 96 * MiB and gc.memory_stats()["num_alloc_retries"] == 0
    plain = run(AllocConf())
    assert plain.reserved == 50 * MiB and plain.memory_stats()["num_alloc_retries"] == 1


# --------------------------------------------------------------------------- torch's formats


def test_memory_stats_use_torchs_keys_and_agree_with_the_readings() -> None:
    a = CachingAllocator(GiB)
    x = a.malloc(1000)
    a.malloc(3 * MiB)
    a.free(x)
    st = a.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "inactive_split_bytes.all.current",
                "requested_bytes.large_pool.current", "segment.small_pool.current", "num_alloc_retries",
                "num_ooms", "active_bytes.all.freed", "allocation.all.allocated"):
        assert key in st, key
    assert st["allocated_bytes.all.current"] == a.allocated == 3 * MiB
    assert st["reserved_bytes.all.current"] == a.reserved == 22 * MiB
    assert st["requested_bytes.all.current"] == 3 * MiB
    assert st["allocated_bytes.all.peak"] == 3 * MiB + 1024
    assert st["segment.all.current"] == 2 and st["segment.large_pool.current"] == 1


def test_the_snapshot_renders_with_torchs_own_memory_viz() -> None:
    torch = pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    a, _ = _pinned()
    snap = a.snapshot()
    assert sum(s["total_size"] for s in snap["segments"]) == a.reserved == 60 * MiB
    text = _memory_viz.segsum(snap)
    assert "segments: 3" in text and "total_reserved: 60.0MiB" in text and "total_free: 54.0MiB" in text
    assert "total_allocated: 6.0MiB" in text
    trace = _memory_viz.trace(snap)  # the recorded device trace, as torch prints it
    assert trace.count("cudaMalloc") == 3
    page = _memory_viz.segment_plot(snap)
    assert "<html>" in page and torch.__version__


def test_a_hand_written_trace_replays_to_the_same_segments() -> None:
    """A trace in torch's ``_snapshot()`` format, written by hand from the rules: a 3 MiB and a
    12 MiB tensor share one 20 MiB segment, the 3 MiB one is freed and a 1.5 MiB one takes its
    place (best fit: the 3 MiB block, split since 1.5 MiB > 1 MiB remain), then a 30 MiB tensor
    gets a segment of its own."""
    recorded = [
        {"action": "segment_alloc", "addr": 0x1000000, "size": 20 * MiB},
        {"action": "alloc", "addr": 0x1000000, "size": 3 * MiB},
        {"action": "alloc", "addr": 0x1300000, "size": 12 * MiB},
        {"action": "free_completed", "addr": 0x1000000, "size": 3 * MiB},
        {"action": "alloc", "addr": 0x1000000, "size": 3 * MiB // 2},
        {"action": "segment_alloc", "addr": 0x3000000, "size": 30 * MiB},
        {"action": "alloc", "addr": 0x3000000, "size": 30 * MiB},
    ]
    a = CachingAllocator(GiB)
    ours = a.replay(recorded)
    segs = [e["size"] for e in ours if e["action"] == "segment_alloc"]
    assert segs == [e["size"] for e in recorded if e["action"] == "segment_alloc"]
    blocks = [(b["size"], b["state"]) for s in a.snapshot()["segments"] for b in s["blocks"]]
    assert blocks == [(3 * MiB // 2, "active_allocated"), (3 * MiB // 2, "inactive"), (12 * MiB, "active_allocated"),
                      (5 * MiB, "inactive"), (30 * MiB, "active_allocated")]


def test_a_remainder_of_exactly_1_mib_is_not_split_off() -> None:
    """should_split for the large pool: more than kSmallSize (1 MiB) must remain."""
    a = CachingAllocator(GiB)
    x = a.malloc(3 * MiB)
    a.malloc(12 * MiB)
    a.free(x)
    assert a.malloc(2 * MiB).size == 3 * MiB
