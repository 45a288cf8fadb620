"""Host↔device transfer lessons: copy bandwidth, activation offload, compression, batching.

All sizes are in bytes, bandwidths in bytes per second, times in seconds.

- :func:`measure_copy` times a host→device copy (pageable or pinned; on CUDA), or, without
  CUDA, the same-size host→host copy, and says which it measured.
- :func:`save_on_host` offloads the activations saved for backward to host memory: on CUDA
  it is ``torch.autograd.graph.save_on_cpu``; on the virtual GPU it moves each saved
  tensor's bytes out of the virtual card into ordinary host memory (NumPy buffers that
  the virtual GPU does not count), so the peak it measures is the card's.
- :func:`quantize_int8` / :func:`dequantize_int8`: symmetric per-tensor int8.
- :func:`random_batches` / :func:`bucketed_batches` / :func:`padding_stats`: padding waste
  of random against length-bucketed batching.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

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
]


@dataclass(frozen=True)
class CopyResult:
    """One copy measurement: ``kind`` says what was copied where."""

    kind: str
    nbytes: int
    seconds: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second (median run)."""
        return self.nbytes / self.seconds if self.seconds > 0 else float("inf")


def measure_copy(dev: Any, nbytes: int, *, pinned: bool = False, non_blocking: bool = False,
                 repeats: int = 5) -> CopyResult:
    """Median time of copying ``nbytes`` from host memory to ``dev``.

    On CUDA: a pageable (or ``pinned``) host tensor copied with ``.to(device, non_blocking=...)``,
    synchronised. Without CUDA there is no device link to measure: it times the same copy
    host→host (``kind`` says ``"host→host"``); ``pinned`` is then refused, since pinning needs CUDA.
    """
    import torch

    n = nbytes // 4
    times = []
    if dev.is_cuda:
        src = torch.empty(n, dtype=torch.float32, pin_memory=pinned)
        src.fill_(1.0)
        dst = torch.empty(n, dtype=torch.float32, device=dev.device)
        for _ in range(repeats + 1):
            torch.cuda.synchronize(dev.device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=non_blocking)
            torch.cuda.synchronize(dev.device)
            times.append(time.perf_counter() - t0)
        kind = f"host→{dev.device} ({'pinned' if pinned else 'pageable'}{', non_blocking' if non_blocking else ''})"
    else:
        if pinned:
            raise ValueError("pinned (page-locked) host memory needs CUDA; on the CPU measure pageable copies")
        src = torch.ones(n, dtype=torch.float32)
        dst = torch.empty(n, dtype=torch.float32)
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        kind = "host→host (no CUDA device)"
    times = sorted(times[1:])  # the first run pays page faults
    return CopyResult(kind=kind, nbytes=n * 4, seconds=times[len(times) // 2])


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
    batches = []
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
