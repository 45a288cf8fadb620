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
    # torch 2.13's messages (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp; the
    # c10 ones checked against this machine's libc10.so). max_split_size_mb:20 was refused here
    # before; torch 2.13 accepts it (>= large_segment_size_mb, 20): 19 is the first refused value.
    ("max_split_size_mb:19", "max_split_size_mb too small, must be >= 20"),
    ("expandable_segments:yes", "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'"),
    ("garbage_collection_threshold:1.5", r"\(0.0, 1.0\)"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("no_such_option:1", "Unrecognized key 'no_such_option' in Accelerator allocator config"),
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
    """Threshold 0.5 of 99 MiB allowed: with 86 MiB reserved (40 and 46 MiB cached), a 50 MiB
    request first releases the older cached segment (the 40 MiB one: two searches old, against
    one; the average is 1.5), reclaiming 40 >= 36.5 MiB, and fits without the retry; without GC
    the retry empties the cache.

    Corrected: this test used memory_fraction=1.0, under which torch runs no GC at all
    (``setMemoryFraction`` sets no maximum for 1.0, and ``malloc`` collects only
    ``if (allowed_memory_maximum.has_value() && garbage_collection_threshold() > 0.0)``); 0.99 is
    the fraction that exercises what it meant to test."""
    def run(conf: AllocConf) -> CachingAllocator:
        a = CachingAllocator(100 * MiB, conf, memory_fraction=0.99)
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


# --------------------------------------------------------------------------- the review's divergences
# (r3a, /work/shared/reviews/allocator-review.md): each test runs the review's program and asserts
# what torch 2.13's C++ does (c10/cuda/CUDACachingAllocator.cpp at huydhn/pytorch@82536757).


def test_d1_a_small_request_under_pressure_searches_the_small_pool_and_empties_the_cache() -> None:
    """``release_available_cached_blocks``: ``BlockPool& pool = *p.pool`` (the request's own
    pool). The small pool holds no oversize block, so it frees nothing; ``release_cached_blocks``
    then frees the whole 60 and 12 MiB segments, and the retry fits."""
    a = CachingAllocator(103 * MiB, AllocConf.parse("max_split_size_mb:40"))
    t12, m30, b60 = a.malloc(12 * MiB), a.malloc(30 * MiB), a.malloc(60 * MiB)
    for b in (t12, m30, b60):
        a.free(b)
    keep = a.malloc(25 * MiB)  # splits the 30 MiB segment
    a.malloc(1000)  # needs a 2 MiB small segment; 1 MiB is free on the device
    assert sorted(s.size for s in a.segments) == [2 * MiB, 30 * MiB] and keep.allocated
    assert a.reserved == 32 * MiB
    st = a.memory_stats()
    assert st["num_alloc_retries"] == 1 and st["num_sync_all_streams"] == 1


def test_d2_garbage_collection_frees_every_old_enough_segment_in_a_pass() -> None:
    """``garbage_collect_cached_blocks``: "Free blocks of > avg age. Don't stop upon reaching the
    target_size". Three 20 MiB segments of the same age (1) all go, though one reaches the target."""
    a = CachingAllocator(100 * MiB, AllocConf.parse("garbage_collection_threshold:0.5"), memory_fraction=0.9)
    blocks = [a.malloc(20 * MiB) for _ in range(3)]
    for b in blocks:
        a.free(b)
    a.malloc(30 * MiB)
    assert [s.size for s in a.segments] == [30 * MiB] and a.reserved == 30 * MiB
    assert a.memory_stats()["num_alloc_retries"] == 0


def test_d2_garbage_collection_repeats_with_the_new_average_age() -> None:
    """Ages 3, 1 and 1 (``gc_count``: large-pool ``get_free_block`` calls since each was cached;
    average 5/3): the first pass frees only the oldest, 20 MiB, short of the 21 MiB target
    (66 - 45); the second pass (average 1) frees the other two."""
    a = CachingAllocator(100 * MiB, AllocConf.parse("garbage_collection_threshold:0.5"), memory_fraction=0.9)
    a.free(a.malloc(20 * MiB))  # cached after the 1st get_free_block call of the large pool
    x = a.malloc(21 * MiB)  # 22 MiB; the cached 20 MiB is too small
    y = a.malloc(23 * MiB)  # 24 MiB
    a.free(x)
    a.free(y)
    z = a.malloc(30 * MiB)  # 66 MiB reserved > 0.5 * 90 MiB: all three segments go, in two passes
    assert a.segments == [z.segment] and a.reserved == 30 * MiB


def test_d3_a_fraction_rounds_and_only_below_1_sets_a_maximum() -> None:
    """``setMemoryFraction``: ``allowed = std::round(fraction * totalGlobalMem)``, only
    ``if (fraction < 1.0)``; ``getMemoryFraction`` is allowed / total, 1.0 without a maximum."""
    a = CachingAllocator(10, memory_fraction=0.25)
    assert a.allowed == 3 and a.memory_fraction == 0.3  # 2.5 rounds half away from zero
    a.set_memory_fraction(1.0)
    assert a.allowed is None and a.memory_fraction == 1.0
    a.set_memory_fraction(0.0)
    assert a.allowed == 0 and a.memory_fraction == 0.0
    with pytest.raises(ValueError, match="invalid fraction"):
        a.set_memory_fraction(1.5)
    b = CachingAllocator(100, memory_fraction=0.5, total_memory=1000)  # a fraction of totalGlobalMem
    assert b.allowed == 500


def test_d3_a_fraction_of_1_runs_no_garbage_collection() -> None:
    """The program of the GC test above with memory_fraction=1.0: no maximum, so no GC; the
    request fits only after the retry empties the cache."""
    a = CachingAllocator(100 * MiB, AllocConf.parse("garbage_collection_threshold:0.5"), memory_fraction=1.0)
    a.free(a.malloc(40 * MiB))
    a.free(a.malloc(45 * MiB))
    a.malloc(50 * MiB)
    assert a.reserved == 50 * MiB and a.memory_stats()["num_alloc_retries"] == 1


def test_d4_expandable_segments_check_the_fraction_on_the_segment_size_first() -> None:
    """``alloc_block``: ``if (allowed_memory_maximum.has_value() && total_allocated_memory + size >
    allowed_memory_maximum.value())`` with ``size = p.alloc_size``, before the expandable branch:
    40 + 26 > 62 MiB, so the free page is unmapped and the retry maps two pages."""
    a = CachingAllocator(100 * MiB, AllocConf(expandable_segments=True), memory_fraction=0.62)
    a.malloc(20 * MiB)
    a.free(a.malloc(20 * MiB))
    a.malloc(25 * MiB)
    st = a.memory_stats()
    assert st["num_alloc_retries"] == 1 and st["num_device_free"] == 1 and st["num_sync_all_streams"] == 1
    assert a.reserved == 60 * MiB


def test_d5_max_split_size_mb_may_equal_large_segment_size_mb() -> None:
    """``parseMaxSplitSize``: ``val_env >= large_segment_size_ / kMB`` (20 by default)."""
    assert AllocConf.parse("max_split_size_mb:20").max_split_size == 20 * MiB
    with pytest.raises(ValueError, match="max_split_size_mb too small, must be >= 32"):
        AllocConf.parse("max_split_size_mb:30,large_segment_size_mb:32")  # large_segment_size_mb is read first


def test_d6_max_non_split_rounding_mb_lets_an_oversize_request_take_a_larger_cached_block() -> None:
    """``get_free_block``: ``(*it)->size >= p.size() + max_non_split_rounding_size()`` refuses the
    block: 100 >= 70 + 20 by default (a new segment), 100 < 70 + 40 with the option (reused whole)."""
    for conf, size, reserved in (("max_split_size_mb:40", 70 * MiB, 170 * MiB),
                                 ("max_split_size_mb:40,max_non_split_rounding_mb:40", 100 * MiB, 100 * MiB)):
        a = CachingAllocator(GiB, AllocConf.parse(conf))
        a.free(a.malloc(100 * MiB))
        b = a.malloc(70 * MiB)
        assert b.size == size and a.reserved == reserved, conf
    assert AllocConf().max_non_split_rounding_size == 20 * MiB
    with pytest.raises(ValueError, match="max_non_split_rounding_mb too small, must be >= 20"):
        AllocConf.parse("max_non_split_rounding_mb:19")


def test_d7_large_segment_size_mb_sizes_medium_segments_and_large_pages() -> None:
    """``get_allocation_size``: ``size < kMinLargeAlloc`` gets ``large_segment_size()``;
    ``find_expandable_block``: the large pool's page is ``large_segment_size()``;
    ``parseLargeSegmentSize``: ``val_env > kMinLargeAlloc / kMB``."""
    conf = AllocConf.parse("large_segment_size_mb:32")
    assert conf.large_segment_size == 32 * MiB and conf.max_non_split_rounding_size == 32 * MiB
    assert get_allocation_size(3 * MiB, conf) == 32 * MiB
    a = CachingAllocator(GiB, conf)
    a.malloc(3 * MiB)
    assert a.reserved == 32 * MiB
    e = CachingAllocator(GiB, AllocConf.parse("large_segment_size_mb:32,expandable_segments:True"))
    e.malloc(30 * MiB)
    assert e.reserved == 32 * MiB  # one 32 MiB page (two 20 MiB pages by default)
    with pytest.raises(ValueError, match="large_segment_size_mb must be > 10 MB"):
        AllocConf.parse("large_segment_size_mb:10")


def test_d8_a_division_of_0_turns_rounding_off_for_its_interval() -> None:
    """``parseRoundUpPower2Divisions``: ``value == 0 || has_single_bit(value)`` in the list form;
    the single-value form still wants a power of 2."""
    conf = AllocConf.parse("roundup_power2_divisions:[256:0,>:4]")
    assert conf.divisions_for(300 * MiB) == 0 and conf.divisions_for(600 * MiB) == 4
    assert round_size(300 * MiB + 1, conf) == 300 * MiB + 512
    assert round_size(600 * MiB + 1, conf) == 640 * MiB
    with pytest.raises(ValueError, match="power of 2"):
        AllocConf.parse("roundup_power2_divisions:0")


@pytest.mark.parametrize("text, match", [
    ("release_lock_on_cudamalloc:none", "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'none'"),
    ("pinned_use_cuda_host_register:none", "Expected 'True' or 'False'"),
    ("pinned_num_register_threads:none", "integer"),
    ("pinned_num_register_threads:1024", "less than or equal to 128"),
    ("pinned_num_register_threads:3", "power of 2"),
    ("throw_on_cudamalloc_oom:1", "Expected 'True' or 'False'"),
    ("pinned_reserve_segment_size_mb:0", "greater than 0"),
])
def test_d9_cuda_options_are_validated_as_torch_validates_them(text, match) -> None:
    """``CUDAAllocatorConfig::parseArgs`` (torch's test_allocator_settings asserts these raise)."""
    with pytest.raises(ValueError, match=match):
        AllocConf.parse(text)


def test_d10_torch_2_13_options_are_accepted_and_kept() -> None:
    conf = AllocConf.parse("pinned_max_round_threshold_mb:64,pinned_max_cached_size_mb:512,throw_on_cudamalloc_oom:True,"
                           "release_lock_on_cudamalloc:True,pinned_num_register_threads:8,pinned_use_background_threads:True,"
                           "graph_capture_record_stream_reuse:True,pinned_free_catch_all:False")
    assert conf.pinned_max_round_threshold == 64 * MiB and conf.pinned_max_cached_size == 512 * MiB
    assert conf.throw_on_cudamalloc_oom and conf.release_lock_on_cudamalloc and conf.pinned_num_register_threads == 8
    assert conf.pinned_use_background_threads and conf.graph_capture_record_stream_reuse


def test_d10_d20_throw_on_cudamalloc_oom_rejects_before_the_retries() -> None:
    """``alloc_block``: with ``throw_on_cudamalloc_oom``, ``total_allocated_memory + size >
    per_process_memory_fraction * totalGlobalMem`` counts ``stats.num_oom_rejections++`` and
    fails; ``malloc`` then skips the retry chain and returns no block (no ``num_ooms``, no
    ``oom`` entry). Without the option the retry frees the cached 40 MiB and 70 MiB fits."""
    a = CachingAllocator(100 * MiB, AllocConf.parse("throw_on_cudamalloc_oom:True"))
    a.record_trace = True
    a.free(a.malloc(40 * MiB))
    with pytest.raises(AllocatorOOM) as err:
        a.malloc(70 * MiB)
    assert err.value.rejected and err.value.size == 70 * MiB and "preemptively rejected" in str(err.value)
    st = a.memory_stats()
    assert st["num_oom_rejections"] == 1 and st["num_ooms"] == 0 and st["num_alloc_retries"] == 0
    assert a.reserved == 40 * MiB and not any(e["action"] == "oom" for e in a.trace)
    plain = CachingAllocator(100 * MiB)
    plain.free(plain.malloc(40 * MiB))
    plain.malloc(70 * MiB)
    assert plain.reserved == 70 * MiB and plain.memory_stats()["num_oom_rejections"] == 0


def test_d11_per_process_memory_fraction_is_validated_and_applied() -> None:
    """``parsePerProcessMemoryFraction`` and the ``DeviceCachingAllocator`` constructor's
    ``setMemoryFraction(per_process_memory_fraction())``; the OOM knows what is allowed."""
    for bad in ("per_process_memory_fraction:1.1", "per_process_memory_fraction:-0.1"):
        with pytest.raises(ValueError, match=r"per_process_memory_fraction is invalid, set it in \[0.0, 1.0\]"):
            AllocConf.parse(bad)
    conf = AllocConf.parse("per_process_memory_fraction:0.5")
    assert conf.per_process_memory_fraction == 0.5 and AllocConf().per_process_memory_fraction is None
    a = CachingAllocator(GiB, conf)
    assert a.allowed == 512 * MiB and a.memory_fraction == 0.5
    with pytest.raises(AllocatorOOM) as err:
        a.malloc(600 * MiB)
    assert err.value.allowed == 512 * MiB and not err.value.rejected
    assert CachingAllocator(GiB, conf, memory_fraction=0.25).allowed == 256 * MiB  # the argument wins
    assert CachingAllocator(GiB).allowed is None and CachingAllocator(GiB).memory_fraction == 1.0


def test_d12_the_environment_is_read_as_torch_reads_it() -> None:
    """``AcceleratorAllocatorConfig::instance()``: the first of PYTORCH_CUDA_ALLOC_CONF,
    PYTORCH_HIP_ALLOC_CONF, PYTORCH_ALLOC_CONF that is set (even empty) wins; the CUDA keys come
    from PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF (``CUDAAllocatorConfig::instance()``). The
    order of the c10 part was checked with this machine's torch 2.13 (_accelerator_getAllocatorSettings)."""
    assert AllocConf.from_environ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}).expandable_segments
    both = AllocConf.from_environ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:41",
                                   "PYTORCH_ALLOC_CONF": "max_split_size_mb:40,expandable_segments:True"})
    assert both.max_split_size == 41 * MiB and not both.expandable_segments and both.text == "max_split_size_mb:41"
    assert not AllocConf.from_environ({"PYTORCH_CUDA_ALLOC_CONF": "",
                                       "PYTORCH_ALLOC_CONF": "expandable_segments:True"}).expandable_segments
    hip = AllocConf.from_environ({"PYTORCH_HIP_ALLOC_CONF": "max_split_size_mb:40",
                                  "PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.5,expandable_segments:True"})
    assert hip.max_split_size == 40 * MiB and not hip.expandable_segments and hip.per_process_memory_fraction == 0.5
    assert AllocConf.from_environ({}) == AllocConf()
    with pytest.raises(ValueError, match="Unrecognized key"):
        AllocConf.from_environ({"PYTORCH_ALLOC_CONF": "expandable:True"})


def test_d13_backend_is_parsed_and_validated() -> None:
    """``CUDAAllocatorConfig::parseAllocatorConfig``: native or cudaMallocAsync."""
    assert AllocConf().backend == "native"
    assert AllocConf.parse("backend:cudaMallocAsync").backend == "cudaMallocAsync"
    with pytest.raises(ValueError, match="Unknown allocator backend, options are native and cudaMallocAsync"):
        AllocConf.parse("backend:jemalloc")
    with pytest.warns(UserWarning, match="backend:cudaMallocAsync ignores"):
        AllocConf.parse("backend:cudaMallocAsync,release_lock_on_cudamalloc:True")


def test_d14_segment_map_reports_the_new_pages() -> None:
    """``map_block``: ``record_trace(TraceEntry::SEGMENT_MAP, int64_t(mapped_range.ptr), ...)``,
    the start of the newly mapped pages, though they merge with the free block before them."""
    a = CachingAllocator(GiB, AllocConf(expandable_segments=True))
    a.record_trace = True
    a.free(a.malloc(10 * MiB))
    a.malloc(30 * MiB)
    base = a.segments[0].address
    maps = [(e["addr"] - base, e["size"]) for e in a.trace if e["action"] == "segment_map"]
    assert maps == [(0, 20 * MiB), (20 * MiB, 20 * MiB)]


_ENTRY_KEYS = {"action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata", "pool_id", "frames"}


def test_d15_the_oom_entry_has_device_free_and_the_rounded_request() -> None:
    """``malloc``'s OOM: ``record_trace(TraceEntry::OOM, device_free, params.size(), ...)``, written
    as ``trace_entry[OOM == te.action_ ? device_free_s : addr_s]``; no other entry has device_free."""
    a = CachingAllocator(10 * MiB)
    a.record_trace = True
    a.malloc(1000)
    with pytest.raises(AllocatorOOM):
        a.malloc(3 * MiB)  # a 20 MiB segment does not fit
    oom = a.trace[-1]
    assert oom["action"] == "oom" and "addr" not in oom
    assert oom["device_free"] == 8 * MiB and oom["size"] == 3 * MiB
    assert set(oom) == _ENTRY_KEYS - {"addr"} | {"device_free"}
    assert all(set(e) == _ENTRY_KEYS for e in a.trace[:-1])


def test_d16_a_snapshot_records_a_snapshot_entry_seen_by_the_next_one() -> None:
    """``DeviceCachingAllocator::snapshot``: ``record_trace(TraceEntry::SNAPSHOT, 0, total_active,
    ...)`` after ``NativeCachingAllocator::snapshot`` has read the trace."""
    a = CachingAllocator(GiB)
    a.record_trace = True
    a.malloc(3 * MiB)
    a.free(a.malloc(1000))
    first = a.snapshot()
    assert [e["action"] for e in first["device_traces"][0]].count("snapshot") == 0
    last = a.snapshot()["device_traces"][0][-1]
    assert last["action"] == "snapshot" and last["addr"] == 0 and last["size"] == 3 * MiB
    assert "frames" not in last  # recorded with no context


def test_d17_a_freed_block_keeps_its_last_requested_size() -> None:
    """``snapshot``: ``block_info.requested_size = block->requested_size``, which ``free_block`` and
    ``try_merge_blocks`` leave as it was; a segment's requested_size counts active blocks only."""
    a = CachingAllocator(GiB)
    x = a.malloc(3 * MiB)
    a.malloc(MiB + 1)
    a.free(x)
    seg = a.snapshot()["segments"][0]
    blocks = [(b["size"], b["requested_size"], b["state"]) for b in seg["blocks"]]
    assert blocks[:2] == [(3 * MiB, 3 * MiB, "inactive"), (MiB + 512, MiB + 1, "active_allocated")]
    assert seg["requested_size"] == MiB + 1
    assert a.memory_stats()["requested_bytes.all.current"] == MiB + 1


def test_d18_the_snapshot_carries_torchs_allocator_settings() -> None:
    """``NativeCachingAllocator::snapshot``'s ``config_metadata`` as torch/csrc/cuda writes it."""
    text = "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4],garbage_collection_threshold:0.6"
    s = CachingAllocator(GiB, AllocConf.parse(text)).snapshot()
    settings = s["allocator_settings"]
    assert set(s) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert settings["PYTORCH_CUDA_ALLOC_CONF"] == text and settings["max_split_size"] == 64 * MiB
    assert settings["garbage_collection_threshold"] == 0.6 and settings["expandable_segments"] is False
    assert settings["pinned_num_register_threads"] == 1 and settings["max_round_threshold"] == -1
    assert settings["max_cached_size"] == -1 and settings["release_lock_on_cudamalloc"] is False
    assert settings["pinned_use_cuda_host_register"] is False and settings["graph_capture_record_stream_reuse"] is False
    assert list(settings["roundup_power2_divisions"]) == [str(1 << i) for i in range(16)]
    assert settings["roundup_power2_divisions"]["256"] == 1 and settings["roundup_power2_divisions"]["512"] == 4
    assert CachingAllocator(GiB).snapshot()["allocator_settings"]["max_split_size"] == -1


def test_d18_trace_entries_carry_compile_context_and_user_metadata() -> None:
    """``record_trace``: ``compile_string = "N/A"`` unless a compile context is pushed; the
    thread's ``user_metadata``."""
    a = CachingAllocator(GiB)
    a.record_trace = True
    a.malloc(1000)
    a.set_user_metadata("step 3")
    a.push_compile_context("forward")
    a.malloc(2000)
    a.pop_compile_context()
    first, second = a.trace[0], a.trace[-1]
    assert (first["compile_context"], first["user_metadata"]) == ("N/A", "")
    assert (second["compile_context"], second["user_metadata"]) == ("forward", "step 3")


_ALLOC_AT = [{"filename": "train.py", "line": 10, "name": "forward"}]
_FREE_AT = [{"filename": "train.py", "line": 20, "name": "backward"}]


@pytest.mark.parametrize("context, block_frames, alloc_frames, free_frames", [
    ("all", _ALLOC_AT, _ALLOC_AT, _FREE_AT),  # free's stack: maybeGatherContext(RecordContext::ALL)
    ("alloc", _ALLOC_AT, _ALLOC_AT, _ALLOC_AT),  # free entries fall back on context_when_allocated
    ("state", _ALLOC_AT, None, None),  # stacks on blocks only: record_context_ >= ALLOC for the trace
    (None, [], None, None),
])
def test_d18_frames_follow_the_recording_context(context, block_frames, alloc_frames, free_frames) -> None:
    """``malloc`` gathers at ``RecordContext::STATE``, ``free`` at ``ALL``; ``record_trace`` keeps
    a context only ``if record_context_ >= RecordContext::ALLOC``; ``free_locked``/``free_block``
    record ``context ? context : block->context_when_allocated``. No context: no ``frames`` key."""
    a = CachingAllocator(GiB)
    a.set_record_history(True, context=context)
    a.malloc(1000)  # no frames: torch's frames would be the caller's; here the caller gives them
    x = a.malloc(30 * MiB, frames=_ALLOC_AT)
    seg = next(s for s in a.snapshot()["segments"] if s["total_size"] == 30 * MiB)
    assert seg["blocks"][0]["frames"] == block_frames and seg["frames"] == block_frames
    a.free(x, frames=_FREE_AT)
    by_action = {e["action"]: e for e in a.trace}
    for action, frames in (("alloc", alloc_frames), ("segment_alloc", alloc_frames),
                           ("free_requested", free_frames), ("free_completed", free_frames)):
        assert by_action[action].get("frames") == frames, action
    assert by_action["snapshot"].get("frames") is None
    assert a.snapshot()["segments"][1]["blocks"][0]["frames"] == []  # freed: context_when_allocated = nullptr


def test_d19_disabling_the_history_clears_it_and_max_entries_is_a_ring_buffer() -> None:
    """``recordHistory``: ``alloc_buffer.setMaxEntries(...)``; ``if (!enabled || clearHistory)
    alloc_buffer.clear()``; ``RingBuffer::insertEntries`` overwrites the oldest entry."""
    a = CachingAllocator(GiB)
    a.set_record_history(True, max_entries=3)
    for _ in range(3):
        a.malloc(1000)
    a.malloc(30 * MiB)  # segment_alloc, alloc
    assert [e["action"] for e in a.trace] == ["alloc", "segment_alloc", "alloc"]
    assert a.trace[-1]["size"] == 30 * MiB
    a.set_record_history(True, clear=True)
    assert a.trace == [] and a.record_trace
    a.malloc(1000)
    a.record_trace = False  # what VirtualGPU.record_memory_history(False) sets
    assert a.trace == [] and not a.record_trace
    a.malloc(1000)
    assert a.trace == []
    a.set_record_history(True, skip_actions=["alloc"])
    a.malloc(30 * MiB)
    assert [e["action"] for e in a.trace] == ["segment_alloc"]
