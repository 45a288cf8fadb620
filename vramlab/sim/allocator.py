"""PyTorch's CUDA caching allocator, its policy ported to Python, for the virtual GPU.

A real card does not run out of memory when the bytes of live tensors reach its size: it runs
out when PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``) can neither find a
cached block nor get a new segment from ``cudaMalloc``. This module makes the same decisions on
numbers alone (no memory, no torch), so that a :class:`~vramlab.VirtualGPU` has what
``torch.cuda`` reports: allocated and reserved bytes, cached blocks, fragmentation,
``empty_cache()``, ``memory_stats()`` with torch's key names, ``memory_snapshot()`` in torch's
format, and the OOM where the allocator would raise it.

What is ported (the rules and constants of the C++ file, torch 2.11-2.13; the options as torch
2.13 reads them, ``c10/core/AllocatorConfig.cpp`` and ``c10/cuda/CUDAAllocatorConfig.cpp``):

- the options (:class:`AllocConf`): every key torch 2.13 reads on a CUDA build, validated with
  torch's messages (an unknown key is an error, as on a CUDA build), from a string or from the
  environment (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_HIP_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``,
  the first set winning);
- sizes rounded as ``round_size``: at least 512 bytes, a multiple of 512, or the next power-of-2
  division with ``roundup_power2_divisions`` (0 or 1 for an interval: no rounding);
- two pools: small (requests up to 1 MiB) and large;
- new segments sized as ``get_allocation_size``: 2 MiB for a small request,
  ``large_segment_size_mb`` (20 MiB by default) for a large one under 10 MiB, else the request
  rounded up to 2 MiB;
- best fit (the smallest cached block that is large enough, the lowest address on a tie), with
  ``max_split_size``'s rules: an oversize block (``>= max_split_size``) is not given to a smaller
  request, nor to an oversize request it exceeds by ``max_non_split_rounding_mb`` (by default
  ``large_segment_size_mb``) or more;
- splitting as ``should_split``: a small-pool block when at least 512 bytes remain, a large-pool
  block when the request is under ``max_split_size`` and more than 1 MiB remains (with expandable
  segments, whenever 512 bytes remain);
- freeing: a block is merged with its free neighbours in the same segment (it keeps the
  ``requested_size`` of its last request, as torch's snapshot shows);
- the memory fraction (``setMemoryFraction``, or ``per_process_memory_fraction``): below 1, a cap
  of ``round(fraction * total memory)`` bytes on the segments, checked on the new segment's size
  before ``cudaMalloc`` or the mapping of expandable pages;
- on a miss: ``garbage_collection_threshold`` (only under a fraction below 1): if reserved memory
  is above ``threshold * cap``, cached whole large-pool segments at least as old as the average
  (in ``get_free_block`` calls) are released, every one in a pass, passes repeated until the
  excess is reclaimed; then a new segment; if that fails, the smallest cached oversize block of
  the request's pool that is large enough (or that pool's oversize blocks, largest first, until
  enough) is released and the new segment tried again; then every cached whole segment is
  released and it is tried a last time (``num_alloc_retries`` counts this last try); then the
  OOM (``num_ooms``). With ``throw_on_cudamalloc_oom``, a segment that would pass
  ``per_process_memory_fraction`` of the device is refused before it is tried, and the retries
  are skipped (``num_oom_rejections``);
- ``empty_cache()`` releases every cached segment that holds no allocated block;
- ``expandable_segments:True``: one segment per pool that grows by pages (2 MiB in the small pool,
  ``large_segment_size_mb`` in the large) and whose unused pages ``empty_cache()`` unmaps;
- the history (``recordHistory``): the trace of allocator actions in memory_snapshot's format
  (``oom`` entries with ``device_free``, ``snapshot`` entries, ``compile_context``,
  ``user_metadata``), a ring buffer of ``max_entries``, cleared when recording stops; the stacks
  the callers pass to ``malloc``/``free`` (torch's frame dicts) kept on blocks, segments and
  entries as the recording's ``context`` says; the snapshot's ``allocator_settings``.

Not modelled: streams (everything is on one stream, so no events or cross-stream frees),
CUDA graphs and private pools, the pinned host allocator (its options are only validated and
kept), and ``backend:cudaMallocAsync`` (parsed and validated, kept in ``AllocConf.backend``;
the native caching allocator is the only one modelled, so a ``cudaMallocAsync`` setting is
run as ``native``). Stacks are not gathered: a caller that wants frames passes them. All sizes
are in bytes.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence

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

#: ``std::numeric_limits<size_t>::max()``: torch's "no limit" for sizes (``max_split_size`` unset)
_SIZE_MAX = (1 << 64) - 1
_NO_LIMIT = _SIZE_MAX
# RecordContext: which stacks are kept while recording
_NEVER, _STATE, _ALLOC, _ALL = 0, 1, 2, 3
#: the trace actions (TraceEntry::Action), as memory_snapshot writes them
_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "snapshot", "oom")
_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB
_PINNED_MAX_REGISTER_THREADS = 128  # CUDAAllocatorConfig::pinned_max_register_threads()

#: the keys ``AcceleratorAllocatorConfig::parseArgs`` reads (c10/core/AllocatorConfig.cpp, torch 2.13)
_ACCELERATOR_KEYS = frozenset({
    "large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "pinned_use_background_threads",
    "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"})
#: the keys ``CUDAAllocatorConfig::parseArgs`` reads (c10/cuda/CUDAAllocatorConfig.cpp, torch 2.13);
#: the CUDA build registers them with the accelerator parser, so any other key is an error
_CUDA_KEYS = frozenset({
    "backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register", "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads", "per_process_memory_fraction", "pinned_free_catch_all",
    "throw_on_cudamalloc_oom"})
#: the environment variables torch reads its settings from, in its order: the first one set wins
#: (``AcceleratorAllocatorConfig::instance()``); the CUDA-only keys skip ``PYTORCH_HIP_ALLOC_CONF``
#: on a CUDA build (``CUDAAllocatorConfig::instance()``)
ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_CUDA_ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class AllocConf:
    """The options of ``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``), as torch 2.13 reads them.
    Sizes in bytes.

    Attributes:
        max_split_size: blocks this large or larger are never split (bytes; ``2**64 - 1``, no limit,
            by default, as torch's ``SIZE_MAX``).
        roundup_power2_divisions: torch's 16-entry table (``roundup_power2_divisions()``): the
            divisions for requests in [1 MiB·2^i, 1 MiB·2^(i+1)) (the first entry also below 1 MiB,
            the last also above); a request rounds up to the next of that many steps between the
            powers of 2 around it; 0 or 1 for no rounding.
        expandable_segments: segments that grow by pages instead of new ``cudaMalloc`` calls.
        garbage_collection_threshold: a fraction in (0, 1): with a memory fraction below 1 set,
            cached segments are released before reserved memory passes it; 0 for off.
        large_segment_size: the segment size for requests of 1-10 MiB and the page size of a
            large-pool expandable segment (bytes; ``large_segment_size_mb``, 20 MiB by default).
        max_non_split_rounding_size: an oversize request is not given a cached oversize block
            this many bytes or more larger than it (``max_non_split_rounding_mb``; by default
            ``large_segment_size``).
        per_process_memory_fraction: the memory fraction the allocator starts with, in [0, 1]
            (``None``: not given, torch's 1.0, no limit).
        backend: ``"native"`` or ``"cudaMallocAsync"``; only the native allocator is modelled.
        throw_on_cudamalloc_oom: refuse a new segment that would pass
            ``per_process_memory_fraction`` of the device before trying it, without the retries.
        release_lock_on_cudamalloc, pinned_use_cuda_host_register, pinned_num_register_threads,
        pinned_use_background_threads, pinned_max_round_threshold, pinned_max_cached_size (bytes),
        pinned_reserve_segment_size_mb, pinned_free_catch_all, graph_capture_record_stream_reuse:
            validated and kept as torch does; they change nothing a single-stream device
            allocator without host memory decides.
        text: the settings string this was read from (torch's ``last_allocator_settings``).
    """

    max_split_size: int = _NO_LIMIT
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    large_segment_size: int = K_LARGE_BUFFER
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    per_process_memory_fraction: Optional[float] = None
    backend: str = "native"
    throw_on_cudamalloc_oom: bool = False
    release_lock_on_cudamalloc: bool = False
    pinned_use_cuda_host_register: bool = False
    pinned_num_register_threads: int = 1
    pinned_use_background_threads: bool = False
    pinned_max_round_threshold: int = _SIZE_MAX
    pinned_max_cached_size: int = _SIZE_MAX
    pinned_reserve_segment_size_mb: int = 0
    pinned_free_catch_all: bool = False
    graph_capture_record_stream_reuse: bool = False
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: Optional[str]) -> "AllocConf":
        """Read a settings string (``"max_split_size_mb:128,expandable_segments:True"``) as torch's
        ``setAllocatorSettings`` does on a CUDA build: ``AcceleratorAllocatorConfig::parseArgs``,
        then ``CUDAAllocatorConfig::parseArgs``. A bad value or an unknown key is one
        ``ValueError`` with torch's message; a setting that ends early (``"expandable_segments"``)
        is one too, where torch fails an internal assert."""
        if text is None:
            return cls()
        kw = _parse_accelerator(text)
        kw.update(_parse_cuda(text))
        return cls(text=text, **kw)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> "AllocConf":
        """The settings a torch 2.13 process started with ``environ`` uses: the first of
        ``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_HIP_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF`` that is set
        (even to ``""``), for the device-generic keys; the first of ``PYTORCH_CUDA_ALLOC_CONF``,
        ``PYTORCH_ALLOC_CONF`` for the CUDA keys (``backend``, ``per_process_memory_fraction``,
        ...), as a CUDA build reads them."""
        accel = next((environ[v] for v in ENV_VARS if v in environ), None)
        cuda = next((environ[v] for v in _CUDA_ENV_VARS if v in environ), None)
        kw: dict[str, Any] = {}
        if accel is not None:
            kw.update(_parse_accelerator(accel))
            kw["text"] = accel
        if cuda is not None:
            kw.update(_parse_cuda(cuda))
        return cls(**kw)

    def divisions_for(self, size: int) -> int:
        """The power-of-2 divisions for a request of ``size`` bytes (``roundup_power2_divisions(size)``:
        16 intervals, the first below 2 MiB, then one per power of 2 up to 32 GiB and above)."""
        if not self.roundup_power2_divisions:
            return 0
        index = min(max(size.bit_length() - 1 - 20, 0), _INTERVALS - 1)
        return self.roundup_power2_divisions[index]


class _Tokenizer:
    """``ConfigTokenizer``: ``,``, ``:``, ``[`` and ``]`` are tokens of their own, whitespace is
    dropped, the rest are words. ``check`` only compares (torch ignores its answer); reading past
    the end is where torch fails an internal assert."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        buf = ""
        for ch in text:
            if ch in ",:[]":
                if buf:
                    self.tokens.append(buf)
                    buf = ""
                self.tokens.append(ch)
            elif ch not in " \t\n\v\f\r":
                buf += ch
        if buf:
            self.tokens.append(buf)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> str:
        if i >= len(self.tokens):
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {self.text!r}: expected key:value, the setting ends at "
                             f"token {i} (torch: Index out of bounds in ConfigTokenizer)")
        return self.tokens[i]

    def check(self, i: int, token: str) -> bool:
        return self[i] == token

    def size_t(self, i: int) -> int:
        """``std::stoull``: the leading decimal digits (a ``-`` wraps around 2^64)."""
        m = re.match(r"([+-]?)(\d+)", self[i])
        if m is None:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected an integer, got {self[i]!r} (stoull)")
        n = int(m.group(2))
        if n > _SIZE_MAX:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: {self[i]!r} is out of range (stoull)")
        return (-n) % (1 << 64) if m.group(1) == "-" else n

    def double(self, i: int) -> float:
        """``std::stod``: the leading number (``0.5x`` reads 0.5; ``inf`` and ``nan`` too)."""
        m = re.match(r"[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", self[i], re.IGNORECASE)
        if m is None:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF: expected a number, got {self[i]!r} (stod)")
        return float(m.group(0))

    def boolean(self, i: int) -> bool:
        token = self[i]
        if token not in ("True", "False"):
            raise ValueError(f"Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{token}'")
        return token == "True"

    def skip_key(self, i: int) -> int:
        """The index of a key's value (or of the ``]`` that closes a list value)."""
        self.check(i + 1, ":")
        i += 2
        if self[i] != "[":
            return i
        i += 1
        while i < len(self.tokens) and self.tokens[i] != "]":
            i += 1
        if i >= len(self.tokens):
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {self.text!r}: expected closing bracket ']' but reached "
                             "end of config")
        return i


def _mb(t: _Tokenizer, i: int) -> int:
    """A ``..._mb`` value in bytes, capped as torch caps it (``SIZE_MAX / kMB`` MiB)."""
    return min(t.size_t(i), _SIZE_MAX // MiB) * MiB


def _parse_accelerator(text: str) -> dict[str, Any]:
    """``AcceleratorAllocatorConfig::parseArgs``: the device-generic keys; the CUDA keys are
    skipped (the CUDA parser reads them), any other key is refused."""
    t = _Tokenizer(text)
    kw: dict[str, Any] = {}
    large = K_LARGE_BUFFER
    for i in range(len(t)):  # large_segment_size_mb first: the two minimums below depend on it
        if t.tokens[i] == "large_segment_size_mb":
            t.check(i + 1, ":")
            mb = t.size_t(i + 2)
            if not mb > K_MIN_LARGE_ALLOC // MiB:
                raise ValueError("CachingAllocator option large_segment_size_mb must be > "
                                 f"{K_MIN_LARGE_ALLOC // MiB} MB")
            large = min(mb, _SIZE_MAX // MiB) * MiB
    kw["large_segment_size"] = kw["max_non_split_rounding_size"] = large
    divisions = [0] * _INTERVALS
    round_set = cached_set = False
    i = 0
    while i < len(t):
        key = t[i]
        if key == "large_segment_size_mb":
            i = t.skip_key(i)
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            t.check(i + 1, ":")
            i += 2
            mb = t.size_t(i)
            if mb < large // MiB:
                raise ValueError(f"CachingAllocator option {key} too small, must be >= {large // MiB}")
            kw["max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"] = _mb(t, i)
        elif key == "garbage_collection_threshold":
            t.check(i + 1, ":")
            i += 2
            value = t.double(i)
            if not 0 < value < 1.0:
                raise ValueError("garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
            kw["garbage_collection_threshold"] = value
        elif key == "roundup_power2_divisions":
            i = _parse_divisions(t, i, divisions)
        elif key == "expandable_segments":
            t.check(i + 1, ":")
            i += 2
            kw["expandable_segments"] = t.boolean(i)
        elif key == "pinned_use_background_threads":
            t.check(i + 1, ":")
            i += 2
            kw["pinned_use_background_threads"] = t.boolean(i)
        elif key in ("pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"):
            t.check(i + 1, ":")
            i += 2
            if key == "pinned_max_round_threshold_mb":
                kw["pinned_max_round_threshold"], round_set = _mb(t, i), True
            else:
                kw["pinned_max_cached_size"], cached_set = _mb(t, i), True
        else:
            if key not in _ACCELERATOR_KEYS | _CUDA_KEYS:
                raise ValueError(f"Unrecognized key '{key}' in Accelerator allocator config.")
            i = t.skip_key(i)
        if i + 1 < len(t):
            t.check(i + 1, ",")
            i += 1
        i += 1
    kw["roundup_power2_divisions"] = tuple(divisions)
    if round_set and cached_set and kw["pinned_max_round_threshold"] > kw["pinned_max_cached_size"]:
        warnings.warn(f"pinned_max_round_threshold_mb ({kw['pinned_max_round_threshold'] >> 20}) > "
                      f"pinned_max_cached_size_mb ({kw['pinned_max_cached_size'] >> 20}). The cache size limit "
                      "takes precedence: allocations above pinned_max_cached_size_mb are never rounded up.",
                      stacklevel=3)
    return kw


def _parse_divisions(t: _Tokenizer, i: int, table: list[int]) -> int:
    """``parseRoundUpPower2Divisions``: ``4`` (every interval; a power of 2) or
    ``[64:8,256:4,>:1]`` (bounds in MiB, powers of 2; values powers of 2 or 0; the first value
    also fills the intervals below its bound, ``>`` those after the last bound given)."""
    t.check(i + 1, ":")
    i += 2
    if t[i] != "[":
        value = t.size_t(i)
        if not _single_bit(value):
            raise ValueError("For roundups, the divisions has to be power of 2 ")
        table[:] = [value] * _INTERVALS
        return i
    first, last = True, 0
    i += 1
    while i < len(t) and t.tokens[i] != "]":
        bound = i
        t.check(i + 1, ":")
        i += 2
        value = t.size_t(i)
        if not (value == 0 or _single_bit(value)):
            raise ValueError("For roundups, the divisions has to be power of 2 or 0 to disable roundup ")
        if t[bound] == ">":
            table[last + 1:] = [value] * len(table[last + 1:])
        else:
            mb = t.size_t(bound)
            if not _single_bit(mb):
                raise ValueError("For roundups, the intervals have to be power of 2 ")
            index = min(max(mb.bit_length() - 1, 0), _INTERVALS - 1)
            if first:
                table[:index] = [value] * index
                first = False
            table[index] = value
            last = index
        if t[i + 1] != "]":
            t.check(i + 1, ",")
            i += 1
        i += 1
    if i >= len(t):
        raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {t.text!r}: expected closing bracket ']' but reached end of config")
    return i


def _single_bit(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_cuda(text: str) -> dict[str, Any]:
    """``CUDAAllocatorConfig::parseArgs``: the CUDA keys; the device-generic ones are skipped."""
    t = _Tokenizer(text)
    kw: dict[str, Any] = {}
    used_async = used_native = False
    bools = {"release_lock_on_cudamalloc": "release_lock_on_cudamalloc",
             "release_lock_on_hipmalloc": "release_lock_on_cudamalloc",
             "pinned_use_cuda_host_register": "pinned_use_cuda_host_register",
             "pinned_use_hip_host_register": "pinned_use_cuda_host_register",
             "graph_capture_record_stream_reuse": "graph_capture_record_stream_reuse",
             "pinned_free_catch_all": "pinned_free_catch_all",
             "throw_on_cudamalloc_oom": "throw_on_cudamalloc_oom"}
    i = 0
    while i < len(t):
        key = t[i]
        if key == "backend":
            t.check(i + 1, ":")
            i += 2
            if t[i] not in ("native", "cudaMallocAsync"):
                raise ValueError("Unknown allocator backend, options are native and cudaMallocAsync")
            kw["backend"] = t[i]
            used_async = t[i] == "cudaMallocAsync"
        elif key in bools:
            t.check(i + 1, ":")
            i += 2
            kw[bools[key]] = t.boolean(i)
            used_native = True
        elif key == "pinned_num_register_threads":
            t.check(i + 1, ":")
            i += 2
            n = t.size_t(i)
            if not _single_bit(n):
                raise ValueError(f"Number of register threads has to be power of 2, got {n}")
            if n > _PINNED_MAX_REGISTER_THREADS:
                raise ValueError("Number of register threads should be less than or equal to "
                                 f"{_PINNED_MAX_REGISTER_THREADS}, got {n}")
            kw["pinned_num_register_threads"] = n
            used_native = True
        elif key == "pinned_reserve_segment_size_mb":
            t.check(i + 1, ":")
            i += 2
            n = t.size_t(i)
            if not n > 0:
                raise ValueError("Pinned reserve segment size has to be greater than 0")
            kw["pinned_reserve_segment_size_mb"] = n
            used_native = True
        elif key == "per_process_memory_fraction":
            t.check(i + 1, ":")
            i += 2
            value = t.double(i)
            if not 0.0 <= value <= 1.0:
                raise ValueError("per_process_memory_fraction is invalid, set it in [0.0, 1.0]")
            kw["per_process_memory_fraction"] = value
            used_native = True
        else:
            if key not in _ACCELERATOR_KEYS:
                raise ValueError(f"Unrecognized key '{key}' in CUDA allocator config.")
            i = t.skip_key(i)
        if i + 1 < len(t):
            t.check(i + 1, ",")
            i += 1
        i += 1
    if used_async and used_native:
        warnings.warn("backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and "
                      "garbage_collect_threshold.", stacklevel=3)
    return kw


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


def get_allocation_size(size: int, conf: AllocConf = AllocConf()) -> int:
    """``get_allocation_size``: the size in bytes of the segment ``cudaMalloc`` gets for a rounded
    request of ``size`` bytes: 2 MiB up to 1 MiB, ``conf.large_segment_size`` (20 MiB by default)
    under 10 MiB, else the request rounded up to 2 MiB."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return conf.large_segment_size
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
    ``requested`` bytes of the last request it served (kept once freed, as torch's
    ``requested_size``). ``mapped`` is false for the unmapped tail of an expandable segment.
    ``frames``: the stack given to the ``malloc`` it serves (``context_when_allocated``, ``None``
    when none was recorded); ``segment_frames``: the stack of the ``malloc`` that made its
    segment, on a segment's first block (``context_when_segment_allocated``)."""

    __slots__ = ("size", "requested", "address", "segment", "allocated", "prev", "next", "gc_count_base", "mapped",
                 "frames", "segment_frames")

    def __init__(self, segment: Segment, address: int, size: int) -> None:
        self.segment = segment
        self.address = address
        self.size = size
        self.requested = 0
        self.allocated = False
        self.prev: Optional[Block] = None
        self.next: Optional[Block] = None
        self.gc_count_base = 0  # the pool's get_free_block count when this block was cached
        self.mapped = True
        self.frames: Optional[list[dict[str, Any]]] = None
        self.segment_frames: Optional[list[dict[str, Any]]] = None

    @property
    def is_split(self) -> bool:
        """Part of a segment shared with other blocks (``Block::is_split``)."""
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("cached" if self.mapped else "unmapped")
        return f"<Block {self.size} bytes at {self.address:#x}, {state}>"


class AllocatorOOM(Exception):
    """The allocator could not serve a request. All in bytes: ``requested`` is the segment size it
    tried to get (``alloc_size``, what torch's message reports as "Tried to allocate"); the
    device's ``total``, ``free``, ``allocated`` and ``reserved`` bytes when it gave up;
    ``allowed``: the memory fraction's maximum (torch's "X allowed;"), ``None`` without one;
    ``size``: the request as asked (``None`` if not given).

    ``rejected``: ``throw_on_cudamalloc_oom`` refused the new segment before trying it (torch
    raises "CUDA out of memory. Allocation was preemptively rejected because it would exceed
    per_process_memory_fraction limit. Requested size: <size>", counts ``num_oom_rejections``, not
    ``num_ooms``, and records no ``oom`` trace entry)."""

    def __init__(self, requested: int, total: int, free: int, allocated: int, reserved: int,
                 allowed: Optional[int] = None, *, size: Optional[int] = None, rejected: bool = False) -> None:
        if rejected:
            text = ("out of memory: allocation preemptively rejected because it would exceed "
                    f"per_process_memory_fraction limit; requested size {size} bytes")
        else:
            text = f"out of memory: tried to allocate {requested} bytes" + (
                f" ({allowed} bytes allowed)" if allowed is not None else "")
        super().__init__(text)
        self.requested, self.total, self.free = requested, total, free
        self.allocated, self.reserved = allocated, reserved
        self.allowed, self.size, self.rejected = allowed, size, rejected


class _Pool:
    """The cached (free, mapped) blocks of one pool, ordered as ``BlockComparatorSizeCounterAddress``:
    by size, then the registration counter of their segment, then address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], Block] = {}
        self.get_free_blocks_call_count = 0  # counted only while garbage collection is on

    def gc_count(self, b: Block) -> int:
        """``Block::gc_count``: this pool's ``get_free_block`` calls since ``b`` was cached."""
        return self.get_free_blocks_call_count - b.gc_count_base

    @staticmethod
    def key(b: Block) -> tuple[int, int, int]:
        return (b.size, b.segment.counter, b.address)

    def insert(self, b: Block) -> None:
        """``insert_into_blocks``: cache ``b`` (its age starts at 0)."""
        b.gc_count_base = self.get_free_blocks_call_count
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
    num_oom_rejections: int = 0
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
    out: the card's memory less the CUDA context), under ``conf``.

    ``memory_fraction``: as ``torch.cuda.set_per_process_memory_fraction`` (``None``: the conf's
    ``per_process_memory_fraction``, if any); below 1 it caps the bytes of the allocator's
    segments at ``round(fraction * total_memory)`` and turns on ``garbage_collection_threshold``.
    ``total_memory``: the device's whole memory in bytes (``totalGlobalMem``, context included),
    what a fraction is a fraction of; ``capacity`` by default.

    ``malloc(n)`` returns a :class:`Block` or raises :class:`AllocatorOOM`; ``free(block)``
    caches it. Readings in bytes: ``allocated``, ``reserved``, ``peak_allocated``,
    ``peak_reserved``; ``memory_stats()`` and ``snapshot()`` as torch's.
    """

    BASE_ADDRESS = 0x7F0000000000

    def __init__(self, capacity: int, conf: Optional[AllocConf] = None, memory_fraction: Optional[float] = None,
                 device: int = 0, *, total_memory: Optional[int] = None) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive; got {capacity}")
        if memory_fraction is not None and not 0.0 <= memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in [0, 1]; got {memory_fraction}")
        self.capacity = int(capacity)
        self.total_memory = self.capacity if total_memory is None else int(total_memory)
        self.conf = conf or AllocConf()
        #: ``allowed_memory_maximum``: the most bytes the segments may hold, ``None`` for no maximum
        self.allowed: Optional[int] = None
        fraction = memory_fraction if memory_fraction is not None else self.conf.per_process_memory_fraction
        if fraction is not None:  # the DeviceCachingAllocator constructor: setMemoryFraction(per_process_memory_fraction)
            self.set_memory_fraction(fraction)
        self.device = device
        self.small_pool = _Pool(True)
        self.large_pool = _Pool(False)
        self.segments: list[Segment] = []
        self.stats = _Stats()
        self._trace: collections.deque[dict[str, Any]] = collections.deque()
        self._recording = False
        self._record_context = _NEVER
        self._skip_actions: frozenset[str] = frozenset()
        self._compile_context: list[str] = []
        self._user_metadata = ""
        self._next_address = self.BASE_ADDRESS
        self._clock = itertools.count()
        self._counter = itertools.count(1)

    # ------------------------------------------------------------------ memory fraction

    def set_memory_fraction(self, fraction: float) -> None:
        """``setMemoryFraction``: cap the segments at ``round(fraction * total_memory)`` bytes; 1.0
        lifts the cap (only a fraction below 1 sets one). ``ValueError`` outside [0, 1]."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"invalid fraction:{fraction}. Please set within [0, 1].")
        self.allowed = None
        if fraction < 1.0:
            self.allowed = int(math.floor(fraction * float(self.total_memory) + 0.5))  # std::round

    @property
    def memory_fraction(self) -> float:
        """``getMemoryFraction``: the cap as a fraction of ``total_memory``; 1.0 without one."""
        if self.allowed is None:
            return 1.0
        return self.allowed / float(self.total_memory)

    # ------------------------------------------------------------------ recording

    def set_record_history(self, enabled: bool, *, max_entries: int = sys.maxsize, clear: bool = False,
                           context: Optional[str] = "all", skip_actions: Sequence[str] = ()) -> None:
        """``recordHistory`` (``torch.cuda.memory._record_memory_history``): record the trace of
        allocator actions for :meth:`snapshot`. ``max_entries``: keep the last that many entries
        (a ring buffer, at least 1). Disabling, or ``clear``, empties the trace. ``context``:
        which stacks (the ``frames`` given to ``malloc``/``free``) are kept: ``None`` none,
        ``"state"`` on allocated blocks only, ``"alloc"`` also on the trace's entries, ``"all"``
        also the stacks of frees. ``skip_actions``: actions not recorded."""
        levels = {None: _NEVER, "state": _STATE, "alloc": _ALLOC, "all": _ALL}
        if context not in levels:
            raise ValueError("expected context to be 'state', 'alloc', 'all', or None")
        unknown = set(skip_actions) - set(_ACTIONS)
        if unknown:
            raise ValueError(f"unknown trace action(s) {sorted(unknown)}; expected some of {', '.join(_ACTIONS)}")
        self._recording = bool(enabled)
        self._skip_actions = frozenset(skip_actions)
        self._trace = collections.deque(self._trace, maxlen=max(1, min(int(max_entries), sys.maxsize)))
        self._record_context = levels[context] if enabled else _NEVER
        if not enabled or clear:
            self._trace.clear()

    @property
    def record_trace(self) -> bool:
        """Whether the trace is recorded; setting it is ``set_record_history(value)`` (so ``False``
        clears the trace, as torch's ``_record_memory_history(None)`` does)."""
        return self._recording

    @record_trace.setter
    def record_trace(self, enabled: bool) -> None:
        self.set_record_history(bool(enabled))

    @property
    def trace(self) -> list[dict[str, Any]]:
        """The recorded trace entries, oldest first (what ``snapshot()["device_traces"][0]`` holds)."""
        return list(self._trace)

    def push_compile_context(self, name: str) -> None:
        """``pushCompileContext``: entries recorded from now on carry ``name`` as their
        ``compile_context`` (only while recording, as torch)."""
        if self._recording:
            self._compile_context.append(name)

    def pop_compile_context(self) -> None:
        """``popCompileContext``."""
        if self._recording and self._compile_context:
            self._compile_context.pop()

    def set_user_metadata(self, metadata: str) -> None:
        """``torch.cuda.memory._set_memory_metadata``: the ``user_metadata`` of entries recorded from now on."""
        self._user_metadata = metadata

    def _context(self, level: int, frames: Sequence[dict[str, Any]]) -> Optional[list[dict[str, Any]]]:
        """``maybeGatherContext(level)``: the stack when recording at ``level`` or above, else ``None``."""
        return [dict(f) for f in frames] if self._record_context >= level else None

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

    def malloc(self, orig_size: int, frames: Sequence[dict[str, Any]] = ()) -> Block:
        """Allocate a block for a request of ``orig_size`` bytes (``DeviceCachingAllocator::malloc``).
        ``frames``: the caller's stack as torch's frame dicts (``{"filename", "line", "name"}``),
        kept on the block and the trace as the recording's ``context`` says."""
        context = self._context(_STATE, frames)
        size = round_size(orig_size, self.conf)
        small = size <= K_SMALL_SIZE
        pool = self.small_pool if small else self.large_pool
        alloc_size = get_allocation_size(size, self.conf)
        rejected = [False]  # params.oom_rejection_info.rejected
        block = self._get_free_block(pool, size)
        if block is None:
            if self._gc_enabled:
                self._garbage_collect_cached_blocks(context)
            block = self._alloc_block(pool, size, alloc_size, False, context, rejected)
            if block is None and not rejected[0]:  # a rejection skips the retry chain
                block = ((self._release_available_cached_blocks(pool, size, context)
                          and self._alloc_block(pool, size, alloc_size, False, context, rejected))
                         or (self._release_cached_blocks(context)
                             and self._alloc_block(pool, size, alloc_size, True, context, rejected))
                         or None)
        if block is None:
            if rejected[0]:
                raise AllocatorOOM(alloc_size, self.capacity, self.device_free, self.allocated, self.reserved,
                                   self.allowed, size=orig_size, rejected=True)
            self._record("oom", self.device_free, size, context)  # TraceEntry::OOM: addr is device_free
            self.stats.num_ooms += 1
            raise AllocatorOOM(alloc_size, self.capacity, self.device_free, self.allocated, self.reserved,
                               self.allowed, size=orig_size)
        return self._alloc_found_block(block, pool, orig_size, size, context)

    @property
    def _gc_enabled(self) -> bool:
        """Garbage collection runs only under a memory fraction below 1 and with a threshold."""
        return self.allowed is not None and self.conf.garbage_collection_threshold > 0.0

    def _get_free_block(self, pool: _Pool, size: int) -> Optional[Block]:
        if self._gc_enabled:  # "Track block reuse interval only when garbage collection is enabled."
            pool.get_free_blocks_call_count += 1
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
        if size >= mss and b.size >= size + self.conf.max_non_split_rounding_size:  # "rounded up but within a limit"
            return None
        pool.remove(b)
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.segment.small or self.conf.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.conf.max_split_size and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, block: Block, pool: _Pool, orig_size: int, size: int,
                           context: Optional[list[dict[str, Any]]] = None) -> Block:
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
        block.frames = context  # context_when_allocated
        self.stats.add("allocation", small, 1)
        self.stats.add("allocated_bytes", small, block.size)
        self.stats.add("active", small, 1)
        self.stats.add("active_bytes", small, block.size)
        self.stats.add("requested_bytes", small, orig_size)
        if block.size >= self.conf.max_split_size:
            self.stats.oversize_allocations.add(1)
        self._record("alloc", block.address, orig_size, context)
        return block

    def _device_alloc(self, size: int) -> bool:
        """``cudaMalloc`` (or ``cuMemCreate`` for pages): whether the device has ``size`` bytes free."""
        return self.reserved + size <= self.capacity

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, retry: bool,
                     context: Optional[list[dict[str, Any]]] = None,
                     rejected: Optional[list[bool]] = None) -> Optional[Block]:
        """``alloc_block``: a new segment of ``alloc_size`` bytes (or pages mapped for ``size``
        bytes with expandable segments). First the memory fraction's cap, on ``alloc_size`` in both
        modes; then ``throw_on_cudamalloc_oom``'s refusal (sets ``rejected[0]``); then the device."""
        if retry:
            self.stats.num_alloc_retries += 1
        if self.allowed is not None and self.reserved + alloc_size > self.allowed:
            return None
        if self.conf.throw_on_cudamalloc_oom:
            fraction = 1.0 if self.conf.per_process_memory_fraction is None else self.conf.per_process_memory_fraction
            if self.reserved + alloc_size > int(fraction * float(self.total_memory)):
                self.stats.num_oom_rejections += 1
                if rejected is not None:
                    rejected[0] = True
                return None
        if self.conf.expandable_segments:
            return self._alloc_expandable(pool, size, context)
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
        self._record("segment_alloc", seg.address, alloc_size, context)
        b.segment_frames = context  # context_when_segment_allocated
        return b

    # ------------------------------------------------------------------ expandable segments

    def _page(self, small: bool) -> int:
        """The page size of an expandable segment in bytes: 2 MiB in the small pool,
        ``large_segment_size`` (20 MiB by default) in the large."""
        return K_SMALL_BUFFER if small else self.conf.large_segment_size

    def _alloc_expandable(self, pool: _Pool, size: int,
                          context: Optional[list[dict[str, Any]]] = None) -> Optional[Block]:
        """``try_allocate_expandable_block``: find room (free or unmapped) in an expandable
        segment of the pool, map what is missing in whole pages, return the mapped block."""
        c = self._find_expandable_block(pool, size)
        if not c.mapped:
            first = self._map_block(c, min(c.size, size), pool, context)
            if first is None:
                return None
            c = first
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped  # invariant: free -> unmapped -> *
            c2 = self._map_block(nxt, min(size - c.size, nxt.size), pool, context)
            if c2 is None:
                return None
            c = c2
        pool.remove(c)
        return c

    def _find_expandable_block(self, pool: _Pool, size: int) -> Block:
        """``find_expandable_block``: the first unmapped block (in address order), or the free
        block just before it, with ``size`` bytes of free or unmapped room from there; else a new
        expandable segment (1 1/8 of ``total_memory`` of address space, all unmapped)."""
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
        reserve = -(-(self.total_memory + self.total_memory // 8) // page) * page
        seg = Segment(self._next_address, 0, pool.small, True, reserve, counter=next(self._counter))
        self._next_address += reserve + page
        tail = Block(seg, seg.address, reserve)
        tail.mapped = False
        seg.first = tail
        self.segments.append(seg)
        return tail

    def _map_block(self, to_map: Block, size: int, pool: _Pool,
                   context: Optional[list[dict[str, Any]]] = None) -> Optional[Block]:
        """``map_block``: map ``size`` bytes (rounded up to pages) at the start of an unmapped
        block, merge the mapped piece with free neighbours, cache it; ``None`` if the device has no room."""
        page = self._page(pool.small)
        mapped = -(-size // page) * page
        if mapped > to_map.size or not self._device_alloc(mapped):
            return None
        seg = to_map.segment
        mapped_at = to_map.address  # mapped_range.ptr: the trace reports the new pages, not the merged block
        requested = to_map.requested  # try_merge_blocks keeps to_map's fields whichever neighbour it absorbs
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
        to_map.requested = requested
        pool.insert(to_map)
        seg.size += mapped
        self.stats.num_device_alloc += 1
        self.stats.add("reserved_bytes", pool.small, mapped)
        self._record("segment_map", mapped_at, mapped, context)
        if to_map.prev is None and to_map.segment_frames is None:
            to_map.segment_frames = context
        return to_map

    # ------------------------------------------------------------------ release

    def _release_block(self, b: Block, pool: _Pool, context: Optional[list[dict[str, Any]]] = None) -> None:
        """Give a whole cached segment back to the device (``release_block``)."""
        seg = b.segment
        self.stats.num_device_free += 1
        self._record("segment_free", seg.address, seg.size, context if context is not None else b.segment_frames)
        pool.remove(b)
        self.segments.remove(seg)
        self.stats.add("segment", seg.small, -1)
        self.stats.add("reserved_bytes", seg.small, -seg.size)
        if seg.size >= self.conf.max_split_size:
            self.stats.oversize_segments.add(-1)

    def _release_available_cached_blocks(self, pool: _Pool, size: int,
                                         context: Optional[list[dict[str, Any]]] = None) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, free the smallest
        cached block of the request's own pool of at least ``max(size, max_split_size)`` bytes,
        else that pool's oversize blocks, largest first, until that much is freed (oversize blocks
        are whole segments). A small request's pool holds no oversize block: it frees nothing."""
        mss = self.conf.max_split_size
        if mss == _NO_LIMIT:
            return False
        key = max(size, mss)
        i = pool.lower_bound(key)
        if i is not None and not pool.at(i).segment.expandable:
            self._release_block(pool.at(i), pool, context)
            return True
        # "No single block is large enough; free multiple oversize blocks, starting with the largest"
        i = len(pool) if i is None else i
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < key and pool.at(i).size >= mss:
            cur, first = pool.at(i), i == 0
            i -= 1
            if not cur.segment.expandable:
                released += cur.size
                self._release_block(cur, pool, context)
            if first:
                break
        return released >= key

    def _release_cached_blocks(self, context: Optional[list[dict[str, Any]]] = None) -> bool:
        """``release_cached_blocks``: after syncing the streams, free every cached whole segment
        and unmap the free pages of the expandable segments, large pool first (``release_blocks``)."""
        self.stats.num_sync_all_streams += 1  # synchronize_and_free_events
        for pool in (self.large_pool, self.small_pool):
            to_unmap = []
            for b in list(pool):
                if b.segment.expandable:
                    to_unmap.append(b)
                elif not b.is_split:
                    self._release_block(b, pool, context)
            for b in to_unmap:
                self._unmap_block(b, pool, context)
        return True

    def _unmap_block(self, b: Block, pool: _Pool, context: Optional[list[dict[str, Any]]] = None) -> None:
        """``unmap_block``: unmap the whole pages inside a cached block of an expandable segment
        (pages counted from the segment's start); the block becomes the unmapped hole (it keeps its
        fields), with new cached blocks for any mapped bytes before and after it. A segment left
        with nothing mapped is dropped (``release_expandable_segment``)."""
        seg = b.segment
        page = self._page(seg.small)
        base = seg.address
        start = base + -(-(b.address - base) // page) * page
        end = base + (b.address + b.size - base) // page * page
        if end <= start:
            return
        pool.remove(b)
        if start > b.address:  # prev? -> before_free -> b
            before = Block(seg, b.address, start - b.address)
            before.prev, before.next = b.prev, b
            if b.prev is not None:
                b.prev.next = before
            else:
                seg.first = before
            b.prev = before
            pool.insert(before)
        if b.address + b.size > end:  # b -> after_free -> next?
            after = Block(seg, end, b.address + b.size - end)
            after.prev, after.next = b, b.next
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.address, b.size, b.mapped = start, end - start, False
        hole, requested = b, b.requested
        if hole.prev is not None and not hole.prev.mapped:  # try_merge_blocks(block, block->prev)
            prev = hole.prev
            self._merge(prev, hole)
            hole = prev
        if hole.next is not None and not hole.next.mapped:
            self._merge(hole, hole.next)
        hole.requested = requested
        seg.size -= end - start
        self.stats.add("reserved_bytes", seg.small, -(end - start))
        self.stats.num_device_free += 1
        self._record("segment_unmap", start, end - start, context if context is not None else hole.segment_frames)
        if hole.prev is None and hole.next is None:
            self.segments.remove(seg)

    def _garbage_collect_cached_blocks(self, context: Optional[list[dict[str, Any]]] = None) -> None:
        """``garbage_collect_cached_blocks``: if reserved memory is above ``threshold * allowed``,
        free the large pool's cached whole segments whose age (``get_free_block`` calls on the
        pool since they were cached) is at least the average, all of them in a pass ("Don't stop
        upon reaching the target_size, we don't want this GC to be triggered frequently"), and
        repeat with the new average until the target is reclaimed or a pass frees nothing."""
        if self.allowed is None:
            return
        gc_threshold = int(self.conf.garbage_collection_threshold * float(self.allowed))
        if self.reserved <= gc_threshold:  # total_allocated_memory
            return
        target = self.reserved - gc_threshold
        reclaimed = 0
        pool = self.large_pool
        total_age = 0
        count = 0
        for b in pool:  # (torch counts expandable whole blocks here too, though it never frees them)
            if not b.is_split:
                total_age += pool.gc_count(b)
                count += 1
        if count == 0:
            return
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for b in list(pool):
                if not b.is_split and not b.segment.expandable and pool.gc_count(b) >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= pool.gc_count(b)
                    count -= 1
                    self._release_block(b, pool, context)

    def empty_cache(self, frames: Sequence[dict[str, Any]] = ()) -> None:
        """``torch.cuda.empty_cache()``: release every cached segment that holds no allocated block
        (``emptyCache``). ``frames``: the caller's stack, for the trace (``context="all"``)."""
        self._release_cached_blocks(self._context(_ALL, frames))

    # ------------------------------------------------------------------ free

    def free(self, block: Block, frames: Sequence[dict[str, Any]] = ()) -> None:
        """Return an allocated block to its pool, merged with its free neighbours (``free_locked``,
        ``free_block``). ``frames``: the caller's stack, kept on the trace with ``context="all"``
        (else the entries carry the stack of the block's ``malloc``). The block keeps its
        ``requested`` bytes, as torch's ``requested_size``."""
        if not block.allocated:
            raise ValueError(f"{block!r} is not allocated")
        context = self._context(_ALL, frames)
        small = block.segment.small
        pool = self.small_pool if small else self.large_pool
        self.stats.add("allocation", small, -1)
        self.stats.add("allocated_bytes", small, -block.size)
        trace_context = context if context is not None else block.frames
        self._record("free_requested", block.address, block.requested, trace_context)
        if block.size >= self.conf.max_split_size:
            self.stats.oversize_allocations.add(-1)
        self._record("free_completed", block.address, block.requested, trace_context)
        block.allocated = False
        block.frames = None  # context_when_allocated = nullptr
        requested = block.requested
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
        block.requested = requested  # the merged block is torch's freed block (try_merge_blocks' dst)
        block.frames = None
        self.stats.add("active", small, -1)
        self.stats.add("active_bytes", small, -original)
        self.stats.add("requested_bytes", small, -requested)
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
        out["num_oom_rejections"] = self.stats.num_oom_rejections
        out["max_split_size"] = _int64(self.conf.max_split_size)  # -1 for no limit
        return dict(sorted(out.items()))

    def snapshot(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()``: ``{"segments", "device_traces", "allocator_settings",
        "external_annotations"}``, each segment with its blocks in address order (an expandable
        segment as one segment per contiguous mapped range, as torch reports it). Block states:
        ``active_allocated`` or ``inactive``. ``frames``: the stacks given to ``malloc`` (a block's
        while it is allocated; a segment's from the ``malloc`` that made it, on its first block),
        ``[]`` where none was recorded. Taking it records a ``snapshot`` entry (size: the active
        bytes), which the next snapshot's trace shows, as ``DeviceCachingAllocator::snapshot``."""
        traces = [list(self._trace)]  # NativeCachingAllocator::snapshot reads the trace first
        segs = []
        total_active = 0
        for seg in sorted(self.segments, key=lambda s: s.address):
            runs: list[list[Block]] = [[]]
            for b in seg.blocks():
                if b.mapped:
                    runs[-1].append(b)
                elif runs[-1]:
                    runs.append([])
            for run in (r for r in runs if r):
                blocks: list[dict[str, Any]] = [
                    {"address": b.address, "size": b.size, "requested_size": b.requested,
                     "state": "active_allocated" if b.allocated else "inactive", "frames": list(b.frames or [])}
                    for b in run]
                used = sum(b.size for b in run if b.allocated)
                total_active += used
                segs.append({
                    "device": self.device, "address": run[0].address, "total_size": sum(b.size for b in run),
                    "allocated_size": used, "active_size": used,
                    "requested_size": sum(b.requested for b in run if b.allocated), "stream": 0,
                    "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
                    "is_expandable": seg.expandable, "frames": list(run[0].segment_frames or []), "blocks": blocks,
                })
        self._record("snapshot", 0, total_active)
        return {"segments": segs, "device_traces": traces, "allocator_settings": self.allocator_settings(),
                "external_annotations": []}

    def allocator_settings(self) -> dict[str, Any]:
        """The snapshot's ``allocator_settings`` (torch's ``config_metadata``): the settings string,
        sizes in bytes as int64 (-1 for no limit), the division table keyed "1", "2", "4", ... "32768"."""
        c = self.conf
        return {
            "PYTORCH_CUDA_ALLOC_CONF": c.text,
            "max_split_size": _int64(c.max_split_size),
            "garbage_collection_threshold": c.garbage_collection_threshold,
            "expandable_segments": c.expandable_segments,
            "pinned_num_register_threads": c.pinned_num_register_threads,
            "release_lock_on_cudamalloc": c.release_lock_on_cudamalloc,
            "pinned_use_cuda_host_register": c.pinned_use_cuda_host_register,
            "graph_capture_record_stream_reuse": c.graph_capture_record_stream_reuse,
            "max_round_threshold": _int64(c.pinned_max_round_threshold),
            "max_cached_size": _int64(c.pinned_max_cached_size),
            "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(c.roundup_power2_divisions)},
        }

    def replay(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Replay a recorded trace (``device_traces[i]`` of a ``torch.cuda.memory._snapshot()``):
        its ``alloc`` and ``free_completed`` entries are run through this allocator (matched by
        ``addr``); the segment entries in it are the outcome to compare with. Returns this
        allocator's own trace of the replay (recording is turned on if it was off)."""
        if not self._recording:
            self.set_record_history(True)
        start = len(self._trace)
        live: dict[int, Block] = {}
        for e in entries:
            if e["action"] == "alloc":
                live[e["addr"]] = self.malloc(e["size"])
            elif e["action"] == "free_completed" and e["addr"] in live:
                self.free(live.pop(e["addr"]))
        return self.trace[start:]

    def _record(self, action: str, addr: int, size: int, context: Optional[list[dict[str, Any]]] = None) -> None:
        """``record_trace``: one trace entry with memory_snapshot's keys (an ``oom`` entry has
        ``device_free`` in place of ``addr``; ``frames`` only where a stack was recorded and the
        recording keeps stacks on the trace, ``context`` "alloc" or "all")."""
        if not self._recording or action in self._skip_actions:
            return
        entry: dict[str, Any] = {
            "action": action, ("device_free" if action == "oom" else "addr"): addr, "size": size, "stream": 0,
            "time_us": next(self._clock),
            "compile_context": self._compile_context[-1] if self._compile_context else "N/A",
            "user_metadata": self._user_metadata, "pool_id": (0, 0)}
        if context is not None and self._record_context >= _ALLOC:
            entry["frames"] = [dict(f) for f in context]
        self._trace.append(entry)


def _int64(n: int) -> int:
    """A ``size_t`` as torch's ``int64_t`` cast gives it (``SIZE_MAX`` is -1)."""
    return n - (1 << 64) if n >= 1 << 63 else n
