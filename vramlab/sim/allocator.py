"""PyTorch's CUDA caching allocator, its policy ported to Python, for the virtual GPU.

A real card does not run out of memory when the bytes of live tensors reach its size: it runs
out when PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``) can neither find a
cached block nor get a new segment from ``cudaMalloc``. This module makes the same decisions on
numbers alone (no memory, no torch), so that a :class:`~vramlab.VirtualGPU` has what
``torch.cuda`` reports: allocated and reserved bytes, cached blocks, fragmentation,
``empty_cache()``, ``memory_stats()`` with torch's key names, ``memory_snapshot()`` in torch's
format, and the OOM where the allocator would raise it.

What is ported (the rules and constants of the C++ file, torch 2.11-2.13):

- sizes rounded as ``round_size``: at least 512 bytes, a multiple of 512, or the next power-of-2
  division with ``roundup_power2_divisions``;
- two pools: small (requests up to 1 MiB) and large;
- new segments sized as ``get_allocation_size``: 2 MiB for a small request, 20 MiB for a large one
  under 10 MiB, else the request rounded up to 2 MiB;
- best fit (the smallest cached block that is large enough, the lowest address on a tie), with
  ``max_split_size``'s rules: an oversize block (``>= max_split_size``) is not given to a smaller
  request, nor to an oversize request it exceeds by ``kLargeBuffer`` (20 MiB) or more;
- splitting as ``should_split``: a small-pool block when at least 512 bytes remain, a large-pool
  block when the request is under ``max_split_size`` and more than 1 MiB remains (with expandable
  segments, whenever 512 bytes remain);
- freeing: a block is merged with its free neighbours in the same segment;
- on a miss: a new segment; if the device has no room, the smallest cached oversize block that
  is large enough (or oversize blocks, largest first, until enough) is released and the new
  segment tried again; then every cached whole segment is released and it is tried a last time
  (``num_alloc_retries`` counts this last try); then the OOM (``num_ooms``);
- ``empty_cache()`` releases every cached segment that holds no allocated block;
- ``expandable_segments:True``: one segment per pool that grows by pages (2 MiB in the small pool,
  20 MiB in the large) and whose unused pages ``empty_cache()`` unmaps;
- ``garbage_collection_threshold`` (with a memory fraction, as in torch): before a new segment, the
  oldest cached whole segments are released until reserved memory is under the threshold.

Not modelled: streams (everything is on one stream, so no events or cross-stream frees),
CUDA graphs and private pools, ``pinned_use_cuda_host_register``, and the allocator's own
bookkeeping of the request stack traces. All sizes are in bytes.
"""

from __future__ import annotations

import bisect
import itertools
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

__all__ = ["AllocConf", "CachingAllocator", "Block", "Segment", "AllocatorOOM", "round_size",
           "get_allocation_size", "K_MIN_BLOCK_SIZE", "K_SMALL_SIZE", "K_SMALL_BUFFER", "K_LARGE_BUFFER",
           "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE"]

MiB = 1 << 20
#: all sizes are rounded to at least 512 bytes (``kMinBlockSize``)
K_MIN_BLOCK_SIZE = 512
#: largest "small" allocation is 1 MiB (``kSmallSize``)
K_SMALL_SIZE = 1 * MiB
#: "small" allocations are packed in 2 MiB blocks (``kSmallBuffer``)
K_SMALL_BUFFER = 2 * MiB
#: "large" allocations may be packed in 20 MiB blocks (``kLargeBuffer``)
K_LARGE_BUFFER = 20 * MiB
#: allocations between 1 and 10 MiB may use ``kLargeBuffer`` (``kMinLargeAlloc``)
K_MIN_LARGE_ALLOC = 10 * MiB
#: round up large allocations to 2 MiB (``kRoundLarge``)
K_ROUND_LARGE = 2 * MiB

_NO_LIMIT = sys.maxsize


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class AllocConf:
    """The options of ``PYTORCH_CUDA_ALLOC_CONF`` that change the policy.

    Attributes:
        max_split_size: blocks this large or larger are never split (bytes; no limit by default).
        roundup_power2_divisions: ``((interval start, divisions), ...)`` as the option gives them
            (a start in bytes, a power of 2 of MiB; 0 for ``>``, the intervals after the last one
            given; ``((-1, d),)`` for a single number, every interval): a request rounds up to the
            next of ``divisions`` steps between the powers of 2 around it; ``()`` for none.
        expandable_segments: segments that grow by pages instead of new ``cudaMalloc`` calls.
        garbage_collection_threshold: a fraction in (0, 1): with a memory fraction set, cached
            segments are released before reserved memory passes it; 0 for off.
    """

    max_split_size: int = _NO_LIMIT
    roundup_power2_divisions: tuple[tuple[int, int], ...] = ()
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0

    @classmethod
    def parse(cls, text: Optional[str]) -> "AllocConf":
        """Read a ``PYTORCH_CUDA_ALLOC_CONF`` string (``"max_split_size_mb:128,expandable_segments:True"``);
        options that do not change the policy (``pinned_use_cuda_host_register``, ...) are accepted
        and ignored, an unknown or malformed one is one ``ValueError``."""
        kw: dict[str, Any] = {}
        if not text:
            return cls()
        for item in _split_options(text):
            key, sep, value = item.partition(":")
            key, value = key.strip(), value.strip()
            if not sep or not value:
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected key:value, got {item!r}")
            if key == "max_split_size_mb":
                mb = _int(key, value)
                if mb <= K_LARGE_BUFFER // MiB:  # torch: "CachingAllocator option max_split_size_mb too small, must be > 20"
                    raise ValueError(f"max_split_size_mb too small, must be > {K_LARGE_BUFFER // MiB}; got {mb}")
                kw["max_split_size"] = mb * MiB
            elif key == "roundup_power2_divisions":
                kw["roundup_power2_divisions"] = _divisions(value)
            elif key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError(f"expandable_segments must be True or False; got {value!r}")
                kw["expandable_segments"] = value == "True"
            elif key == "garbage_collection_threshold":
                try:
                    t = float(value)
                except ValueError:
                    raise ValueError(f"garbage_collection_threshold must be a number; got {value!r}") from None
                if not 0.0 < t < 1.0:
                    raise ValueError(f"garbage_collection_threshold must be in (0.0, 1.0); got {value}")
                kw["garbage_collection_threshold"] = t
            elif key in ("backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                         "pinned_num_register_threads", "pinned_use_background_threads", "graph_capture_record_stream_reuse",
                         "per_process_memory_fraction", "pinned_reserve_segment_size_mb"):
                continue
            else:
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: unknown option {key!r}")
        return cls(**kw)

    def divisions_for(self, size: int) -> int:
        """The power-of-2 divisions for a request of ``size`` bytes (``roundup_power2_divisions(size)``:
        16 intervals, the first below 2 MiB, then one per power of 2 up to 32 GiB and above)."""
        if not self.roundup_power2_divisions:
            return 0
        index = min(max(size.bit_length() - 1 - 20, 0), _INTERVALS - 1)
        return _division_table(self.roundup_power2_divisions)[index]


_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB


def _division_table(spec: tuple[tuple[int, int], ...]) -> list[int]:
    """The 16-entry table ``parseRoundUpPower2Divisions`` fills from ``(interval start in bytes, divisions)``
    pairs (``0`` as the start: ``>``, every interval after the last one given; a lone pair ``(-1, d)``: all)."""
    table = [0] * _INTERVALS
    if len(spec) == 1 and spec[0][0] == -1:
        return [spec[0][1]] * _INTERVALS
    first, last = True, 0
    for start, div in spec:
        if start == 0:
            for i in range(last + 1, _INTERVALS):
                table[i] = div
            continue
        index = min(max((start // MiB).bit_length() - 1, 0), _INTERVALS - 1)
        if first:
            for i in range(index):
                table[i] = div
            first = False
        table[index] = div
        last = index
    return table


def _split_options(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [o.strip() for o in out if o.strip()]


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer; got {value!r}") from None


def _power2(key: str, n: int) -> int:
    if n <= 0 or n & (n - 1):
        raise ValueError(f"{key}: {n} is not a power of 2")
    return n


def _divisions(value: str) -> tuple[tuple[int, int], ...]:
    """``4`` (every size) or ``[256:1,512:2,>:8]`` (bounds in MiB, ``>`` for the rest)."""
    if not value.startswith("["):
        return ((-1, _power2("roundup_power2_divisions", _int("roundup_power2_divisions", value))),)
    out: list[tuple[int, int]] = []
    for part in value.strip("[]").split(","):
        bound, _, div = part.partition(":")
        d = _power2("roundup_power2_divisions", _int("roundup_power2_divisions", div.strip()))
        if bound.strip() == ">":
            out.append((0, d))
        else:
            out.append((_power2("roundup_power2_divisions", _int("roundup_power2_divisions", bound.strip())) * MiB, d))
    return tuple(out)


# --------------------------------------------------------------------------- sizes


def round_size(size: int, conf: AllocConf = AllocConf()) -> int:
    """``round_size``: the bytes a request of ``size`` takes: at least 512, a multiple of 512,
    or with ``roundup_power2_divisions`` the next division of the power-of-2 interval (for
    requests above ``512 * divisions``)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = conf.divisions_for(size)
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return _roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:  # a power of 2 already
        return size
    # divide the interval [2^(n-1), 2^n) into `divisions` steps and round up to the next step
    power2_floor = 1 << (size.bit_length() - 1)
    power2_division = power2_floor >> int(math.log2(divisions))
    if power2_division == 0:
        return power2_floor << 1
    return ((size + power2_division - 1) // power2_division) * power2_division


def get_allocation_size(size: int) -> int:
    """``get_allocation_size``: the size of the segment ``cudaMalloc`` gets for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


# --------------------------------------------------------------------------- blocks and segments


class Segment:
    """One ``cudaMalloc`` (or one expandable reservation): ``address``, ``size`` mapped, its pool."""

    __slots__ = ("address", "size", "small", "expandable", "first", "reserve", "counter")

    def __init__(self, address: int, size: int, small: bool, expandable: bool, reserve: int = 0,
                 counter: int = 0) -> None:
        self.counter = counter      # the registration counter: segments in creation order
        self.address = address
        self.size = size            # bytes mapped (reserved on the device)
        self.small = small
        self.expandable = expandable
        self.first: Optional[Block] = None
        self.reserve = reserve      # expandable: the virtual range reserved (bytes)

    def blocks(self) -> Iterator["Block"]:
        b = self.first
        while b is not None:
            yield b
            b = b.next


class Block:
    """A piece of a segment: ``size`` bytes at ``address``, allocated or cached, with the
    ``requested`` bytes of its tensor when allocated. ``mapped`` is false for the unmapped tail
    of an expandable segment."""

    __slots__ = ("size", "requested", "address", "segment", "allocated", "prev", "next", "gc_count", "mapped")

    def __init__(self, segment: Segment, address: int, size: int) -> None:
        self.segment = segment
        self.address = address
        self.size = size
        self.requested = 0
        self.allocated = False
        self.prev: Optional[Block] = None
        self.next: Optional[Block] = None
        self.gc_count = 0
        self.mapped = True

    @property
    def is_split(self) -> bool:
        """Part of a segment shared with other blocks (``Block::is_split``)."""
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("cached" if self.mapped else "unmapped")
        return f"<Block {self.size} bytes at {self.address:#x}, {state}>"


class AllocatorOOM(Exception):
    """The allocator could not serve a request: ``requested`` is the segment size it tried to get
    (``alloc_size``, what torch's message reports as "Tried to allocate"), and the device's
    ``total``, ``free``, ``allocated`` and ``reserved`` bytes when it gave up."""

    def __init__(self, requested: int, total: int, free: int, allocated: int, reserved: int) -> None:
        super().__init__(f"out of memory: tried to allocate {requested} bytes")
        self.requested, self.total, self.free = requested, total, free
        self.allocated, self.reserved = allocated, reserved


class _Pool:
    """The cached (free, mapped) blocks of one pool, ordered as ``BlockComparatorSizeCounterAddress``:
    by size, then the registration counter of their segment, then address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], Block] = {}

    @staticmethod
    def key(b: Block) -> tuple[int, int, int]:
        return (b.size, b.segment.counter, b.address)

    def insert(self, b: Block) -> None:
        k = self.key(b)
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: Block) -> None:
        k = self.key(b)
        i = bisect.bisect_left(self.keys, k)
        if i < len(self.keys) and self.keys[i] == k:
            del self.keys[i]
            del self.blocks[k]

    def lower_bound(self, size: int) -> Optional[int]:
        """The index of the first block of at least ``size`` bytes, or ``None``."""
        i = bisect.bisect_left(self.keys, (size, -1, -1))
        return i if i < len(self.keys) else None

    def at(self, i: int) -> Block:
        return self.blocks[self.keys[i]]

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[Block]:
        return iter([self.blocks[k] for k in self.keys])


@dataclass
class _Stat:
    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def add(self, n: int) -> None:
        if n >= 0:
            self.allocated += n
        else:
            self.freed -= n
        self.current += n
        if self.current > self.peak:
            self.peak = self.current


_STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
               "active_bytes", "inactive_split_bytes", "requested_bytes")


@dataclass
class _Stats:
    by: dict[tuple[str, str], _Stat] = field(default_factory=dict)
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    num_sync_all_streams: int = 0
    oversize_allocations: _Stat = field(default_factory=_Stat)
    oversize_segments: _Stat = field(default_factory=_Stat)

    def __post_init__(self) -> None:
        for name in _STAT_NAMES:
            for pool in ("all", "small_pool", "large_pool"):
                self.by[(name, pool)] = _Stat()

    def add(self, name: str, small: bool, n: int) -> None:
        self.by[(name, "all")].add(n)
        self.by[(name, "small_pool" if small else "large_pool")].add(n)


# --------------------------------------------------------------------------- the allocator


class CachingAllocator:
    """The caching allocator of one device of ``capacity`` bytes (what ``cudaMalloc`` may hand
    out: the card's memory less the CUDA context), under ``conf``. ``memory_fraction``: as
    ``torch.cuda.set_per_process_memory_fraction`` (it caps reserved memory and turns on
    ``garbage_collection_threshold``).

    ``malloc(n)`` returns a :class:`Block` or raises :class:`AllocatorOOM`; ``free(block)``
    caches it. Readings in bytes: ``allocated``, ``reserved``, ``peak_allocated``,
    ``peak_reserved``; ``memory_stats()`` and ``snapshot()`` as torch's.
    """

    BASE_ADDRESS = 0x7F0000000000

    def __init__(self, capacity: int, conf: Optional[AllocConf] = None, memory_fraction: Optional[float] = None,
                 device: int = 0) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive; got {capacity}")
        if memory_fraction is not None and not 0.0 <= memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in [0, 1]; got {memory_fraction}")
        self.capacity = int(capacity)
        self.conf = conf or AllocConf()
        self.memory_fraction = memory_fraction
        self.allowed = self.capacity if memory_fraction is None else int(memory_fraction * self.capacity)
        self.device = device
        self.small_pool = _Pool(True)
        self.large_pool = _Pool(False)
        self.segments: list[Segment] = []
        self.stats = _Stats()
        self.trace: list[dict[str, Any]] = []
        self.record_trace = False
        self._next_address = self.BASE_ADDRESS
        self._clock = itertools.count()
        self._counter = itertools.count(1)

    # ------------------------------------------------------------------ readings

    @property
    def allocated(self) -> int:
        """Bytes in allocated blocks (``memory_allocated``)."""
        return self.stats.by[("allocated_bytes", "all")].current

    @property
    def reserved(self) -> int:
        """Bytes in segments (``memory_reserved``): allocated plus cached."""
        return self.stats.by[("reserved_bytes", "all")].current

    @property
    def peak_allocated(self) -> int:
        return self.stats.by[("allocated_bytes", "all")].peak

    @property
    def peak_reserved(self) -> int:
        return self.stats.by[("reserved_bytes", "all")].peak

    @property
    def device_free(self) -> int:
        """Device bytes no segment holds (``cudaMemGetInfo``'s free, the context aside)."""
        return self.capacity - self.reserved

    def reset_peak(self) -> None:
        """``reset_peak_memory_stats``: every peak set to its current value."""
        for s in self.stats.by.values():
            s.peak = s.current
        for s in (self.stats.oversize_allocations, self.stats.oversize_segments):
            s.peak = s.current

    # ------------------------------------------------------------------ malloc

    def malloc(self, orig_size: int) -> Block:
        """Allocate a block for a request of ``orig_size`` bytes (``DeviceCachingAllocator::malloc``)."""
        size = round_size(orig_size, self.conf)
        small = size <= K_SMALL_SIZE
        pool = self.small_pool if small else self.large_pool
        alloc_size = get_allocation_size(size)
        block = self._get_free_block(pool, size)
        if block is None:
            if self.memory_fraction is not None and self.conf.garbage_collection_threshold > 0:
                self._garbage_collect_cached_blocks()
            block = (self._alloc_block(pool, size, alloc_size, retry=False)
                     or (self._release_available_cached_blocks(size) and
                         self._alloc_block(pool, size, alloc_size, retry=False))
                     or (self._release_cached_blocks() and self._alloc_block(pool, size, alloc_size, retry=True))
                     or None)
        if block is None:
            self.stats.num_ooms += 1
            self._record("oom", 0, alloc_size)
            raise AllocatorOOM(alloc_size, self.capacity, self.device_free, self.allocated, self.reserved)
        return self._alloc_found_block(block, pool, orig_size, size)

    def _get_free_block(self, pool: _Pool, size: int) -> Optional[Block]:
        if self.memory_fraction is not None and self.conf.garbage_collection_threshold > 0:
            for cached in pool:  # "track block reuse interval only when garbage collection is enabled"
                cached.gc_count += 1
        i = pool.lower_bound(size)
        if i is None:
            return None
        b = pool.at(i)
        if b.segment.expandable:
            # best fit counts an expandable block as large as it can grow (its unmapped tail too)
            def grows_to(x: Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            while b.segment.expandable and i + 1 < len(pool) and grows_to(pool.at(i + 1)) < grows_to(b):
                i += 1
                b = pool.at(i)
        mss = self.conf.max_split_size
        if size < mss and b.size >= mss:  # "Do not return an oversized block for a large request"
            return None
        if size >= mss and b.size >= size + K_LARGE_BUFFER:  # oversize rounding within max_non_split_rounding_size
            return None
        pool.remove(b)
        b.gc_count = 0
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.segment.small or self.conf.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.conf.max_split_size and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, block: Block, pool: _Pool, orig_size: int, size: int) -> Block:
        small = block.segment.small
        already_split = block.is_split
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.segment, remaining.address, size)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            else:
                remaining.segment.first = block
            block.next = remaining
            remaining.prev = block
            remaining.address += size
            remaining.size -= size
            pool.insert(remaining)
            if already_split and not block.segment.expandable:  # an inactive split shrinks
                self.stats.add("inactive_split_bytes", small, -block.size)
            elif not block.segment.expandable:  # a new inactive split: the remaining piece
                self.stats.add("inactive_split_bytes", small, remaining.size)
                self.stats.add("inactive_split", small, 1)
        elif already_split and not block.segment.expandable:
            self.stats.add("inactive_split_bytes", small, -block.size)
            self.stats.add("inactive_split", small, -1)
        block.allocated = True
        block.requested = orig_size
        self.stats.add("allocation", small, 1)
        self.stats.add("allocated_bytes", small, block.size)
        self.stats.add("active", small, 1)
        self.stats.add("active_bytes", small, block.size)
        self.stats.add("requested_bytes", small, orig_size)
        if block.size >= self.conf.max_split_size:
            self.stats.oversize_allocations.add(1)
        self._record("alloc", block.address, orig_size)
        return block

    def _device_alloc(self, size: int) -> bool:
        """``cudaMalloc`` (or mapping pages): whether the device and the memory fraction have room."""
        return self.reserved + size <= self.allowed

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, retry: bool) -> Optional[Block]:
        if retry:
            self.stats.num_alloc_retries += 1
        if self.conf.expandable_segments:
            return self._alloc_expandable(pool, size)
        if not self._device_alloc(alloc_size):
            return None
        seg = Segment(self._next_address, alloc_size, pool.small, False, counter=next(self._counter))
        self._next_address += -(-alloc_size // K_SMALL_BUFFER) * K_SMALL_BUFFER
        self.segments.append(seg)
        b = Block(seg, seg.address, alloc_size)
        seg.first = b
        self.stats.num_device_alloc += 1
        self.stats.add("segment", pool.small, 1)
        self.stats.add("reserved_bytes", pool.small, alloc_size)
        if alloc_size >= self.conf.max_split_size:
            self.stats.oversize_segments.add(1)
        self._record("segment_alloc", seg.address, alloc_size)
        return b

    # ------------------------------------------------------------------ expandable segments

    def _page(self, small: bool) -> int:
        return K_SMALL_BUFFER if small else K_LARGE_BUFFER

    def _alloc_expandable(self, pool: _Pool, size: int) -> Optional[Block]:
        """``try_allocate_expandable_block``: find room (free or unmapped) in an expandable
        segment of the pool, map what is missing in whole pages, return the mapped block."""
        c = self._find_expandable_block(pool, size)
        if not c.mapped:
            first = self._map_block(c, min(c.size, size), pool)
            if first is None:
                return None
            c = first
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped  # invariant: free -> unmapped -> *
            c2 = self._map_block(nxt, min(size - c.size, nxt.size), pool)
            if c2 is None:
                return None
            c = c2
        pool.remove(c)
        return c

    def _find_expandable_block(self, pool: _Pool, size: int) -> Block:
        """``find_expandable_block``: the first unmapped block (in address order), or the free
        block just before it, with ``size`` bytes of free or unmapped room from there; else a new
        expandable segment (1 1/8 of the device's memory of address space, all unmapped)."""
        def allocatable(b: Optional[Block]) -> bool:
            return b is not None and not b.allocated

        def room(b: Optional[Block]) -> bool:
            n = 0
            while n < size and b is not None and allocatable(b):
                n += b.size
                b = b.next
            return n >= size

        for seg in sorted((x for x in self.segments if x.expandable and x.small == pool.small),
                          key=lambda x: x.address):
            for u in [x for x in seg.blocks() if not x.mapped]:
                c = u.prev if (u.prev is not None and u.prev.mapped and allocatable(u.prev)) else u
                if room(c):
                    return c
        page = self._page(pool.small)
        reserve = -(-(self.capacity + self.capacity // 8) // page) * page
        seg = Segment(self._next_address, 0, pool.small, True, reserve, counter=next(self._counter))
        self._next_address += reserve + page
        tail = Block(seg, seg.address, reserve)
        tail.mapped = False
        seg.first = tail
        self.segments.append(seg)
        return tail

    def _map_block(self, to_map: Block, size: int, pool: _Pool) -> Optional[Block]:
        """``map_block``: map ``size`` bytes (rounded up to pages) at the start of an unmapped
        block, merge the mapped piece with free neighbours, cache it; ``None`` if the device has no room."""
        page = self._page(pool.small)
        mapped = -(-size // page) * page
        if mapped > to_map.size or not self._device_alloc(mapped):
            return None
        seg = to_map.segment
        if to_map.size > mapped:  # the rest stays unmapped, after it
            rest = Block(seg, to_map.address + mapped, to_map.size - mapped)
            rest.mapped = False
            rest.next, rest.prev = to_map.next, to_map
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            to_map.size = mapped
        to_map.mapped = True
        for other in (to_map.prev, to_map.next):
            if other is not None and other.mapped and not other.allocated:
                pool.remove(other)
                if other is to_map.prev:
                    self._merge(other, to_map)
                    to_map = other
                else:
                    self._merge(to_map, other)
        pool.insert(to_map)
        seg.size += mapped
        self.stats.num_device_alloc += 1
        self.stats.add("reserved_bytes", pool.small, mapped)
        self._record("segment_map", to_map.address, mapped)
        return to_map

    # ------------------------------------------------------------------ release

    def _release_block(self, b: Block, pool: _Pool) -> None:
        """Give a whole cached segment back to the device (``release_block``)."""
        seg = b.segment
        pool.remove(b)
        self.segments.remove(seg)
        self.stats.num_device_free += 1
        self.stats.add("segment", seg.small, -1)
        self.stats.add("reserved_bytes", seg.small, -seg.size)
        if seg.size >= self.conf.max_split_size:
            self.stats.oversize_segments.add(-1)
        self._record("segment_free", seg.address, seg.size)

    def _release_available_cached_blocks(self, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, free the smallest
        cached block of at least ``max(size, max_split_size)`` bytes, else the largest oversize
        blocks, largest first, until that much is freed (oversize blocks are whole segments)."""
        if self.conf.max_split_size == _NO_LIMIT:
            return False
        pool = self.large_pool
        key = max(size, self.conf.max_split_size)
        i = pool.lower_bound(key)
        if i is not None and not pool.at(i).segment.expandable:
            self._release_block(pool.at(i), pool)
            return True
        released = 0
        for x in sorted(pool, key=_Pool.key, reverse=True):
            if released >= key or x.size < self.conf.max_split_size:
                break
            if not x.segment.expandable:
                released += x.size
                self._release_block(x, pool)
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """Free every cached whole segment of both pools (``release_cached_blocks``)."""
        self.stats.num_sync_all_streams += 1  # synchronize_and_free_events
        for pool in (self.large_pool, self.small_pool):
            for b in list(pool):
                if not b.is_split and not b.segment.expandable:
                    self._release_block(b, pool)
        self._unmap_expandable()
        return True

    def _unmap_expandable(self) -> None:
        """``release_blocks`` for expandable segments: unmap the whole pages inside each cached
        block (``unmap_block``); a segment left with nothing mapped is dropped."""
        for seg in [x for x in self.segments if x.expandable]:
            pool = self.small_pool if seg.small else self.large_pool
            page = self._page(seg.small)
            for b in [x for x in seg.blocks() if x.mapped and not x.allocated]:
                base = seg.address  # pages are counted from the segment's start (segmentLeft/Right)
                start = base + -(-(b.address - base) // page) * page
                end = base + (b.address + b.size - base) // page * page
                if end <= start:
                    continue
                pool.remove(b)
                before = b.prev
                after = b.next
                pieces = []
                for addr, n, mapped in ((b.address, start - b.address, True), (start, end - start, False),
                                        (end, b.address + b.size - end, True)):
                    if n > 0:
                        x = Block(seg, addr, n)
                        x.mapped = mapped
                        pieces.append(x)
                for x, y in zip(pieces, pieces[1:]):
                    x.next, y.prev = y, x
                pieces[0].prev, pieces[-1].next = before, after
                if before is not None:
                    before.next = pieces[0]
                else:
                    seg.first = pieces[0]
                if after is not None:
                    after.prev = pieces[-1]
                for x in pieces:
                    if x.mapped:
                        pool.insert(x)
                hole = next(x for x in pieces if not x.mapped)
                if hole.next is not None and not hole.next.mapped:
                    self._merge(hole, hole.next)
                if hole.prev is not None and not hole.prev.mapped:
                    self._merge(hole.prev, hole)
                seg.size -= end - start
                self.stats.num_device_free += 1
                self.stats.add("reserved_bytes", seg.small, -(end - start))
                self._record("segment_unmap", start, end - start)
            if seg.first is not None and seg.first.next is None and not seg.first.mapped:
                self.segments.remove(seg)

    def _garbage_collect_cached_blocks(self) -> None:
        """``garbage_collect_cached_blocks``: release the oldest cached whole segments of the large
        pool until reserved memory is under the threshold."""
        threshold = int(self.conf.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self.large_pool
        candidates = [b for b in pool if not b.is_split and not b.segment.expandable]
        total_age = sum(b.gc_count for b in candidates)
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for b in [b for b in pool if not b.is_split and not b.segment.expandable]:
                if b.gc_count >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= b.gc_count
                    count -= 1
                    self._release_block(b, pool)
                    if reclaimed >= target:
                        break

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: release every cached segment that holds no allocated block."""
        self._release_cached_blocks()

    # ------------------------------------------------------------------ free

    def free(self, block: Block) -> None:
        """Return an allocated block to its pool, merged with its free neighbours (``free_block``)."""
        if not block.allocated:
            raise ValueError(f"{block!r} is not allocated")
        small = block.segment.small
        pool = self.small_pool if small else self.large_pool
        self.stats.add("allocation", small, -1)
        self.stats.add("allocated_bytes", small, -block.size)
        self.stats.add("requested_bytes", small, -block.requested)
        if block.size >= self.conf.max_split_size:
            self.stats.oversize_allocations.add(-1)
        self._record("free_requested", block.address, block.requested)
        self._record("free_completed", block.address, block.requested)
        block.allocated = False
        block.requested = 0
        original = block.size
        net_inactive = 0
        for other in (block.prev, block.next):
            if other is not None and not other.allocated and other.mapped:
                pool.remove(other)
                if not block.segment.expandable:
                    net_inactive -= 1  # the neighbour was an inactive split; now merged
                    self.stats.add("inactive_split_bytes", small, -other.size)
                if other is block.prev:
                    self._merge(other, block)
                    block = other
                else:
                    self._merge(block, other)
        self.stats.add("active", small, -1)
        self.stats.add("active_bytes", small, -original)
        if block.is_split and not block.segment.expandable:
            net_inactive += 1
            self.stats.add("inactive_split_bytes", small, block.size)
        if net_inactive:
            self.stats.add("inactive_split", small, net_inactive)
        pool.insert(block)

    def _merge(self, a: Block, b: Block) -> None:
        """Merge ``b`` (just after ``a``) into ``a``."""
        a.size += b.size
        a.next = b.next
        if b.next is not None:
            b.next.prev = a
        a.gc_count = 0

    # ------------------------------------------------------------------ torch's formats

    def memory_stats(self) -> dict[str, Any]:
        """``torch.cuda.memory_stats()``'s dict, with torch's key names (``allocated_bytes.all.current``...)."""
        out: dict[str, Any] = {}
        for (name, pool), s in self.stats.by.items():
            for metric in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{pool}.{metric}"] = getattr(s, metric)
        for name, s in (("oversize_allocations", self.stats.oversize_allocations),
                        ("oversize_segments", self.stats.oversize_segments)):
            for metric in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{metric}"] = getattr(s, metric)
        out["num_alloc_retries"] = self.stats.num_alloc_retries
        out["num_ooms"] = self.stats.num_ooms
        out["num_sync_all_streams"] = self.stats.num_sync_all_streams
        out["num_device_alloc"] = self.stats.num_device_alloc
        out["num_device_free"] = self.stats.num_device_free
        out["max_split_size"] = -1 if self.conf.max_split_size == _NO_LIMIT else self.conf.max_split_size
        return dict(sorted(out.items()))

    def snapshot(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()``: ``{"segments": [...], "device_traces": [[...]]}``, each
        segment with its blocks in address order (an expandable segment as one segment per
        contiguous mapped range, as torch reports it). Block states: ``active_allocated`` or
        ``inactive``; frames are empty (no stack traces are recorded)."""
        segs = []
        for seg in sorted(self.segments, key=lambda s: s.address):
            runs: list[list[Block]] = [[]]
            for b in seg.blocks():
                if b.mapped:
                    runs[-1].append(b)
                elif runs[-1]:
                    runs.append([])
            for run in (r for r in runs if r):
                blocks: list[dict[str, Any]] = [{"address": b.address, "size": b.size, "requested_size": b.requested,
                           "state": "active_allocated" if b.allocated else "inactive", "frames": []} for b in run]
                used = sum(b.size for b in run if b.allocated)
                segs.append({
                    "device": self.device, "address": run[0].address, "total_size": sum(b.size for b in run),
                    "allocated_size": used, "active_size": used,
                    "requested_size": sum(b.requested for b in run), "stream": 0,
                    "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
                    "is_expandable": seg.expandable, "frames": [], "blocks": blocks,
                })
        return {"segments": segs, "device_traces": [list(self.trace)]}

    def replay(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Replay a recorded trace (``device_traces[i]`` of a ``torch.cuda.memory._snapshot()``):
        its ``alloc`` and ``free_completed`` entries are run through this allocator (matched by
        ``addr``); the segment entries in it are the outcome to compare with. Returns this
        allocator's own trace of the replay."""
        self.record_trace = True
        start = len(self.trace)
        live: dict[int, Block] = {}
        for e in entries:
            if e["action"] == "alloc":
                live[e["addr"]] = self.malloc(e["size"])
            elif e["action"] == "free_completed" and e["addr"] in live:
                self.free(live.pop(e["addr"]))
        return self.trace[start:]

    def _record(self, action: str, addr: int, size: int) -> None:
        if self.record_trace:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "frames": [],
                               "time_us": next(self._clock), "device_free": self.device_free})
