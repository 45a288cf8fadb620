"""Host RAM for lessons: how much a training job needs, what it really peaks at, and the heap.

- :func:`ram_needs` adds up what a job keeps in host RAM: the interpreter and libraries,
  the dataset when it is loaded whole, the batches in flight, pinned staging copies, model
  copies on the host and data-loader workers; :class:`RamPlan` says which of the 16 / 32 /
  64 GB tiers it needs and whether it fits this machine's *effective* limit (the cgroup's
  in a container).
- :func:`peak_rss_during` runs a function and reads this process's peak RSS during it
  (``VmHWM``, reset before the call), to check a plan against a measurement.
- :func:`iter_npy_batches` streams a ``.npy`` file in mini-batches with plain reads, so
  that only one batch is resident; a ``np.load(mmap_mode="r")`` scan instead maps every page
  it touches into this process's RSS (file-backed, reclaimable, but resident).
- :func:`release_free_heap` calls glibc's ``malloc_trim(0)``: memory freed by small objects
  stays in the heap (the host's "cache", like CUDA's caching allocator) until it is trimmed.

Every figure is in bytes. Figures marked *assumed* in :class:`RamPlan` are defaults to be
replaced by your own measurement.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from ..i18n import N_, tr
from ..units import format_bytes

__all__ = [
    "TIERS_GB",
    "WORKER_OVERHEAD",
    "RamItem",
    "RamPlan",
    "ram_needs",
    "tier_for",
    "PeakRSS",
    "peak_rss_during",
    "iter_npy_batches",
    "release_free_heap",
]

#: The article's RAM tiers. A "16 GB" machine holds 16 GiB of RAM (memory comes in binary
#: sizes), so the tiers are read as GiB: 16 * 2**30 bytes.
TIERS_GB: tuple[int, ...] = (16, 32, 64)

#: Assumed private memory of one forked DataLoader worker, in bytes: its own Python objects,
#: the pages of the parent it writes to (copy-on-write) and its collate buffers. Typical
#: figures after ``import torch`` are 100 to 300 MiB; measure yours (the workers' USS).
WORKER_OVERHEAD = 200 * 2**20

GiB = 2**30


@dataclass(frozen=True)
class RamItem:
    """One line of a plan: what, how many bytes, and how the figure was obtained.

    ``name`` is the line's English name (what :meth:`RamPlan.item` looks up; :meth:`RamPlan.text`
    shows it in the current language); ``how`` is in words, in the language spoken when the plan
    was made (:func:`vramlab.i18n.tr`)."""

    name: str
    bytes: int
    how: str


@dataclass(frozen=True)
class RamPlan:
    """What a job needs in host RAM. Sizes in bytes.

    Attributes:
        items: the lines of the plan (their ``bytes`` add up to ``total``).
        total: the planned peak of the job's process(es).
        reserve: the fraction of a machine's RAM kept for the OS, page cache and other
            programs when choosing a tier.
        tier_gb: the smallest of :data:`TIERS_GB` whose RAM minus the reserve holds
            ``total``, or ``None`` when even the largest does not.
        limit: this machine's effective limit (the cgroup's when one applies), or ``None``.
    """

    items: tuple[RamItem, ...]
    total: int
    reserve: float
    tier_gb: Optional[int]
    limit: Optional[int] = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits_limit(self) -> Optional[bool]:
        """Whether ``total`` fits the effective limit here (``None`` when it is unknown)."""
        return None if self.limit is None else self.total <= self.limit

    def item(self, name: str) -> int:
        """The bytes of the line called ``name`` (0 when there is none)."""
        return sum(i.bytes for i in self.items if i.name == name)

    def text(self) -> str:
        """The plan as a plain-text table, in the current language (:func:`vramlab.i18n.tr`)."""
        labels = _item_labels()
        lines = [f"  {labels.get(i.name, i.name):<28}{format_bytes(i.bytes):>12}  {i.how}" for i in self.items]
        lines.append(f"  {tr('total'):<28}{format_bytes(self.total):>12}")
        if self.tier_gb is not None:
            lines.append("  " + tr("needs: the {gb} GB tier (keeping {reserve:.0%} of RAM for the OS and others)",
                                   gb=self.tier_gb, reserve=self.reserve))
        else:
            lines.append("  " + tr("needs: more than {gb} GB", gb=TIERS_GB[-1]))
        if self.limit is not None:
            lines.append("  " + (tr("here: limit {limit}: fits", limit=format_bytes(self.limit)) if self.fits_limit
                                 else tr("here: limit {limit}: does NOT fit", limit=format_bytes(self.limit))))
        lines.extend("  " + tr("note: {note}", note=n) for n in self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<vramlab.RamPlan total={format_bytes(self.total)} tier={self.tier_gb} GB>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text()}


def _item_labels() -> dict[str, str]:
    """The names of :func:`ram_needs`' lines as :meth:`RamPlan.text` shows them, in the current
    language; :attr:`RamItem.name` stays English (:meth:`RamPlan.item` looks lines up by it)."""
    return {
        "interpreter and libraries": tr("interpreter and libraries"),
        "dataset in memory": tr("dataset in memory"),
        "batches in flight": tr("batches in flight"),
        "pinned staging copies": tr("pinned staging copies"),
        "model copies on the host": tr("model copies on the host"),
        "data-loader workers": tr("data-loader workers"),
    }


def tier_for(total: int, reserve: float = 0.25) -> Optional[int]:
    """The smallest of :data:`TIERS_GB` (read as GiB) whose RAM, less ``reserve`` of it, holds
    ``total`` bytes; ``None`` when none does."""
    if not 0.0 <= reserve < 1.0:
        raise ValueError(f"reserve must be a fraction in [0, 1); got {reserve}")
    for t in TIERS_GB:
        if total <= t * GiB * (1.0 - reserve):
            return t
    return None


def _current_rss() -> int:
    from ..probes.host import read_host

    return int(read_host().process_rss or 0)


def _effective_limit() -> Optional[int]:
    try:
        from ..reconcile import snapshot

        return snapshot().host.limit
    except Exception:
        return None


def ram_needs(*, dataset_bytes: int = 0, load: str = "whole", batch_bytes: int = 0, workers: int = 0,
              prefetch_factor: int = 2, pin_memory: bool = False, model_parameters: int = 0,
              bytes_per_parameter: float = 4.0, model_copies: int = 1, baseline: Optional[int] = None,
              worker_overhead: int = WORKER_OVERHEAD, reserve: float = 0.25,
              limit: Optional[int] = -1) -> RamPlan:
    """Plan the host RAM of a training job.

    Args:
        dataset_bytes: the dataset's size in memory (decoded: float32 pixels, not JPEG files).
        load: ``"whole"`` (the dataset is read into RAM) or ``"stream"`` (read batch by batch).
        batch_bytes: one batch's bytes as the loader hands it over.
        workers: DataLoader worker processes (0: the main process loads).
        prefetch_factor: batches each worker prepares ahead (the DataLoader's default is 2).
        pin_memory: whether batches are copied into page-locked memory for fast transfer.
        model_parameters: parameters of the model copies the host holds.
        bytes_per_parameter: bytes per parameter of each host copy: 4 for an fp32 model that is
            built on the host and then moved to the GPU, 16 for one trained on the CPU with
            Adam (weights, gradients and two moments).
        model_copies: how many such copies exist at once (a checkpoint loaded beside the
            model: 2).
        baseline: the process before the job (interpreter, torch, CUDA runtime); default: this
            process's RSS now.
        worker_overhead: private bytes per worker (:data:`WORKER_OVERHEAD`, assumed).
        reserve: the fraction of RAM left for the OS and others when choosing a tier.
        limit: the limit to check against; default (``-1``): this machine's effective limit;
            ``None``: no check.

    Batches in flight: without workers, two (the one in use and the next being assembled);
    with workers, ``workers * prefetch_factor`` queued plus the one in use. Pinned copies:
    two batches (the one being copied and the one ready). A ``"whole"`` dataset read by
    forked workers is counted once: NumPy arrays and tensors are shared copy-on-write; lists
    of Python objects are not (every access writes their reference counts), and then each
    worker ends up with its own copy.
    """
    if load not in ("whole", "stream"):
        raise ValueError(f"load must be 'whole' or 'stream'; got {load!r}")
    for name, v in (("dataset_bytes", dataset_bytes), ("batch_bytes", batch_bytes), ("workers", workers),
                    ("prefetch_factor", prefetch_factor), ("model_parameters", model_parameters),
                    ("model_copies", model_copies), ("worker_overhead", worker_overhead)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0; got {v}")
    notes: list[str] = []
    base_how = tr("given")
    if baseline is None:
        baseline = _current_rss()
        base_how = tr("measured: this process's RSS now")
    in_flight = (workers * prefetch_factor + 1) if workers else 2
    items = [  # names stay English (RamPlan.item reads them); the "how" is in the current language
        RamItem("interpreter and libraries", int(baseline), base_how),
        RamItem("dataset in memory", int(dataset_bytes) if load == "whole" else 0,
                tr("loaded whole") if load == "whole" else tr("streamed: only batches are resident")),
        RamItem("batches in flight", int(batch_bytes * in_flight),
                f"{in_flight} x {format_bytes(batch_bytes)}"),
        RamItem("pinned staging copies", int(2 * batch_bytes) if pin_memory else 0,
                tr("{n} batches", n=2) if pin_memory else tr("pin_memory off")),
        RamItem("model copies on the host", int(model_parameters * bytes_per_parameter * model_copies),
                tr("{copies} x {parameters:,} params x {bpp:g} B", copies=model_copies,
                   parameters=model_parameters, bpp=bytes_per_parameter)),
        RamItem("data-loader workers", int(workers * worker_overhead),
                tr("{workers} x {size} (assumed)", workers=workers, size=format_bytes(worker_overhead)) if workers
                else tr("none")),
    ]
    total = sum(i.bytes for i in items)
    if limit == -1:
        limit = _effective_limit()
    return RamPlan(items=tuple(items), total=total, reserve=reserve, tier_gb=tier_for(total, reserve),
                   limit=limit, notes=tuple(notes))


@dataclass(frozen=True)
class PeakRSS:
    """This process's RSS before a call and its peak during it, in bytes."""

    before: int
    peak: int
    after: int
    exact: bool  # False where the peak could not be reset (then it is the lifetime peak)

    @property
    def delta(self) -> int:
        """``peak - before``: what the call added at its highest."""
        return self.peak - self.before


#: What a lesson prints instead of checking a peak of RSS where the kernel cannot reset its
#: high-water mark (no ``/proc/self/clear_refs`` or no ``VmHWM``, as under gVisor).
NO_PEAK_RESET = N_("this system cannot reset the process's peak RSS (no /proc/self/clear_refs or no VmHWM, "
                   "as under gVisor): the peaks here are not measured, so the checks on them are skipped")


def peak_rss_during(fn: Callable[[], Any]) -> tuple[Any, PeakRSS]:
    """Run ``fn()`` and return ``(its result, PeakRSS)``: RSS before, the peak during (the
    kernel's ``VmHWM``, reset first through ``/proc/self/clear_refs``), and RSS after."""
    from ..probes.host import read_host, reset_peak_rss

    exact = reset_peak_rss()
    before = int(read_host().process_rss or 0)
    result = fn()
    h = read_host()
    peak = int(h.process_peak or h.process_rss or 0)
    return result, PeakRSS(before=before, peak=max(peak, before), after=int(h.process_rss or 0), exact=exact)


def iter_npy_batches(path: str | os.PathLike, rows: int) -> Iterator[Any]:
    """Yield consecutive blocks of ``rows`` rows of a ``.npy`` file as NumPy arrays, read with
    ``readinto`` into a fresh array each time: only the block being used is resident."""
    import numpy as np
    from numpy.lib import format as npformat

    if rows < 1:
        raise ValueError(f"rows must be >= 1; got {rows}")
    with open(path, "rb") as f:
        version = npformat.read_magic(f)
        reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        shape, fortran, dtype = reader(f)
        if fortran:
            raise ValueError("Fortran-ordered arrays are not supported")
        n = shape[0] if shape else 1
        row_shape = tuple(shape[1:])
        for start in range(0, n, rows):
            k = min(rows, n - start)
            out = np.empty((k, *row_shape), dtype=dtype)
            got = f.readinto(memoryview(out).cast("B"))  # type: ignore[arg-type]  # numpy arrays are buffers
            if got != out.nbytes:
                raise IOError(f"short read in {path}: {got} of {out.nbytes} bytes")
            yield out


def release_free_heap() -> bool:
    """Return the free pages of the C heap to the kernel (glibc ``malloc_trim(0)``).

    Returns ``True`` when glibc released memory, ``False`` when it had none to release or
    this is not glibc (musl, macOS, a preloaded jemalloc/tcmalloc)."""
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
