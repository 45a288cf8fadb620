"""A virtual GPU for CPU-only machines: exact accounting of tensor storages, a capacity, OOMs.

``VirtualGPU(capacity)`` is a context manager. While it is active, every tensor storage
created on the CPU by the thread that entered it is counted, exactly, in bytes; an
allocation that would exceed the capacity raises :class:`torch.OutOfMemoryError` with
the message CUDA's caching allocator writes, so code that detects a CUDA OOM (accelerate's
``should_reduce_batch_size``, Lightning's ``is_oom_error``, :mod:`vramlab.runtime.oom`) treats it
as one. While active it appears in :func:`vramlab.snapshot` as the device ``virtual:0``.

The accounting is :class:`~vramlab.sim.ledger.Ledger`'s (see ``docs/virtual-gpu.md``).

This module imports torch; ``import vramlab`` does not import it. It never imports IPython.
All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

from .._extras import require_torch

require_torch("VirtualGPU")  # one line saying what to install, not a bare ModuleNotFoundError

import torch  # noqa: E402

from ..model import DeviceSnapshot
from ..reconcile import device_layers, register_device_provider, unregister_device_provider
from ..units import format_bytes, parse_size
from .allocator import AllocConf, CachingAllocator
from .kernels import CudaKernels
from .ledger import _ONE_EXA_BYTES, CATEGORIES, CUDA_BLOCK_SIZE, Ledger, LedgerHooks, ShardLedger, counted_storage_resize, storage_of
from .presets import get_preset

__all__ = [
    "VirtualGPU",
    "HostMemoryError",
    "ValuesNotComputedError",
    "ONE_EXA_BYTES",
    "host_margin",
    "active_virtual_gpu",
    "CATEGORIES",
    "CUDA_BLOCK_SIZE",
    "cuda_format_size",
    "cuda_oom_message",
    "ALLOCATORS",
    "allocator_conf",
]

#: ``VirtualGPU(allocator=...)``: ``"caching"`` models PyTorch's CUDA caching allocator
#: (:mod:`vramlab.sim.allocator`), ``"exact"`` counts each storage's bytes (512-byte blocks with
#: ``round_blocks``) and nothing cached.
ALLOCATORS: tuple[str, ...] = ("caching", "exact")


def allocator_conf(allocator: str, alloc_conf: Optional[str]) -> Optional[AllocConf]:
    """The caching allocator's options for ``allocator="caching"`` (``alloc_conf``, or the
    environment's as torch reads it: ``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``, see
    :meth:`AllocConf.from_environ`), ``None`` for ``"exact"``; one ``ValueError`` else."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}; got {allocator!r}")
    if allocator == "exact":
        if alloc_conf is not None:
            raise ValueError("alloc_conf applies to allocator='caching'")
        return None
    return AllocConf.from_environ(os.environ) if alloc_conf is None else AllocConf.parse(alloc_conf)


#: torch refuses any single request of 1 EiB or more before its allocator sees it
#: (``NativeCachingAllocator::allocate``: ``size < one_exa_bytes``, 2**60 bytes)
ONE_EXA_BYTES = _ONE_EXA_BYTES


def host_margin(limit: int) -> int:
    """Bytes of host RAM a VirtualGPU with values leaves untouched: a sixteenth of the host's
    effective limit, at least 256 MiB (CPU kernels allocate workspaces the books never see)."""
    return max(256 << 20, limit // 16)


class HostMemoryError(MemoryError):
    """The virtual card would hold an allocation, but the host cannot pay for its values.

    A VirtualGPU with values computes every tensor on the CPU, in this machine's RAM. When a
    request the card accepts would leave the host less than :func:`host_margin`, nothing is
    allocated and this is raised instead of letting the operating system kill the kernel. It
    is not an out-of-memory error of the card: the card had room. Attributes in bytes:
    ``requested``, ``available`` (the host's, as read), ``margin``; ``device``: the card's name.
    """

    def __init__(self, requested: int, available: int, margin: int, device: str) -> None:
        self.requested, self.available, self.margin, self.device = requested, available, margin, device
        super().__init__(
            f"vramlab's virtual GPU {device!r} has room for this allocation of {format_bytes(requested)}, but it computes "
            f"tensor values in this machine's RAM, which has {format_bytes(available)} available "
            f"({format_bytes(margin)} is kept free): nothing was allocated. To ask about a card larger than "
            f"this machine, use VirtualGPU(..., values=False): shapes and memory only, no values "
            f"(what estimate() runs); or try a smaller batch.")


class ValuesNotComputedError(RuntimeError):
    """An operator needed a tensor's values on a VirtualGPU with ``values=False``, where tensors
    are fake: shapes, dtypes and memory, no values (``.item()``, ``print`` of a value, a
    data-dependent shape such as ``nonzero``). ``op``: the operator's name."""

    def __init__(self, op: str, device: str) -> None:
        self.op, self.device = op, device
        super().__init__(
            f"{op} needs tensor values, and vramlab's virtual GPU {device!r} runs with values=False: its "
            f"tensors have shapes and memory but no values, so none was computed. Remove the read "
            f"(.item(), a print, a value-dependent shape) from the step, or run it with values=True on a "
            f"card that fits this machine's RAM.")


class _HostGuard:
    """``guard(nbytes)`` before a real operator allocates ``nbytes``: refuses (HostMemoryError)
    when the host would keep less than :func:`host_margin`. It reads the host (``/proc``, the
    cgroup) only when the bytes allowed since the last reading run out, so most operators cost
    a subtraction."""

    def __init__(self, device: str, read: Optional[Callable[[], tuple[int, int]]] = None) -> None:
        self.device = device
        self.read = read or _host_available
        self.left = 0  # bytes that may still be allocated before the host is read again

    def __call__(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        if nbytes <= self.left:
            self.left -= nbytes
            return
        available, limit = self.read()
        margin = host_margin(limit)
        self.left = available - margin
        if nbytes > self.left:
            self.left = 0
            raise HostMemoryError(nbytes, available, margin, self.device)
        self.left -= nbytes


def _host_available() -> tuple[int, int]:
    """``(available, effective limit)`` of the host, in bytes (:func:`vramlab.probes.host.read_host`)."""
    from ..probes.host import read_host

    h = read_host(children=False)
    return h.available, h.limit


_ACTIVE: Optional["VirtualGPU"] = None
_ACTIVE_LOCK = threading.Lock()


def active_virtual_gpu() -> Optional["VirtualGPU"]:
    """The VirtualGPU whose context is active now (in any thread), or ``None``."""
    return _ACTIVE


def cuda_format_size(n: int) -> str:
    """Format bytes exactly as CUDA's caching allocator does in its OOM message
    (``format_size`` in c10/cuda/CUDACachingAllocator.cpp): ``512 bytes``, ``2.00 MiB``."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1048576:
        return f"{n / 1024.0:.2f} KiB"
    if n <= 1073741824:
        return f"{n / 1048576.0:.2f} MiB"
    return f"{n / 1073741824.0:.2f} GiB"


def cuda_oom_message(requested: int, total: int, free: int, process_used: int, allocated: int,
                     name: Optional[str] = None, reserved: Optional[int] = None, allowed: Optional[int] = None) -> str:
    """The text of CUDA's caching-allocator OOM, for GPU 0, in bytes, word for word as torch 2.13
    writes it (``DeviceCachingAllocator::malloc``, c10/cuda/CUDACachingAllocator.cpp), followed by
    one sentence saying that the device is vramlab's virtual GPU. ``reserved``: what the caching
    allocator holds (``None``: exact accounting, nothing cached); ``allowed``: the maximum a
    memory fraction sets (torch's ``"X allowed; "``), or ``None``."""
    where = f"vramlab's virtual GPU{f' {name!r}' if name else ''} (virtual:0), simulated on the CPU"
    cached = 0 if reserved is None else reserved - allocated
    hint = (" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
            if reserved is not None else "")
    allowed_info = f"{cuda_format_size(allowed)} allowed; " if allowed is not None else ""
    return (
        f"CUDA out of memory. Tried to allocate {cuda_format_size(requested)}. "
        f"GPU 0 has a total capacity of {cuda_format_size(total)} of which {cuda_format_size(max(free, 0))} is free. "
        f"Including non-PyTorch memory, this process has {cuda_format_size(process_used)} memory in use. "
        f"{allowed_info}Of the allocated memory {cuda_format_size(allocated)} is allocated by PyTorch, and "
        f"{cuda_format_size(cached)} is reserved by PyTorch but unallocated.{hint} This device is {where}: "
        f"the allocation was refused and nothing of it is counted."
    )



#: the machinery between a user's call and the books: vramlab's simulator, torch's dispatch-mode,
#: operator, override, fake-tensor and dynamo-guard layers (none of it is on CUDA's stack)
_MACHINERY = tuple(os.sep + os.path.join(*parts) for parts in (
    ("vramlab", "sim", ""), ("torch", "utils", "_python_dispatch.py"), ("torch", "_ops.py"),
    ("torch", "overrides.py"), ("torch", "_subclasses", ""), ("torch", "_dynamo", ""),
    ("torch", "utils", "_contextlib.py"), ("torch", "_compile.py")))


def _python_frames() -> list[dict[str, Any]]:
    """The Python stack of the code allocating now, innermost first, in torch's snapshot format
    (``{"filename", "line", "name"}``): as on CUDA, where the innermost Python frame is the code
    that called the operator, the innermost frames of the simulator's machinery are left out."""
    stack = traceback.extract_stack()
    end = len(stack)
    while end > 0 and any(part in stack[end - 1].filename for part in _MACHINERY):
        end -= 1
    return [{"filename": fr.filename, "line": fr.lineno or 0, "name": fr.name} for fr in reversed(stack[:end])]


# ---------------------------------------------------------------------- VirtualGPU


@dataclass(frozen=True)
class _Spec:
    capacity: int
    name: Optional[str]
    context: int
    preset: Optional[str]


def _resolve_capacity(capacity: Union[int, str], name: Optional[str], context: Optional[int]) -> _Spec:
    """The device's capacity, name and context from ``VirtualGPU``'s arguments, or one ``ValueError``.

    A capacity is positive, finite and at most ``2**63 - 1`` bytes (:func:`~vramlab.units.parse_size`):
    ``"-1GiB"``, ``"nan"`` or ``"1e400GiB"`` get that error, not "unknown GPU preset"."""
    from ..units import looks_like_size

    if isinstance(capacity, float):  # nan, inf: "not finite"; 1.5: bytes are an int
        parse_size(capacity, what="capacity", positive=True)
    if isinstance(capacity, bool) or not isinstance(capacity, (int, str)):
        raise ValueError(f"capacity must be bytes (int), a size such as '16GiB', or a GPU preset name; "
                         f"got {capacity!r}")
    preset = None
    if isinstance(capacity, str):
        try:
            total = parse_size(capacity, what="capacity", positive=True)
        except ValueError as size_error:
            try:
                p = get_preset(capacity)
            except ValueError as e:
                if looks_like_size(capacity):  # "-1GiB", "nan", "16GiBs": the size's error
                    raise ValueError(f"{size_error}; a capacity is a size such as '16GiB' or a GPU preset "
                                     "name such as 'T4'") from None
                raise ValueError(f"capacity {capacity!r} is neither a size (e.g. '16GiB') nor a GPU preset: {e}") from None
            total, preset = p.memory, p.name
            if context is None:
                context = p.context_overhead
    else:
        total = parse_size(capacity, what="capacity", positive=True)
    context = 0 if context is None else int(context)
    if context < 0 or context >= total:
        raise ValueError(f"context overhead {context} bytes must be in [0, capacity={total})")
    return _Spec(capacity=total, name=name or preset, context=context, preset=preset)


class VirtualGPU:
    """A GPU of ``capacity`` bytes, simulated on the CPU with exact storage accounting.

    Args:
        capacity: bytes (``16 * 2**30``), a size (``"16GiB"``, ``"512MB"``) or a GPU preset
            name (``"T4"``, ``"A100-80GB"``: see :mod:`vramlab.sim.presets`).
        name: the device's name in ``snapshot()`` (default: the preset's name, else
            ``"virtual GPU"``).
        round_blocks: count each storage rounded up to a multiple of 512 bytes, as the CUDA
            caching allocator does, so that ``allocated`` predicts a real card's
            ``torch.cuda.memory_allocated``. Off by default: figures are exact ``nbytes``.
        context_overhead: bytes the CUDA context takes on the card (not available to
            tensors). Default: the preset's modelled overhead
            (:data:`vramlab.sim.presets.CUDA_CONTEXT_OVERHEAD`) for a preset, 0 for a size.
        allocator: ``"caching"`` (the default: PyTorch's CUDA caching allocator, modelled in
            :mod:`vramlab.sim.allocator`) or ``"exact"`` (each storage's bytes, nothing cached).
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` for the caching allocator (default: the environment's).
        kernels: ``"cuda"`` (the default for a GPU preset): dropout, attention, optimizers and the
            cuBLAS workspace allocate and save what CUDA's kernels do on that card
            (:mod:`vramlab.sim.kernels`); ``"cpu"`` (the default for a bare size): the CPU's.
        compute_capability: ``(major, minor)`` of the card a bare size stands for; with it the
            CUDA kernels are the default (a preset brings its own).
        count_shards: count a tensor subclass (FSDP2's ``DTensor``) by the local tensors it
            holds rather than its global size (:class:`~vramlab.sim.ledger.ShardLedger`): what
            one rank's device holds. Off by default.
        values: ``True`` (the default): tensors are real CPU tensors with real values, held in
            this machine's RAM; an allocation the card accepts but the host cannot pay for
            raises :class:`HostMemoryError` (nothing allocated) rather than letting the
            operating system kill the process. ``False``: tensors made inside are fake
            (``FakeTensorMode``: shapes, dtypes and the card's memory, no values and no host
            memory), so a card larger than this machine can run a whole step, exactly as
            :func:`~vramlab.estimate` counts it; reading a value (``.item()``) raises
            :class:`ValuesNotComputedError`. Create the model inside the context (or
            :meth:`adopt` it) so that its parameters are fake too.

    Use::

        with VirtualGPU("T4") as gpu:
            model = make_model(); loss = model(x).sum(); loss.backward()
        gpu.peak, gpu.breakdown()

    Every allocation asks the card first: the bytes an operator will allocate are sized on the
    meta device before it runs, so a request the card cannot hold raises the OOM before the
    host allocates anything.

    Semantics (``docs/virtual-gpu.md``): one VirtualGPU is active at a time in a process
    (entering a second raises ``ValueError``; re-entering the same one after it exited
    resumes its books). Only operations of the thread that entered it are counted; frees
    are counted from any thread, and after ``__exit__`` (figures stay correct while
    tensors die). Tensors that existed before are not counted unless ``adopt()``-ed.
    """

    def __init__(self, capacity: Union[int, str], name: Optional[str] = None, *, round_blocks: bool = False,
                 context_overhead: Optional[int] = None, count_shards: bool = False, allocator: str = "caching",
                 alloc_conf: Optional[str] = None, kernels: Optional[str] = None,
                 compute_capability: Optional[tuple[int, int]] = None, values: bool = True) -> None:
        spec = _resolve_capacity(capacity, name, context_overhead)
        self._spec = spec
        if not isinstance(values, bool):
            raise ValueError(f"values must be True (real tensors) or False (shapes and memory only); got {values!r}")
        self.values = values
        conf = allocator_conf(allocator, alloc_conf)
        self.allocator_kind = allocator
        self._alloc: Optional[CachingAllocator] = None
        self._fraction = 1.0
        if conf is not None:
            self._alloc = CachingAllocator(spec.capacity - spec.context, conf, total_memory=spec.capacity)
            round_blocks = True  # every block is a multiple of 512 bytes
            if conf.per_process_memory_fraction is not None:
                self._fraction = conf.per_process_memory_fraction
        self.round_blocks = bool(round_blocks)
        books = ShardLedger if count_shards else Ledger
        self._fake_mode: Any = None
        if not values:
            from torch._subclasses.fake_tensor import FakeTensorMode

            self._fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self._acct = books(spec.capacity - spec.context, round_blocks=self.round_blocks, on_oom=self._make_oom,
                           allocator=self._alloc, fake=not values,
                           host_guard=_HostGuard(self.name) if values else None,
                           no_values=None if values else self._no_values)
        if self._fraction < 1.0:
            self._apply_fraction(self._fraction)
        self._hooks = LedgerHooks(self._acct)
        if kernels not in (None, "cuda", "cpu"):
            raise ValueError(f"kernels must be 'cuda' or 'cpu'; got {kernels!r}")
        cc = compute_capability or (get_preset(spec.preset).compute_capability if spec.preset else None)
        if kernels == "cuda" and cc is None:
            raise ValueError("kernels='cuda' needs a GPU preset or compute_capability= (it picks the kernels)")
        self._kernels = CudaKernels(self._acct, cc) if cc is not None and kernels in (None, "cuda") else None
        self._stack: Optional[contextlib.ExitStack] = None
        self._active = False
        self._provider = self._devices

    # ---------------------------------------------------------------- readings

    @property
    def kernels(self) -> Optional[CudaKernels]:
        """The CUDA kernels' model in use (a GPU preset's), or ``None`` (the CPU's kernels)."""
        return self._kernels

    @property
    def ledger(self) -> Ledger:
        """The :class:`~vramlab.sim.ledger.Ledger` that keeps this device's books."""
        return self._acct

    @property
    def hooks(self) -> LedgerHooks:
        """The :class:`~vramlab.sim.ledger.LedgerHooks` that classify this device's storages."""
        return self._hooks

    @property
    def capacity(self) -> int:
        """The card's total memory in bytes (what ``total capacity`` says in an OOM)."""
        return self._spec.capacity

    @property
    def context_overhead(self) -> int:
        """Bytes modelled as taken by the CUDA context (0 unless a preset models it)."""
        return self._spec.context

    @property
    def budget(self) -> int:
        """Bytes available to tensors: ``capacity - context_overhead``."""
        return self._spec.capacity - self._spec.context

    @property
    def name(self) -> str:
        """The device's name (the preset's, when one was given)."""
        return self._spec.name or "virtual GPU"

    @property
    def preset(self) -> Optional[str]:
        """The preset's canonical name, or ``None`` for a plain size."""
        return self._spec.preset

    @property
    def allocated(self) -> int:
        """Bytes in live counted storages now (rounded to 512-byte blocks when ``round_blocks``)."""
        return self._acct.allocated

    @property
    def peak(self) -> int:
        """The highest ``allocated`` since creation or the last :meth:`reset_peak`, in bytes."""
        return self._acct.peak

    @property
    def free(self) -> int:
        """Bytes still available: ``budget - allocated`` (exact accounting), or the device's free
        memory ``budget - reserved`` with the caching allocator (``cudaMemGetInfo``'s, the
        context aside: cached blocks are not free to other processes)."""
        return self.budget - self.reserved

    @property
    def reserved(self) -> int:
        """Bytes the caching allocator holds in segments (``torch.cuda.memory_reserved``):
        allocated plus cached; ``allocated`` with exact accounting."""
        return self._alloc.reserved if self._alloc is not None else self._acct.allocated

    @property
    def max_reserved(self) -> int:
        """The highest :attr:`reserved` (``torch.cuda.max_memory_reserved``), in bytes."""
        return self._alloc.peak_reserved if self._alloc is not None else self._acct.peak

    @property
    def alloc_conf(self) -> Optional[AllocConf]:
        """The caching allocator's options (``PYTORCH_CUDA_ALLOC_CONF``), or ``None``."""
        return self._alloc.conf if self._alloc is not None else None

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: give cached segments back (nothing to do with exact accounting)."""
        if self._alloc is not None:
            frames: list[dict[str, Any]] = []
            if self._acct.frames is not None:  # as torch's: this method's frame (torch.cuda.empty_cache's), then the caller's
                frames = [{"filename": __file__, "line": sys._getframe().f_lineno, "name": "empty_cache"},
                          *self._acct.frames()]
            with self._acct.lock:
                self._alloc.empty_cache(frames=frames)

    def memory_stats(self) -> dict[str, Any]:
        """``torch.cuda.memory_stats()``, with torch's key names (bytes and counts). With exact
        accounting the allocator keys describe one block per storage and nothing cached."""
        if self._alloc is not None:
            with self._acct.lock:
                return self._alloc.memory_stats()
        a, p = self._acct.allocated, self._acct.peak
        out: dict[str, Any] = {}
        for name in ("allocated_bytes", "reserved_bytes", "active_bytes"):
            out[f"{name}.all.current"], out[f"{name}.all.peak"] = a, p
        out["inactive_split_bytes.all.current"] = 0
        out["num_ooms"] = self._acct.num_ooms
        out["num_alloc_retries"] = 0
        return out

    def memory_snapshot(self) -> list[dict[str, Any]]:
        """``torch.cuda.memory_snapshot()``: the segments and their blocks (caching allocator only)."""
        if self._alloc is None:
            raise ValueError("memory_snapshot() needs VirtualGPU(..., allocator='caching')")
        with self._acct.lock:
            return list(self._alloc.snapshot()["segments"])

    def memory_dump(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()``: ``{"segments", "device_traces"}``, which
        ``torch.cuda._memory_viz`` renders (``segsum``, ``trace``, ``segment_plot``)."""
        if self._alloc is None:
            raise ValueError("memory_dump() needs VirtualGPU(..., allocator='caching')")
        with self._acct.lock:
            return self._alloc.snapshot()

    # ---------------------------------------------------------------- torch.cuda's names

    def memory_allocated(self) -> int:
        """``torch.cuda.memory_allocated()``: :attr:`allocated`, in bytes."""
        return self.allocated

    def max_memory_allocated(self) -> int:
        """``torch.cuda.max_memory_allocated()``: :attr:`peak`, in bytes."""
        return self.peak

    def memory_reserved(self) -> int:
        """``torch.cuda.memory_reserved()``: :attr:`reserved`, in bytes."""
        return self.reserved

    def max_memory_reserved(self) -> int:
        """``torch.cuda.max_memory_reserved()``: :attr:`max_reserved`, in bytes."""
        return self.max_reserved

    def reset_peak_memory_stats(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: :meth:`reset_peak`."""
        self.reset_peak()

    def set_per_process_memory_fraction(self, fraction: float) -> None:
        """``torch.cuda.set_per_process_memory_fraction``: this process may hold at most
        ``round(fraction * capacity)`` bytes of the card in the caching allocator's segments (torch's
        ``setMemoryFraction``; 1.0 lifts the limit); over it, an allocation is an OOM that says
        ``"X allowed;"``. Validated as torch validates it: a ``float`` in [0, 1]."""
        if not isinstance(fraction, float):  # torch/cuda/memory.py
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self._apply_fraction(fraction)

    def get_per_process_memory_fraction(self) -> float:
        """``torch.cuda.get_per_process_memory_fraction``: the fraction set (1.0 when none)."""
        return self._fraction

    def _apply_fraction(self, fraction: float) -> None:
        self._fraction = float(fraction)
        allowed = self._allowed()
        if self._alloc is not None:
            with self._acct.lock:
                self._alloc.set_memory_fraction(self._fraction)
        else:
            self._acct.budget = self.budget if allowed is None else min(self.budget, allowed)

    def _allowed(self) -> Optional[int]:
        """The bytes a memory fraction allows (``round(fraction * capacity)``), or ``None`` (none set)."""
        return round(self._fraction * self._spec.capacity) if self._fraction < 1.0 else None

    def record_memory_history(self, enabled: Union[None, bool, str] = "all", context: Optional[str] = "all",
                              stacks: str = "all", max_entries: int = sys.maxsize, device: Any = None,
                              clear_history: bool = False, compile_context: bool = False,
                              global_record_annotations: bool = False, skip_actions: Optional[list[str]] = None) -> None:
        """``torch.cuda.memory._record_memory_history``: record the allocator's trace (alloc, free,
        segment events) for :meth:`memory_dump`. ``enabled``: ``"all"`` (or ``True``) records
        the trace and stacks, ``"state"`` the stacks of live blocks only, ``None`` (or ``False``)
        stops and clears; ``context``: ``"alloc"``, ``"state"``, ``"all"`` or ``None`` (where
        stacks are kept, as torch: ``"all"`` also records the stack of each free); ``stacks``:
        ``"python"`` or ``"all"`` (the Python frames of the code that allocated: there is no
        C++ stack on a virtual card); ``max_entries``: the trace's ring buffer; ``clear_history``:
        start from an empty trace; ``skip_actions``: trace actions not to record (``"alloc"``,
        ``"free_requested"``, ...). ``device``, ``compile_context`` and ``global_record_annotations``
        are accepted as torch accepts them and change nothing here (one device, no compiler
        context, no annotations)."""
        if self._alloc is None:
            raise ValueError("record_memory_history() needs VirtualGPU(..., allocator='caching')")
        if enabled is True:
            enabled = "all"
        if enabled is False:
            enabled = None
        if enabled not in (None, "state", "all"):
            raise ValueError(f"enabled must be None, 'state' or 'all'; got {enabled!r}")
        if context not in (None, "state", "alloc", "all"):
            raise ValueError(f"context must be None, 'state', 'alloc' or 'all'; got {context!r}")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all'; got {stacks!r}")
        with self._acct.lock:  # torch's _record_memory_history: "state" keeps one entry, stacks of live blocks
            if clear_history:
                self._alloc.set_record_history(False, clear=True)
            self._alloc.set_record_history(enabled is not None, max_entries=max_entries if enabled == "all" else 1,
                                           clear=enabled is None, context=context,
                                           skip_actions=tuple(skip_actions or ()))
        self._acct.frames = _python_frames if enabled is not None and context is not None else None

    @property
    def num_ooms(self) -> int:
        """How many out-of-memory errors this device raised."""
        return self._acct.num_ooms

    @property
    def active(self) -> bool:
        """Whether the context is active now."""
        return self._active

    def reset_peak(self) -> None:
        """Set the peak (and its breakdown) to what is allocated now, and the allocator's peaks."""
        self._acct.reset_peak()
        if self._alloc is not None:
            with self._acct.lock:
                self._alloc.reset_peak()

    def breakdown(self, at: str = "current") -> dict[str, int]:
        """Bytes per category, now (``at="current"``) or at the peak (``at="peak"``).

        Categories: ``parameters``, ``buffers`` (module hooks and :meth:`adopt`),
        ``gradients`` (post-accumulate-grad hooks), ``optimizer_state`` (optimizer step
        hooks), ``activations`` (saved for backward: ``saved_tensors_hooks``), and ``other``
        (inputs, outputs, temporaries). The values add up to ``allocated`` (or ``peak``).
        """
        if at == "current":
            return dict(self._acct.cats)
        if at == "peak":
            return dict(self._acct.peak_cats)
        raise ValueError(f"at must be 'current' or 'peak'; got {at!r}")

    def is_tracked(self, t: torch.Tensor) -> bool:
        """Whether this tensor's storage is counted on this device."""
        return self._acct.tracked(t)

    # ---------------------------------------------------------------- adopt

    def adopt(self, obj: Any) -> int:
        """Count tensors that already exist, as if moved onto this device. Returns bytes added.

        ``obj`` is a tensor, a module (parameters, buffers, gradients), an optimizer (its
        parameters, gradients and state), or a dict/iterable of these. Storages already
        counted are skipped. All or nothing: when the lot does not fit, the OOM is raised
        and none of it is counted.
        """
        groups: dict[str, list[torch.UntypedStorage]] = {c: [] for c in CATEGORIES}
        modules: list[torch.nn.Module] = []
        self._collect(obj, groups, modules, depth=0)
        acct = self._acct
        # one category per storage: the first in CATEGORIES wins (a parameter over "other")
        cat_of: dict[int, tuple[str, torch.UntypedStorage]] = {}
        for c in CATEGORIES:
            for st in groups[c]:
                cat_of.setdefault(id(st), (c, st))
        fresh = [(c, st) for c, st in cat_of.values() if id(st) not in acct.table]
        # check the whole lot first (all or nothing), then count it
        pending = 0
        for _c, st in fresh:
            n = acct.size_of(st.nbytes())
            acct.check(n, pending)
            pending += n
        added = 0
        for c in CATEGORIES:
            added += acct.admit([st for cc, st in fresh if cc == c], c)
        for c, st in cat_of.values():  # already counted (created inside): give it its category
            if c != "other":
                acct.classify_storage(st, c, force=True)
        for m in modules:
            for p in m.parameters():
                self._hooks.hook_param(p)
        return added

    def _collect(self, obj: Any, groups: dict[str, list], modules: list, depth: int) -> None:
        if depth > 8 or obj is None:
            return

        def put(t: Any, cat: str) -> None:
            if isinstance(t, torch.Tensor) and (self._acct.counts(t) or (not self.values and t.device.type == "cpu")):
                st = storage_of(t)
                if st is not None:
                    groups[cat].append(st)

        if isinstance(obj, torch.nn.Parameter):
            put(obj, "parameters")
            put(obj.grad, "gradients")
        elif isinstance(obj, torch.Tensor):
            put(obj, "other")
        elif isinstance(obj, torch.nn.Module):
            modules.append(obj)
            for p in obj.parameters():
                put(p, "parameters")
                put(p.grad, "gradients")
            for b in obj.buffers():
                put(b, "buffers")
        elif isinstance(obj, torch.optim.Optimizer):
            for g in obj.param_groups:
                for p in g["params"]:
                    put(p, "parameters")
                    put(p.grad, "gradients")
            for state in obj.state.values():
                for v in state.values():
                    put(v, "optimizer_state")
        elif isinstance(obj, dict):
            for v in obj.values():
                self._collect(v, groups, modules, depth + 1)
        elif isinstance(obj, (str, bytes)):
            raise TypeError(f"cannot adopt {type(obj).__name__}")
        elif isinstance(obj, Iterable):
            for v in obj:
                self._collect(v, groups, modules, depth + 1)
        else:
            raise TypeError(f"cannot adopt {type(obj).__name__}: pass a tensor, module, optimizer or iterable of them")

    # ---------------------------------------------------------------- OOM

    def _make_oom(self, requested: int, pending: int) -> BaseException:
        if self._alloc is not None:  # what the caching allocator holds, as torch reports it
            used = self._alloc.reserved + self._spec.context
            return torch.OutOfMemoryError(cuda_oom_message(
                requested, self._spec.capacity, self._spec.capacity - used, used, self._alloc.allocated,
                self._spec.name, reserved=self._alloc.reserved, allowed=self._allowed()))
        alloc = self._acct.allocated + pending
        used = alloc + self._spec.context
        return torch.OutOfMemoryError(cuda_oom_message(
            requested, self._spec.capacity, self._spec.capacity - used, used, alloc, self._spec.name,
            allowed=self._allowed()))

    def _no_values(self, func: Any, error: BaseException) -> BaseException:
        name = str(func)
        if "_local_scalar_dense" in name:
            name = "reading a value (.item(), float(), bool(), a print)"
        return ValuesNotComputedError(name, self.name)

    # ---------------------------------------------------------------- snapshot provider

    def device_snapshot(self) -> Any:
        """This device as a :class:`vramlab.DeviceSnapshot` (``virtual:0``), in bytes."""
        alloc = self._acct.allocated
        total = self._spec.capacity
        reserved, peak_reserved, inactive, retries = alloc, self._acct.peak, 0, 0
        if self._alloc is not None:  # what nvidia-smi would show: the context plus PyTorch's segments
            st = self.memory_stats()
            reserved, peak_reserved = st["reserved_bytes.all.current"], st["reserved_bytes.all.peak"]
            inactive, retries = st["inactive_split_bytes.all.current"], st["num_alloc_retries"]
        used = reserved + self._spec.context
        return DeviceSnapshot(
            id="virtual:0", kind="virtual", name=self.name, uuid=None, source="virtual", nvml_index=None,
            total=total, free=max(total - used, 0), used=used, driver_reserved=None, process_used=used,
            other_processes_used=0, utilization=None, torch_allocated=alloc, torch_reserved=reserved,
            torch_active=alloc, torch_inactive_split=inactive, torch_peak_allocated=self._acct.peak,
            torch_peak_reserved=peak_reserved, num_ooms=self._acct.num_ooms, num_alloc_retries=retries,
            mem_info_free=max(total - used, 0), mem_info_total=total, unified_memory=False,
            layers=device_layers(total, used, process_used=used, torch_reserved=reserved, torch_allocated=alloc),
        )

    def _devices(self) -> list:
        return [self.device_snapshot()] if self._active else []

    # ---------------------------------------------------------------- context

    def __enter__(self) -> "VirtualGPU":
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                which = "this VirtualGPU is already active" if _ACTIVE is self else \
                    f"another VirtualGPU ({_ACTIVE.name}) is active"
                raise ValueError(f"VirtualGPUs do not nest: {which}; leave it first")
            _ACTIVE = self
        try:
            acct = self._acct
            acct.thread = threading.get_ident()
            self._stack = contextlib.ExitStack()
            if self._fake_mode is not None:  # beneath the ledger: it sees each operator first
                self._stack.enter_context(self._fake_mode)
            self._stack.enter_context(counted_storage_resize(acct))
            self._hooks.install()
            acct.__enter__()
            self._active = True
            if self._kernels is not None:
                self._stack.enter_context(self._kernels)
            register_device_provider(self._provider, self.reset_peak, self.empty_cache)
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._teardown()

    def _teardown(self) -> None:
        global _ACTIVE
        last = None
        if self._active:
            try:  # the last reading, for the record of the cell that entered and left this card
                last = self._devices()
            except Exception:
                last = None
        unregister_device_provider(self._provider, last)
        if self._active:
            self._acct.__exit__(None, None, None)
        self._active = False
        self._hooks.remove()
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        with _ACTIVE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return (f"<vramlab.VirtualGPU {self.name!r} {format_bytes(self.capacity)}, {state}: "
                f"allocated {format_bytes(self.allocated)}, peak {format_bytes(self.peak)}>")
