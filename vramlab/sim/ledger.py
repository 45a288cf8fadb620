"""The storage ledger that the virtual GPU and the estimator share.

How the accounting works (see ``docs/virtual-gpu.md`` for the full semantics):

- a ``TorchDispatchMode`` sees every aten operator; after each one, every output whose
  untyped storage is new (not an alias of an input, by the operator's schema) is counted
  with its ``nbytes()``, once per storage: views share their base's storage;
- a weakref callback on each counted storage subtracts it when the storage is freed,
  inside the context or after it (figures stay correct after ``__exit__``);
- ``resize_`` (``Tensor.resize_``, ``out=`` arguments that grow, and
  ``UntypedStorage.resize_``) updates the storage's size in place; while a storage is
  resized its old and new memory are both held, as CUDA's ``resize_bytes_cuda`` holds them
  (allocate, copy, free), so the peak sees both;
- the device decides before the host pays: before a real (CPU) operator runs, it is run once
  on the ``meta`` device (shapes only, no memory) to learn the bytes of every storage it will
  create or grow; those blocks are taken from the allocator (or checked against the budget)
  first, and a request the device cannot hold raises the OOM before the CPU allocates
  anything. An operator without a meta kernel (data-dependent shapes: ``nonzero``,
  ``unique``...) is checked after it runs, as before; :attr:`Ledger.checked_after` names them;
- the capacity is checked before the storage is counted: on overflow the operator's
  outputs are dropped, the OOM is raised and nothing of that operator stays counted.

This module imports torch. All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import weakref
from typing import Any, Callable, Iterator, Optional

from ..facts import Category
from .._extras import require_torch

require_torch("vramlab's simulator")  # one line saying what to install, not a bare ModuleNotFoundError

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["Ledger", "ShardLedger", "LedgerHooks", "CATEGORIES", "CUDA_BLOCK_SIZE", "storage_of",
           "counted_storage_resize", "check_category"]

#: Breakdown categories, in display order.
#: the books' categories, as :class:`vramlab.facts.Category` (a ``str``: ``"activations"`` looks them up)
CATEGORIES: tuple[str, ...] = tuple(Category)

#: The CUDA caching allocator rounds every allocation up to a multiple of 512 bytes
#: (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp); ``memory_allocated`` counts
#: the rounded sizes. ``round_blocks=True`` models that.
CUDA_BLOCK_SIZE = 512



def check_category(cat: str) -> str:
    """``cat`` if it is one of :data:`CATEGORIES`, else one ``ValueError`` listing them."""
    if cat not in CATEGORIES:
        raise ValueError(f"unknown category {cat!r}; one of {', '.join(CATEGORIES)}")
    return cat


# Categories that a later, weaker classification never overrides.
_OWNED = frozenset(("parameters", "buffers", "gradients", "optimizer_state"))

_ALIAS_CACHE: dict[Any, tuple[bool, ...]] = {}
_FRESH_OPS: set[Any] = set()
for _name in ("lift_fresh", "lift_fresh_copy", "lift"):
    _op = getattr(torch.ops.aten, _name, None)
    if _op is not None:
        _FRESH_OPS.add(_op.default)
_RESIZE_OPS = {torch.ops.aten.resize_.default}
_RESIZE_AS_OPS = {torch.ops.aten.resize_as_.default}
_META = torch.device("meta")
#: operators whose outputs the meta device cannot size (no meta kernel, data-dependent shapes)
_UNSIZED: set[Any] = set()
#: per operator: (whether it may allocate, its ``out=`` arguments' names, whether it takes ``device``)
_PLANS: dict[Any, tuple[bool, tuple[str, ...], bool]] = {}



def _alias_flags(func: Any) -> tuple[bool, ...]:
    flags = _ALIAS_CACHE.get(func)
    if flags is None:
        try:
            flags = tuple(r.alias_info is not None for r in func._schema.returns)
        except Exception:
            flags = ()
        _ALIAS_CACHE[func] = flags
    return flags


#: the sizes of each operator's new storages, by its arguments' signature (see Ledger._meta_sizes)
_SIZES: dict[Any, tuple[int, ...]] = {}
_SIZES_MAX = 65536


def _signature(x: Any) -> Any:
    """A hashable stand-in for an operator's argument that decides its outputs' sizes: a tensor's
    shape, strides, offset, dtype and device; lists and tuples item by item; anything else itself
    (a ``TypeError`` from ``hash`` when it cannot be a key)."""
    if isinstance(x, torch.Tensor):
        if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.layout != torch.strided:
            raise TypeError("not a plain tensor")
        return (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device.type)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(v) for v in x)
    hash(x)
    return (type(x), x)


def _plan(func: Any) -> tuple[bool, tuple[str, ...], bool]:
    """What the schema says of ``func``: whether it may allocate (a tensor return that is not an
    alias, or ``out=`` arguments that may grow), the names of its ``out=`` arguments, and
    whether it takes a ``device`` (a factory function)."""
    plan = _PLANS.get(func)
    if plan is None:
        try:
            schema = func._schema
            fresh = any(r.alias_info is None and "Tensor" in str(r.type) for r in schema.returns)
            outs = tuple(a.name for a in schema.arguments
                         if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
            device = any(a.name == "device" for a in schema.arguments)
        except Exception:
            fresh, outs, device = False, (), False
        plan = (fresh or bool(outs), outs, device)
        _PLANS[func] = plan
    return plan


class _Unsized(Exception):
    """An argument the meta device cannot stand for (a subclass, a sparse or nested tensor)."""


def _on_meta(x: Any) -> Any:
    """A CPU tensor's stand-in on the meta device (same shape, strides and dtype, no memory);
    the CPU device as ``meta``; anything else unchanged."""
    if isinstance(x, torch.Tensor):
        if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.layout != torch.strided or x.is_nested:
            raise _Unsized
        if x.device.type == "meta":
            return x
        if x.device.type != "cpu":
            raise _Unsized
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
    if isinstance(x, torch.device):
        if x.type not in ("cpu", "meta"):
            raise _Unsized
        return _META
    return x


def _out_on_meta(x: Any) -> Any:
    """An ``out=`` tensor's stand-in: as :func:`_on_meta`, over a meta storage of the real
    storage's size, so that growing it shows."""
    if not isinstance(x, torch.Tensor):
        return _on_meta(x)
    if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.layout != torch.strided or x.is_nested:
        raise _Unsized
    st = torch.UntypedStorage(x.untyped_storage().nbytes(), device=_META)
    return torch.empty(0, dtype=x.dtype, device=_META).set_(st, x.storage_offset(), x.shape, x.stride())


def storage_of(t: Any) -> Optional[torch.UntypedStorage]:
    try:
        return t.untyped_storage()
    except Exception:  # sparse, nested, wrapper subclasses without a storage
        return None



#: torch refuses any request of 1 EiB or more before its allocator sees it, and counts no OOM
_ONE_EXA_BYTES = 1 << 60


def _refuse_exabyte(nbytes: int) -> None:
    """``NativeCachingAllocator::allocate``'s first check: ``TORCH_CHECK_WITH(OutOfMemoryError,
    size < one_exa_bytes, "CUDA out of memory. Tried to allocate more than 1EB memory.")``."""
    if nbytes >= _ONE_EXA_BYTES:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")


def _returned(func: Any, outs: Any, single: bool) -> Iterator[tuple[torch.Tensor, bool]]:
    """Each tensor an operator returned, with whether its schema makes it an alias of an input.
    ``outs``: the one tensor in a tuple (``single``), else what the operator returned: one
    ``Tensor[]`` return (``split``, ``unbind``, foreach ops), whose elements all share its alias
    annotation, or several returns, each a tensor or a list of them. ``lift_fresh`` is new."""
    flags = _alias_flags(func)
    fresh = func in _FRESH_OPS
    if single:
        items: Iterator[tuple[Any, bool]] = iter(((outs[0], bool(flags and flags[0])),))
    elif len(flags) == 1:
        items = ((o, flags[0]) for o in outs)
    else:
        items = ((o, flags[i] if i < len(flags) else False) for i, o in enumerate(outs))
    for o, alias in items:
        for t in (o if isinstance(o, (list, tuple)) else (o,)):
            if isinstance(t, torch.Tensor):
                yield t, alias and not fresh


def _pop_reserved(reserved: list, nbytes: int) -> Any:
    """The first block taken for a storage of ``nbytes`` bytes, out of ``reserved``; else ``None``."""
    for i, (n, block) in enumerate(reserved):
        if n == nbytes:
            del reserved[i]
            return block
    return None


def _needs_values(e: BaseException) -> bool:
    """Whether a fake tensor raised ``e`` because an operator needed values it does not have
    (``.item()``, a data-dependent output shape)."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"DataDependentOutputException", "DynamicOutputShapeException",
                         "GuardOnDataDependentSymNode", "UnsupportedOperatorException"})


def _free_when_collected(ledger: Any, key: int, _ref: Any) -> None:
    """A storage was collected: free its record (a weakref callback; the ledger is kept alive by it)."""
    ledger._free(key)

class _Rec:
    __slots__ = ("raw", "counted", "cat", "ref", "saved", "block")

    def __init__(self, raw: int, counted: int, cat: str, block: Any = None) -> None:
        self.raw = raw          # storage nbytes as last seen
        self.counted = counted  # bytes in the books (rounded when round_blocks; the block's size with an allocator)
        self.cat = cat
        self.ref: Any = None
        self.saved = 0          # how many autograd saved-tensor slots hold it
        self.block = block      # the caching allocator's block, with one


class _Saved:
    """What the pack hook stores for a counted non-parameter tensor: the tensor, and on
    release (autograd frees its saved tensors) the storage leaves ``activations``."""

    __slots__ = ("t", "rec", "acct")

    def __init__(self, t: torch.Tensor, rec: _Rec, acct: "Ledger") -> None:
        # Detached: same storage, no grad_fn. Holding ``t`` itself would make a cycle
        # (t -> grad_fn -> saved slot -> this -> t) that Python's GC cannot see through the
        # autograd graph, so a forward that never reaches backward (an OOM midway, or
        # inference with grad on) would leak its activations, in the books and in RAM.
        self.t = t.detach()
        self.rec = rec
        self.acct = acct
        rec.saved += 1

    def __del__(self) -> None:
        rec = self.rec
        rec.saved -= 1
        if rec.saved <= 0 and rec.cat == "activations":
            self.acct.move(rec, "other")


class Ledger(TorchDispatchMode):
    """The storage ledger: a ``TorchDispatchMode`` that counts every new storage, once, in bytes.

    :class:`~vramlab.sim.virtual_gpu.VirtualGPU` runs it over real CPU tensors and
    :func:`~vramlab.sim.estimate.estimate` over fake ones (``fake=True``); the two count
    alike, which is why an estimate equals the VirtualGPU's measurement of the same step.

    Args:
        budget: bytes tensors may hold; ``None`` means no capacity (never raises).
        round_blocks: count each storage rounded up to :data:`CUDA_BLOCK_SIZE` bytes.
        fake: count fake tensors (``FakeTensorMode``) instead of real CPU tensors.
        on_oom: ``on_oom(requested, pending)`` builds the exception raised on overflow.
        allocator: a :class:`~vramlab.sim.allocator.CachingAllocator`: each storage gets a block
            from it and is counted by the block's size, and the allocator (not ``budget``)
            decides when memory runs out, as PyTorch's caching allocator does on a CUDA card.

    Readings (bytes): ``allocated``, ``peak``, ``cats`` and ``peak_cats`` (per category of
    :data:`CATEGORIES`, now and at the peak), ``num_ooms``. Enter it (``with ledger:``) to
    count; :class:`LedgerHooks` classifies what it counts.
    """

    def __init__(self, budget: Optional[int], *, round_blocks: bool = False, fake: bool = False,
                 on_oom: Optional[Callable[[int, int], BaseException]] = None, allocator: Any = None,
                 host_guard: Optional[Callable[[int], None]] = None,
                 no_values: Optional[Callable[[Any, BaseException], BaseException]] = None) -> None:
        super().__init__()
        self.allocator = allocator
        #: ``host_guard(nbytes)`` before a real operator allocates ``nbytes`` on the host, once the
        #: device has said yes: raises when the host cannot pay (see VirtualGPU's values)
        self.host_guard = host_guard
        #: with fake tensors standing for a device's values: ``no_values(func, error)`` builds the
        #: error raised when an operator needs a value that was never computed (``.item()``)
        self.no_values = no_values
        #: the operators whose outputs were counted after they ran (no meta kernel to size them first)
        self.checked_after: set[str] = set()
        #: ``frames()``: the Python stack to record with each block, when the allocator records history
        self.frames: Optional[Callable[[], list]] = None
        self._pending: dict[int, Any] = {}  # blocks taken for a resize before it runs (by storage id)
        self.budget = budget
        self.round_blocks = round_blocks
        self.fake = fake
        self.on_oom = on_oom
        self.allocated = 0
        self.peak = 0
        #: the highest ``allocated`` since someone last set it (to ``allocated``): a peak over a window
        self.window_peak = 0
        self.num_ooms = 0
        self.cats: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak_cats: dict[str, int] = dict(self.cats)
        self.table: dict[int, _Rec] = {}
        self.lock = threading.RLock()
        self.in_optimizer = 0
        #: bytes per category when the last (outermost) optimizer step ended (see LedgerHooks)
        self.after_step: Optional[dict[str, int]] = None
        self.allocating_as: Optional[str] = None  # the category of what is allocated now (see category())
        self.thread: Optional[int] = None
        self._paused = 0  # > 0: operators run uncounted (see paused())
        self._fake_cls: Any = None
        if fake:
            from torch._subclasses.fake_tensor import FakeTensor

            self._fake_cls = FakeTensor
        else:
            try:
                from torch._subclasses.fake_tensor import FakeTensor

                self._fake_cls = FakeTensor
            except Exception:  # pragma: no cover
                self._fake_cls = None

    # ------------------------------------------------------------------ books

    def size_of(self, raw: int) -> int:
        """Bytes an allocation of ``raw`` bytes takes in the books."""
        if self.round_blocks and raw > 0:
            return -(-raw // CUDA_BLOCK_SIZE) * CUDA_BLOCK_SIZE
        return raw

    def counts(self, t: Any) -> bool:
        """Whether this tensor is one this ledger accounts (real vs fake, device).

        A tensor on the meta device holds no memory anywhere and is never counted: a model
        built on ``torch.device("meta")`` while the ledger is active (FSDP's and DDP's ranks
        are set up inside it) costs nothing until it is materialised."""
        is_fake = self._fake_cls is not None and isinstance(t, self._fake_cls)
        if self.fake:
            return is_fake and t.device.type != "meta"
        return not is_fake and t.device.type == "cpu"

    def _bump_peak(self) -> None:
        if self.allocated > self.window_peak:
            self.window_peak = self.allocated
        if self.allocated > self.peak:
            self.peak = self.allocated
            self.peak_cats = dict(self.cats)

    def _oom(self, requested: int, pending: int) -> BaseException:
        self.num_ooms += 1
        if self.on_oom is not None:
            return self.on_oom(requested, pending)
        return torch.OutOfMemoryError(f"out of memory: tried to allocate {requested} bytes")

    def check(self, extra: int, pending: int = 0) -> None:
        if self.allocator is not None:
            return  # the allocator decides, when the block is asked for
        _refuse_exabyte(extra)
        if self.budget is not None and extra > 0 and self.allocated + pending + extra > self.budget:
            raise self._oom(extra, pending)

    def _malloc(self, raw: int) -> Any:
        """A block for ``raw`` bytes from the allocator (``None`` for 0 bytes: CUDA gives no block),
        or the OOM, built as ``on_oom`` builds it, with the segment size torch reports."""
        if raw <= 0:
            return None
        _refuse_exabyte(raw)
        from .allocator import AllocatorOOM

        frames = self.frames() if self.frames is not None else None
        with self.lock:
            try:
                return self.allocator.malloc(raw) if frames is None else self.allocator.malloc(raw, frames=frames)
            except AllocatorOOM as e:
                err = e
        raise self._oom(err.requested, 0)

    def _release(self, block: Any) -> None:
        if block is not None:
            frames = self.frames() if self.frames is not None else None
            with self.lock:
                self.allocator.free(block) if frames is None else self.allocator.free(block, frames=frames)

    def _free(self, key: int) -> None:
        rec = self.table.pop(key, None)
        if rec is not None:
            with self.lock:
                self.allocated -= rec.counted
                self.cats[rec.cat] -= rec.counted
            if rec.block is not None:
                block, rec.block = rec.block, None
                self._release(block)

    def _add(self, st: torch.UntypedStorage, raw: int, counted: int, cat: str, block: Any = None) -> None:
        key = id(st)
        rec = _Rec(raw, counted, cat, block)
        rec.ref = weakref.ref(st, functools.partial(_free_when_collected, self, key))
        with self.lock:
            self.table[key] = rec
            self.allocated += counted
            self.cats[cat] += counted

    def _regrow(self, st: torch.UntypedStorage, rec: _Rec, check: bool = True) -> None:
        raw = st.nbytes()
        if raw == rec.raw:
            self._release(self._pending.pop(id(st), None))
            return
        # As CUDA resizes a storage (resize_bytes_cuda): the new memory is allocated while the
        # old is held, the data copied, then the old freed; the peak sees both.
        old = None
        if self.allocator is not None:
            block = self._pending.pop(id(st), None)
            if block is None and raw > 0:
                block = self._malloc(raw)
            old, rec.block = rec.block, block
            counted = block.size if block is not None else 0
        else:
            counted = self.size_of(raw)
            if check:
                self.check(counted)
        with self.lock:
            before = rec.counted
            rec.raw, rec.counted = raw, counted
            self.allocated += counted
            self.cats[rec.cat] += counted
            self._bump_peak()
            self.allocated -= before
            self.cats[rec.cat] -= before
        self._release(old)

    def admit(self, storages: list[torch.UntypedStorage], cat: str, reserved: Optional[list] = None) -> int:
        """Count new storages all-or-nothing; raise the OOM when they do not fit. Returns bytes.
        ``reserved``: ``(nbytes, block)`` pairs taken before the operator ran; a storage of that
        size takes its block (and the pair leaves the list)."""
        if self.allocator is not None:
            return self._admit_blocks(storages, cat, reserved)
        sizes = []
        pending = 0
        for st, raw in self._unseen(storages):
            counted = self.size_of(raw)
            self.check(counted, pending)
            pending += counted
            sizes.append((st, raw, counted))
        for st, raw, counted in sizes:
            self._add(st, raw, counted, cat)
        self._bump_peak()
        return pending

    def _unseen(
        self, storages: list[torch.UntypedStorage]
    ) -> Iterator[tuple[torch.UntypedStorage, int]]:
        """Each storage not yet counted, once, with its size in bytes."""
        seen: set[int] = set()
        for st in storages:
            k = id(st)
            if k in seen or k in self.table:
                continue
            seen.add(k)
            yield st, st.nbytes()

    def _admit_blocks(self, storages: list[torch.UntypedStorage], cat: str, reserved: Optional[list] = None) -> int:
        """:meth:`admit` with the allocator: a block per storage (one taken before the operator
        ran, when its size is in ``reserved``); on an OOM the blocks already taken go back to
        the cache (reserved memory stays, as on a card) and nothing is counted."""
        taken: list[tuple[torch.UntypedStorage, int, Any]] = []
        try:
            for st, raw in self._unseen(storages):
                taken.append((st, raw, _pop_reserved(reserved, raw) if reserved else None))
                if taken[-1][2] is None and raw > 0:
                    taken[-1] = (st, raw, self._malloc(raw))
        except BaseException:
            for _st, _raw, block in taken:
                self._release(block)
            raise
        total = 0
        for st, raw, block in taken:
            n = block.size if block is not None else 0
            self._add(st, raw, n, cat, block)
            total += n
        self._bump_peak()
        return total

    @contextlib.contextmanager
    def category(self, cat: str) -> Iterator[None]:
        """New storages made in the block are counted as ``cat`` (one of :data:`CATEGORIES`), not
        "other": what a wrapper allocates for the model's states, e.g. DDP's gradient buckets or
        FSDP's all-gather buffers (the unsharded parameters)."""
        before, self.allocating_as = self.allocating_as, check_category(cat)
        try:
            yield
        finally:
            self.allocating_as = before

    def classify(self, t: Any, cat: str, *, force: bool = False) -> None:
        """Move a tracked tensor's storage to ``cat``. Without ``force``, parameters, buffers,
        gradients and optimizer state keep their category, and activations override only other."""
        if t is None or not isinstance(t, torch.Tensor):
            return
        st = storage_of(t)
        if st is not None:
            self.classify_storage(st, cat, force=force)

    def classify_storage(self, st: torch.UntypedStorage, cat: str, *, force: bool = False) -> None:
        """:meth:`classify` for a storage."""
        check_category(cat)
        rec = self.table.get(id(st))
        if rec is None or rec.cat == cat:
            return
        if not force and (rec.cat in _OWNED or cat == "other"):
            return
        self.move(rec, cat)

    def move(self, rec: _Rec, cat: str) -> None:
        """Move one record's bytes to another category."""
        check_category(cat)
        with self.lock:
            if rec.ref is not None and rec.ref() is None:
                return  # already freed
            self.cats[rec.cat] -= rec.counted
            self.cats[cat] += rec.counted
            rec.cat = cat

    def pack(self, t: torch.Tensor) -> Any:
        """The saved-tensors pack hook: a counted non-parameter tensor becomes an activation."""
        st = storage_of(t)
        rec = self.table.get(id(st)) if st is not None else None
        if rec is None or rec.cat in _OWNED:
            return t
        if rec.cat != "activations":
            self.move(rec, "activations")
        return _Saved(t, rec, self)

    def tracked(self, t: Any) -> bool:
        """Whether the tensor's storage is in the books."""
        st = storage_of(t) if isinstance(t, torch.Tensor) else None
        return st is not None and id(st) in self.table

    def reset_peak(self) -> None:
        """Set the peak to what is allocated now."""
        with self.lock:
            self.peak = self.allocated
            self.peak_cats = dict(self.cats)

    # ------------------------------------------------------------------ resize

    def _precheck_resize(self, t: Any, numel: int) -> None:
        if not isinstance(t, torch.Tensor) or not self.counts(t):
            return
        st = storage_of(t)
        if st is None:
            return
        rec = self.table.get(id(st))
        if rec is None:
            return
        need = (t.storage_offset() + numel) * t.element_size() if numel > 0 else 0
        if need > rec.raw:
            if self.allocator is not None:  # the new block before the op runs: its OOM leaves nothing changed
                self._take_pending(st, int(need))
            else:
                self.check(self.size_of(int(need)) - rec.counted)

    def _take_pending(self, st: torch.UntypedStorage, nbytes: int) -> None:
        """Take the block a resize of ``st`` to ``nbytes`` will need, before the resize runs
        (giving back one taken earlier); nothing for 0 bytes. Its OOM leaves the books as they were."""
        self._release(self._pending.pop(id(st), None))
        if nbytes > 0:
            self._pending[id(st)] = self._malloc(nbytes)

    def storage_resize(self, orig: Callable[..., Any], st: torch.UntypedStorage, size: int) -> Any:
        """``UntypedStorage.resize_`` while active: check, resize, update the books."""
        rec = self.table.get(id(st))
        if rec is not None:
            if self.allocator is not None:
                self._take_pending(st, int(size) if int(size) != rec.raw else 0)
            else:
                self.check(self.size_of(int(size)) - rec.counted)
        try:
            out = orig(st, size)
        except BaseException:
            if self.allocator is not None:
                self._release(self._pending.pop(id(st), None))
            raise
        if rec is not None:
            self._regrow(st, rec, check=False)
        return out

    # ------------------------------------------------------------------ dispatch

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Operators in the block run uncounted: a modelled CUDA kernel
        (:mod:`vramlab.sim.kernels`) computes its values on the CPU this way, then allocates in
        the books only what the CUDA kernel allocates."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        if func in _RESIZE_OPS:
            self._precheck_resize(args[0], math.prod(int(s) for s in args[1]))
        elif func in _RESIZE_AS_OPS and isinstance(args[1], torch.Tensor):
            self._precheck_resize(args[0], args[1].numel())
        reserved = None
        if not self.fake and (self.allocator is not None or self.budget is not None or self.host_guard is not None):
            reserved = self._decide_first(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                self._account(func, (out,), True, reserved)
            elif isinstance(out, (tuple, list)) and out:
                self._account(func, out, False, reserved)
        except Exception as e:
            if self.no_values is not None and _needs_values(e):
                raise self.no_values(func, e) from None
            raise
        finally:
            if reserved:  # blocks taken for outputs the operator did not make after all
                for _n, block in reserved:
                    self._release(block)
        return out

    # ------------------------------------------------------------------ deciding first

    def _decide_first(self, func: Any, args: tuple, kwargs: dict) -> Optional[list]:
        """Before a real operator runs: its new storages' sizes from a run on the meta device,
        the blocks for them taken (or the budget checked) and ``out=`` growth prechecked, so
        that an OOM leaves the host untouched; then the host guard. Returns the
        ``(nbytes, block)`` pairs taken, for :meth:`admit`; ``None`` when nothing was taken."""
        may, outs, device = _plan(func)
        if not may or func in _UNSIZED:
            return None
        sized = self._meta_sizes(func, args, kwargs, outs, device)
        if sized is None:
            return None
        sizes, growth = sized
        for st, nbytes in growth:  # out= arguments that will grow: as resize_ does
            rec = self.table.get(id(st))
            if rec is not None:
                if self.allocator is not None:
                    self._take_pending(st, nbytes)
                else:
                    self.check(self.size_of(nbytes))
        taken: list[tuple[int, Any]] = []
        try:
            if self.allocator is not None:
                for n in sizes:
                    if n > 0:
                        taken.append((n, self._malloc(n)))
            else:  # one after the other, as the outputs are allocated: the first that does not fit is named
                pending = 0
                for n in sizes:
                    self.check(self.size_of(n), pending)
                    pending += self.size_of(n)
            if self.host_guard is not None:
                self.host_guard(sum(sizes) + sum(n for _st, n in growth))
        except BaseException:
            for _n, block in taken:
                self._release(block)
            for st, _n in growth:
                self._release(self._pending.pop(id(st), None))
            raise
        return taken

    def _meta_sizes(self, func: Any, args: tuple, kwargs: dict, outs: tuple[str, ...],
                    device: bool) -> Optional[tuple[list[int], list[tuple[torch.UntypedStorage, int]]]]:
        """``(bytes of each new storage, [(out= storage, its new bytes)])`` from running ``func``
        on meta stand-ins of its arguments, or ``None`` when the meta device cannot say. An
        operator without ``out=`` arguments is sized once per signature (its arguments' shapes,
        strides, dtypes and other values): a training loop repeats the same calls, and a meta run
        costs far more than the lookup."""
        key = None
        if not outs:
            try:
                key = (func, _signature(args), _signature(tuple(sorted(kwargs.items()))))
                hit = _SIZES.get(key)
            except TypeError:  # an argument that cannot be a key
                key, hit = None, None
            if hit is not None:
                return list(hit), []
        sized = self._run_on_meta(func, args, kwargs, outs, device)
        if key is not None and sized is not None:
            if len(_SIZES) >= _SIZES_MAX:
                _SIZES.clear()
            _SIZES[key] = tuple(sized[0])
        return sized

    def _run_on_meta(self, func: Any, args: tuple, kwargs: dict, outs: tuple[str, ...],
                     device: bool) -> Optional[tuple[list[int], list[tuple[torch.UntypedStorage, int]]]]:
        """:meth:`_meta_sizes`' meta run."""
        try:
            margs = tree_map(_on_meta, args)
            mkw = {k: (tree_map(_out_on_meta, v) if k in outs else tree_map(_on_meta, v)) for k, v in kwargs.items()}
        except _Unsized:
            return None
        if device and mkw.get("device") is None:
            mkw["device"] = _META
        try:
            if torch._C._len_torch_dispatch_stack():  # modes below this one must not see the stand-in
                with _disable_current_modes():
                    mout = func(*margs, **mkw)
            else:
                mout = func(*margs, **mkw)
        except NotImplementedError:
            _UNSIZED.add(func)
            self.checked_after.add(str(func))
            return None
        except Exception as e:  # a data-dependent shape; or the real call will raise the same error
            if _needs_values(e) or "meta" in str(e).lower():
                _UNSIZED.add(func)
                self.checked_after.add(str(func))
            return None
        sizes: list[int] = []
        seen: set[int] = set()
        single = isinstance(mout, torch.Tensor)
        outs_ = (mout,) if single else (mout if isinstance(mout, (tuple, list)) else ())
        for t, alias in _returned(func, outs_, single):
            if not alias and t.device.type == "meta":
                mst = t.untyped_storage()
                if id(mst) not in seen:
                    seen.add(id(mst))
                    sizes.append(mst.nbytes())
        growth: list[tuple[torch.UntypedStorage, int]] = []
        for k in outs:
            real, meta = kwargs.get(k), mkw.get(k)
            pairs = zip(real, meta) if isinstance(real, (tuple, list)) and isinstance(meta, (tuple, list)) \
                else ((real, meta),)
            for r, m in pairs:
                if isinstance(r, torch.Tensor) and isinstance(m, torch.Tensor):
                    st = storage_of(r)
                    if st is not None and m.untyped_storage().nbytes() > st.nbytes():
                        growth.append((st, m.untyped_storage().nbytes()))
        return sizes, growth

    def _account(self, func: Any, outs: Any, single: bool, reserved: Optional[list] = None) -> None:
        new: list[torch.UntypedStorage] = []
        for t, alias in _returned(func, outs, single):
            self._one(t, alias, new)
        if new:
            self.admit(new, "optimizer_state" if self.in_optimizer else (self.allocating_as or "other"), reserved)

    def _one(self, t: torch.Tensor, alias: bool, new: list) -> None:
        if not self.counts(t):
            return
        st = storage_of(t)
        if st is None:
            return
        rec = self.table.get(id(st))
        if rec is not None:
            if rec.raw != st.nbytes():
                self._regrow(st, rec)
        elif not alias:
            new.append(st)


class ShardLedger(Ledger):
    r"""A :class:`~vramlab.sim.ledger.Ledger` that counts a tensor subclass by what it holds.

    FSDP2's sharded parameters, gradients and optimizer state are ``DTensor``\ s: wrapper
    subclasses whose own "storage" has the *global* shape's size and no data, while the
    rank's memory is the local shard inside. The plain ledger (and so a plain VirtualGPU)
    counts the wrapper: the full tensor's bytes on every rank (measured: twice the shard on
    2 ranks), and a fake-tensor ledger counts nothing. This one counts the inner tensors of
    every traceable wrapper subclass (``__tensor_flatten__``) instead of the wrapper.
    """

    def _account(self, func: Any, outs: Any, single: bool, reserved: Optional[list] = None) -> None:
        # An operator returning one ``Tensor(a)[]`` (``split``, ``chunk``, ``unbind``) returns
        # views, all of them: the plain ledger treats the 2nd and later as fresh, which counts
        # the whole storage of a tensor it did not see created (gloo's reduce-scatter splits a
        # temporary it made in C++, off the books; NCCL has no such torch tensor).
        if not single and isinstance(outs, list):
            flags = _alias_flags(func)
            if len(flags) == 1 and flags[0]:
                for t in outs:
                    if isinstance(t, torch.Tensor) and self.counts(t):
                        st = storage_of(t)
                        rec = self.table.get(id(st)) if st is not None else None
                        if st is not None and rec is not None and rec.raw != st.nbytes():
                            self._regrow(st, rec)
                return
        super()._account(func, outs, single, reserved)

    def _one(self, t: torch.Tensor, alias: bool, new: list) -> None:
        if is_traceable_wrapper_subclass(t):
            names, _ctx = t.__tensor_flatten__()
            for n in names:
                inner = getattr(t, n)
                if isinstance(inner, torch.Tensor):
                    self._one(inner, alias, new)
            return
        super()._one(t, alias, new)


@contextlib.contextmanager
def counted_storage_resize(acct: Ledger) -> Iterator[None]:
    """Route ``UntypedStorage.resize_`` through ``acct`` for the block, as a VirtualGPU does:
    FSDP2 frees and re-allocates its all-gather buffers with ``storage.resize_``, which no
    dispatch mode sees. Only the calling thread's resizes are counted. The one place vramlab
    patches ``resize_``: a VirtualGPU enters it too."""
    orig = torch.UntypedStorage.resize_
    me = threading.get_ident()

    def resize_(st: torch.UntypedStorage, size: int) -> Any:
        if threading.get_ident() != me:
            return orig(st, size)
        return acct.storage_resize(orig, st, size)

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = orig  # type: ignore[method-assign]



# ---------------------------------------------------------------------- hooks


class LedgerHooks:
    """Module, autograd and optimizer hooks that classify a :class:`Ledger`'s storages for
    the breakdown: parameters and buffers (forward pre-hooks), gradients (post-accumulate
    hooks), optimizer state (optimizer step hooks), activations (saved-tensor hooks).
    ``install()`` registers them for the calling thread; ``remove()`` takes them all away."""

    def __init__(self, acct: Ledger) -> None:
        self.acct = acct
        self.handles: list[Any] = []
        self.grad_hooks = WeakIdKeyDictionary()
        self.saved: Any = None

    def hook_param(self, p: torch.Tensor) -> None:
        if p.requires_grad and p not in self.grad_hooks:
            acct = self.acct
            self.grad_hooks[p] = p.register_post_accumulate_grad_hook(
                lambda q: acct.classify(q.grad, "gradients", force=True))

    def classify_module(self, m: torch.nn.Module, recurse: bool) -> None:
        acct = self.acct
        for p in m.parameters(recurse=recurse):
            acct.classify(p, "parameters", force=True)
            if p.grad is not None:
                acct.classify(p.grad, "gradients", force=True)
            self.hook_param(p)
        for b in m.buffers(recurse=recurse):
            acct.classify(b, "buffers", force=True)

    def classify_optimizer(self, opt: torch.optim.Optimizer) -> None:
        acct = self.acct
        for g in opt.param_groups:
            for p in g["params"]:
                acct.classify(p, "parameters", force=True)
                if p.grad is not None:
                    acct.classify(p.grad, "gradients", force=True)
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    acct.classify(v, "optimizer_state", force=True)

    def install(self) -> None:
        acct = self.acct
        me = threading.get_ident()

        def fwd_pre(module: torch.nn.Module, inputs: Any) -> None:
            if threading.get_ident() == me:
                self.classify_module(module, recurse=False)

        def opt_pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if threading.get_ident() == me:
                self.classify_optimizer(opt)
                acct.in_optimizer += 1

        def opt_post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if threading.get_ident() == me:
                acct.in_optimizer = max(acct.in_optimizer - 1, 0)
                self.classify_optimizer(opt)
                if acct.in_optimizer == 0:  # the outermost step (ZeRO's wraps the rank's own)
                    acct.after_step = dict(acct.cats)

        def unpack(x: Any) -> torch.Tensor:
            return x.t if type(x) is _Saved else x

        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles = [register_module_forward_pre_hook(fwd_pre),
                        register_optimizer_step_pre_hook(opt_pre),
                        register_optimizer_step_post_hook(opt_post)]
        self.saved = torch.autograd.graph.saved_tensors_hooks(acct.pack, unpack)
        self.saved.__enter__()

    def remove(self) -> None:
        if self.saved is not None:
            self.saved.__exit__(None, None, None)
            self.saved = None
        for h in self.handles:
            h.remove()
        self.handles = []
        for h in list(self.grad_hooks.values()):
            h.remove()
        self.grad_hooks = WeakIdKeyDictionary()
        self.acct.in_optimizer = 0
