"""Host↔device transfer lessons: copy bandwidth, activation offload, compression, batching.

All sizes are in bytes, bandwidths in bytes per second, times in seconds.

- :func:`measure_copy` times a host→device copy (pageable or pinned; on CUDA), or a
  device→device one, or, without CUDA, the same-size host→host copy, and says which it measured.
- :func:`save_on_host` offloads the activations saved for backward to host memory: on CUDA
  it is ``torch.autograd.graph.save_on_cpu``; on the virtual GPU it moves each saved
  tensor's bytes out of the virtual card into ordinary host memory (NumPy buffers that
  the virtual GPU does not count), so the peak it measures is the card's.
- :func:`quantize_int8` / :func:`dequantize_int8`: symmetric per-tensor int8.
- :func:`random_batches` / :func:`bucketed_batches` / :func:`padding_stats`: padding waste
  of random against length-bucketed batching.
- :func:`page_cache_fraction`: how much of a file is in the page cache (Linux ``mincore``), so
  that a "cold" read can be checked to be one.
- :func:`read_swaps` / :class:`SwapArea`: the swap areas the kernel lists in ``/proc/swaps``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from ..i18n import tr

__all__ = [
    "CopyResult",
    "measure_copy",
    "save_on_host",
    "quantize_int8",
    "dequantize_int8",
    "random_batches",
    "bucketed_batches",
    "padding_stats",
    "PaddingStats",
    "page_cache_fraction",
    "SwapArea",
    "read_swaps",
]


@dataclass(frozen=True)
class CopyResult:
    """One copy measurement: ``kind`` says what was copied where (in words, in the current language:
    :func:`vramlab.i18n.tr`); ``nbytes`` in bytes, ``seconds`` in seconds."""

    kind: str
    nbytes: int
    seconds: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second (median run)."""
        return self.nbytes / self.seconds if self.seconds > 0 else float("inf")


def measure_copy(dev: Any, nbytes: int, *, pinned: bool = False, non_blocking: bool = False,
                 repeats: int = 5, device_to_device: bool = False, fastest: bool = False) -> CopyResult:
    """Median time, in seconds, of copying ``nbytes`` bytes from host memory to ``dev``.

    On CUDA: a pageable (or ``pinned``) host tensor copied with ``.copy_(..., non_blocking=...)``,
    synchronised; with ``device_to_device``, a copy between two tensors on the card (its own
    memory; ``bandwidth`` counts each byte once, though the card reads and writes it). Without CUDA there is no device link to measure: it
    times the same copy host→host (``kind`` says ``"host→host"``); ``pinned`` is then refused,
    since pinning needs CUDA. ``nbytes`` is rounded down to whole float32 elements (4 bytes).
    The first of ``repeats + 1`` runs is dropped (it pays page faults); ``seconds`` is the median
    of the others, or with ``fastest`` the fastest of them (steadier on a busy machine, where a
    run may wait for a descheduled thread).
    """
    import torch

    n = nbytes // 4
    times = []
    if dev.is_cuda and device_to_device:
        src = torch.ones(n, dtype=torch.float32, device=dev.device)
        dst = torch.empty_like(src)
        for _ in range(repeats + 1):
            torch.cuda.synchronize(dev.device)
            t0 = time.perf_counter()
            dst.copy_(src)
            torch.cuda.synchronize(dev.device)
            times.append(time.perf_counter() - t0)
        kind = f"{dev.device}→{dev.device}"
        del src, dst
    elif dev.is_cuda:
        src = torch.empty(n, dtype=torch.float32, pin_memory=pinned)
        src.fill_(1.0)
        dst = torch.empty(n, dtype=torch.float32, device=dev.device)
        for _ in range(repeats + 1):
            torch.cuda.synchronize(dev.device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=non_blocking)
            torch.cuda.synchronize(dev.device)
            times.append(time.perf_counter() - t0)
        nb = ", non_blocking" if non_blocking else ""
        kind = (tr("host→{device} (pinned{non_blocking})", device=dev.device, non_blocking=nb) if pinned
                else tr("host→{device} (pageable{non_blocking})", device=dev.device, non_blocking=nb))
    else:
        if pinned:
            raise ValueError("pinned (page-locked) host memory needs CUDA; on the CPU measure pageable copies")
        src = torch.ones(n, dtype=torch.float32)
        dst = torch.empty(n, dtype=torch.float32)
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        kind = tr("host→host (no CUDA device)")
    times = sorted(times[1:])  # the first run pays page faults
    return CopyResult(kind=kind, nbytes=n * 4, seconds=times[0] if fastest else times[len(times) // 2])


class _HostBox:
    """A saved tensor moved to host memory the virtual GPU does not count."""

    __slots__ = ("array", "dtype", "shape")

    def __init__(self, t: Any) -> None:
        import numpy as np

        import torch

        self.dtype = t.dtype
        self.shape = tuple(t.shape)
        flat = t.detach().contiguous().reshape(-1)
        if flat.dtype == torch.bfloat16:
            flat = flat.view(torch.int16)
        self.array = np.array(flat.numpy(), copy=True)

    def restore(self) -> Any:
        """Copy back onto the card (counted there while backward uses it)."""
        import torch

        t = torch.from_numpy(self.array)
        if self.dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.reshape(self.shape).clone()


@contextlib.contextmanager
def save_on_host(dev: Any) -> Iterator[None]:
    """Offload the activations saved for backward to host memory while the block runs.

    On CUDA this is ``torch.autograd.graph.save_on_cpu(pin_memory=True)``. On the virtual
    GPU, saved tensors are copied into host buffers outside the virtual card and brought
    back for backward, so the card's peak falls by the activations' bytes; the cost is the
    copies (host→host here, over PCIe on a real card).
    """
    import torch

    if dev.is_cuda:
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            yield
        return

    def pack(t: Any) -> Any:
        if isinstance(t, torch.nn.Parameter) or t.requires_grad and t.grad_fn is None:
            return t  # parameters stay where they are
        return _HostBox(t)

    def unpack(x: Any) -> Any:
        return x.restore() if isinstance(x, _HostBox) else x

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def quantize_int8(t: Any) -> tuple[Any, float]:
    """Symmetric per-tensor int8: returns (int8 tensor, scale) with ``t ≈ q * scale``."""
    import torch

    amax = float(t.detach().abs().max())
    scale = amax / 127.0 if amax > 0 else 1.0
    q = torch.clamp(torch.round(t.detach() / scale), -127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: Any, scale: float, dtype: Any = None) -> Any:
    """Back to floating point (``float32`` unless ``dtype``)."""
    import torch

    return q.to(dtype or torch.float32) * scale


def random_batches(lengths: Sequence[int], batch_size: int, seed: int = 0) -> list[list[int]]:
    """Indices in random order, cut into batches."""
    idx = list(range(len(lengths)))
    random.Random(seed).shuffle(idx)
    return [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]


def bucketed_batches(lengths: Sequence[int], batch_size: int, seed: int = 0, bucket_batches: int = 50) -> list[list[int]]:
    """Length-bucketed batches: shuffle, sort within pools of ``bucket_batches`` batches, cut, shuffle the batches."""
    rng = random.Random(seed)
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    pool = batch_size * bucket_batches
    batches: list[list[int]] = []
    for i in range(0, len(idx), pool):
        chunk = sorted(idx[i:i + pool], key=lambda j: lengths[j])
        batches.extend(chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


@dataclass(frozen=True)
class PaddingStats:
    """Tokens in padded batches: ``real`` + ``padding`` = ``padded``; ``max_len`` is the longest batch."""

    real: int
    padding: int
    padded: int
    max_len: int
    max_batch_tokens: int

    @property
    def wasted(self) -> float:
        """The fraction of padded tokens that are padding."""
        return self.padding / self.padded if self.padded else 0.0


def padding_stats(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> PaddingStats:
    """Count real and padding tokens when each batch is padded to its longest sequence."""
    real = padded = max_len = max_tokens = 0
    for b in batches:
        if not b:
            continue
        m = max(lengths[i] for i in b)
        real += sum(lengths[i] for i in b)
        padded += m * len(b)
        max_len = max(max_len, m)
        max_tokens = max(max_tokens, m * len(b))
    return PaddingStats(real=real, padding=padded - real, padded=padded, max_len=max_len, max_batch_tokens=max_tokens)


# ---------------------------------------------------------------------- the page cache and swap

_libc: Any = None


def _mincore() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_long]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return _libc


def page_cache_fraction(path: str) -> Optional[float]:
    """The fraction (0 to 1) of ``path``'s pages that are in the page cache (in RAM) now.

    It maps the file read-only and asks the kernel with ``mincore(2)``; mapping touches no
    page, so the answer is what a read would find. ``None`` where that cannot be asked (not
    Linux, or the call fails). An empty file has no page to read: 1.0.
    """
    if not sys.platform.startswith("linux"):
        return None
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    try:
        libc = _mincore()
    except OSError:
        return None
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                return None
            resident = sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident / pages


@dataclass(frozen=True)
class SwapArea:
    """One swap area of ``/proc/swaps``: ``kind`` is ``"file"`` or ``"partition"``; sizes in bytes."""

    filename: str
    kind: str
    size: int
    used: int
    priority: int


def read_swaps(path: str = "/proc/swaps") -> list[SwapArea]:
    """The swap areas the kernel uses now, from ``/proc/swaps`` (read only; KiB there, bytes here).

    An empty list means no swap is configured (or the file does not exist: not Linux).
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    areas = []
    for line in lines[1:]:  # the first line is the header
        parts = line.split()
        if len(parts) < 5:
            continue
        name, kind, size, used, prio = parts[:5]
        areas.append(SwapArea(filename=name.replace("\\040", " "), kind=kind, size=int(size) * 1024,
                              used=int(used) * 1024, priority=int(prio)))
    return areas
