"""A virtual GPU for CPU-only machines: exact accounting of tensor storages, a capacity, OOMs.

``VirtualGPU(capacity)`` is a context manager. While it is active, every tensor storage
created on the CPU by the thread that entered it is counted, exactly, in bytes; an
allocation that would exceed the capacity raises :class:`torch.OutOfMemoryError` with
the message CUDA's caching allocator writes, so code that detects a CUDA OOM (accelerate's
``should_reduce_batch_size``, Lightning's ``is_oom_error``, :mod:`vramlab.oom`) treats it
as one. While active it appears in :func:`vramlab.snapshot` as the device ``virtual:0``.

How the accounting works (see ``docs/virtual-gpu.md`` for the full semantics):

- a ``TorchDispatchMode`` sees every aten operator; after each one, every output whose
  untyped storage is new (not an alias of an input, by the operator's schema) is counted
  with its ``nbytes()``, once per storage: views share their base's storage;
- a weakref callback on each counted storage subtracts it when the storage is freed,
  inside the context or after it (figures stay correct after ``__exit__``);
- ``resize_`` (``Tensor.resize_``, ``out=`` arguments that grow, and
  ``UntypedStorage.resize_``) updates the storage's size in place;
- the capacity is checked before the storage is counted: on overflow the operator's
  outputs are dropped, the OOM is raised and nothing of that operator stays counted.

This module imports torch; ``import vramlab`` does not import it. It never imports IPython.
All sizes are in bytes.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from .._sizes import format_bytes, parse_size

__all__ = [
    "VirtualGPU",
    "active_virtual_gpu",
    "CATEGORIES",
    "CUDA_BLOCK_SIZE",
    "cuda_format_size",
    "cuda_oom_message",
]

#: Breakdown categories, in display order.
CATEGORIES: tuple[str, ...] = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "other")

#: The CUDA caching allocator rounds every allocation up to a multiple of 512 bytes
#: (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp); ``memory_allocated`` counts
#: the rounded sizes. ``round_blocks=True`` models that.
CUDA_BLOCK_SIZE = 512

# Categories that a later, weaker classification never overrides.
_OWNED = frozenset(("parameters", "buffers", "gradients", "optimizer_state"))

_ACTIVE: Optional["VirtualGPU"] = None
_ACTIVE_LOCK = threading.Lock()

_ALIAS_CACHE: dict[Any, tuple[bool, ...]] = {}
_FRESH_OPS: set[Any] = set()
for _name in ("lift_fresh", "lift_fresh_copy", "lift"):
    _op = getattr(torch.ops.aten, _name, None)
    if _op is not None:
        _FRESH_OPS.add(_op.default)
_RESIZE_OPS = {torch.ops.aten.resize_.default}
_RESIZE_AS_OPS = {torch.ops.aten.resize_as_.default}


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
                     name: Optional[str] = None) -> str:
    """The text of CUDA's caching-allocator OOM (torch 2.x wording), for GPU 0, in bytes,
    followed by one sentence saying that the device is vramlab's virtual GPU."""
    where = f"vramlab's virtual GPU{f' {name!r}' if name else ''} (virtual:0), simulated on the CPU"
    return (
        f"CUDA out of memory. Tried to allocate {cuda_format_size(requested)}. "
        f"GPU 0 has a total capacity of {cuda_format_size(total)} of which {cuda_format_size(max(free, 0))} is free. "
        f"Including non-PyTorch memory, this process has {cuda_format_size(process_used)} memory in use. "
        f"Of the allocated memory {cuda_format_size(allocated)} is allocated by PyTorch, and 0 bytes is reserved "
        f"by PyTorch but unallocated. This device is {where}: the allocation was refused and nothing of it "
        f"is counted."
    )


def _alias_flags(func: Any) -> tuple[bool, ...]:
    flags = _ALIAS_CACHE.get(func)
    if flags is None:
        try:
            flags = tuple(r.alias_info is not None for r in func._schema.returns)
        except Exception:
            flags = ()
        _ALIAS_CACHE[func] = flags
    return flags


def _storage(t: Any) -> Optional[torch.UntypedStorage]:
    try:
        return t.untyped_storage()
    except Exception:  # sparse, nested, wrapper subclasses without a storage
        return None


class _Rec:
    __slots__ = ("raw", "counted", "cat", "ref", "saved")

    def __init__(self, raw: int, counted: int, cat: str) -> None:
        self.raw = raw          # storage nbytes as last seen
        self.counted = counted  # bytes in the books (rounded when round_blocks)
        self.cat = cat
        self.ref: Any = None
        self.saved = 0          # how many autograd saved-tensor slots hold it


class _Saved:
    """What the pack hook stores for a counted non-parameter tensor: the tensor, and on
    release (autograd frees its saved tensors) the storage leaves ``activations``."""

    __slots__ = ("t", "rec", "acct")

    def __init__(self, t: torch.Tensor, rec: _Rec, acct: "_Accountant") -> None:
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


class _Accountant(TorchDispatchMode):
    """The storage ledger shared by :class:`VirtualGPU` (real CPU tensors) and
    :func:`vramlab.lab.estimate` (fake tensors). ``budget=None`` means no capacity."""

    def __init__(self, budget: Optional[int], *, round_blocks: bool = False, fake: bool = False,
                 on_oom: Optional[Callable[[int, int], BaseException]] = None) -> None:
        super().__init__()
        self.budget = budget
        self.round_blocks = round_blocks
        self.fake = fake
        self.on_oom = on_oom
        self.allocated = 0
        self.peak = 0
        self.num_ooms = 0
        self.cats: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak_cats: dict[str, int] = dict(self.cats)
        self.table: dict[int, _Rec] = {}
        self.lock = threading.RLock()
        self.in_optimizer = 0
        self.thread: Optional[int] = None
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
        """Whether this tensor is one this ledger accounts (real vs fake, device)."""
        is_fake = self._fake_cls is not None and isinstance(t, self._fake_cls)
        if self.fake:
            return is_fake
        return not is_fake and t.device.type == "cpu"

    def _bump_peak(self) -> None:
        if self.allocated > self.peak:
            self.peak = self.allocated
            self.peak_cats = dict(self.cats)

    def _oom(self, requested: int, pending: int) -> BaseException:
        self.num_ooms += 1
        if self.on_oom is not None:
            return self.on_oom(requested, pending)
        return torch.OutOfMemoryError(f"out of memory: tried to allocate {requested} bytes")

    def _check(self, extra: int, pending: int = 0) -> None:
        if self.budget is not None and extra > 0 and self.allocated + pending + extra > self.budget:
            raise self._oom(extra, pending)

    def _free(self, key: int) -> None:
        rec = self.table.pop(key, None)
        if rec is not None:
            with self.lock:
                self.allocated -= rec.counted
                self.cats[rec.cat] -= rec.counted

    def _add(self, st: torch.UntypedStorage, raw: int, counted: int, cat: str) -> None:
        key = id(st)
        rec = _Rec(raw, counted, cat)
        rec.ref = weakref.ref(st, lambda _r, k=key, s=self: s._free(k))
        with self.lock:
            self.table[key] = rec
            self.allocated += counted
            self.cats[cat] += counted

    def _regrow(self, st: torch.UntypedStorage, rec: _Rec, check: bool = True) -> None:
        raw = st.nbytes()
        if raw == rec.raw:
            return
        counted = self.size_of(raw)
        delta = counted - rec.counted
        if check:
            self._check(delta)
        with self.lock:
            rec.raw = raw
            rec.counted = counted
            self.allocated += delta
            self.cats[rec.cat] += delta
        self._bump_peak()

    def admit(self, storages: list[torch.UntypedStorage], cat: str) -> int:
        """Count new storages all-or-nothing; raise the OOM when they do not fit. Returns bytes."""
        sizes = []
        pending = 0
        seen: set[int] = set()
        for st in storages:
            k = id(st)
            if k in seen or k in self.table:
                continue
            seen.add(k)
            raw = st.nbytes()
            counted = self.size_of(raw)
            self._check(counted, pending)
            pending += counted
            sizes.append((st, raw, counted))
        for st, raw, counted in sizes:
            self._add(st, raw, counted, cat)
        self._bump_peak()
        return pending

    def classify(self, t: Any, cat: str, *, force: bool = False) -> None:
        """Move a tracked tensor's storage to ``cat``. Without ``force``, parameters, buffers,
        gradients and optimizer state keep their category, and activations override only other."""
        if t is None or not isinstance(t, torch.Tensor):
            return
        st = _storage(t)
        if st is not None:
            self.classify_storage(st, cat, force=force)

    def classify_storage(self, st: torch.UntypedStorage, cat: str, *, force: bool = False) -> None:
        """:meth:`classify` for a storage."""
        rec = self.table.get(id(st))
        if rec is None or rec.cat == cat:
            return
        if not force and (rec.cat in _OWNED or cat == "other"):
            return
        self.move(rec, cat)

    def move(self, rec: _Rec, cat: str) -> None:
        """Move one record's bytes to another category."""
        with self.lock:
            if rec.ref is not None and rec.ref() is None:
                return  # already freed
            self.cats[rec.cat] -= rec.counted
            self.cats[cat] += rec.counted
            rec.cat = cat

    def pack(self, t: torch.Tensor) -> Any:
        """The saved-tensors pack hook: a counted non-parameter tensor becomes an activation."""
        st = _storage(t)
        rec = self.table.get(id(st)) if st is not None else None
        if rec is None or rec.cat in _OWNED:
            return t
        if rec.cat != "activations":
            self.move(rec, "activations")
        return _Saved(t, rec, self)

    def tracked(self, t: Any) -> bool:
        """Whether the tensor's storage is in the books."""
        st = _storage(t) if isinstance(t, torch.Tensor) else None
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
        st = _storage(t)
        if st is None:
            return
        rec = self.table.get(id(st))
        if rec is None:
            return
        need = (t.storage_offset() + numel) * t.element_size() if numel > 0 else 0
        if need > rec.raw:
            self._check(self.size_of(need) - rec.counted)

    def storage_resize(self, orig: Callable[..., Any], st: torch.UntypedStorage, size: int) -> Any:
        """``UntypedStorage.resize_`` while active: check, resize, update the books."""
        rec = self.table.get(id(st))
        if rec is not None:
            self._check(self.size_of(int(size)) - rec.counted)
        out = orig(st, size)
        if rec is not None:
            self._regrow(st, rec, check=False)
        return out

    # ------------------------------------------------------------------ dispatch

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func in _RESIZE_OPS:
            self._precheck_resize(args[0], math.prod(int(s) for s in args[1]))
        elif func in _RESIZE_AS_OPS and isinstance(args[1], torch.Tensor):
            self._precheck_resize(args[0], args[1].numel())
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            self._account(func, (out,), True)
        elif isinstance(out, (tuple, list)) and out:
            self._account(func, out, False)
        return out

    def _account(self, func: Any, outs: Any, single: bool) -> None:
        flags = _alias_flags(func)
        fresh = func in _FRESH_OPS
        new: list[torch.UntypedStorage] = []
        for i, o in enumerate(outs):
            alias = flags[0] if single and flags else (flags[i] if i < len(flags) else False)
            if isinstance(o, torch.Tensor):
                self._one(o, alias and not fresh, new)
            elif isinstance(o, (list, tuple)):  # Tensor[] returns (split, foreach ops)
                for t in o:
                    if isinstance(t, torch.Tensor):
                        self._one(t, alias and not fresh, new)
        if new:
            self.admit(new, "optimizer_state" if self.in_optimizer else "other")

    def _one(self, t: torch.Tensor, alias: bool, new: list) -> None:
        if not self.counts(t):
            return
        st = _storage(t)
        if st is None:
            return
        rec = self.table.get(id(st))
        if rec is not None:
            if rec.raw != st.nbytes():
                self._regrow(st, rec)
        elif not alias:
            new.append(st)


# ---------------------------------------------------------------------- hooks


class _Hooks:
    """Module, autograd and optimizer hooks that classify storages for the breakdown."""

    def __init__(self, acct: _Accountant) -> None:
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


# ---------------------------------------------------------------------- VirtualGPU


@dataclass(frozen=True)
class _Spec:
    capacity: int
    name: Optional[str]
    context: int
    preset: Optional[str]


def _resolve_capacity(capacity: Union[int, str], name: Optional[str], context: Optional[int]) -> _Spec:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, str)):
        raise ValueError(f"capacity must be bytes (int), a size such as '16GiB', or a GPU preset name; "
                         f"got {capacity!r}")
    preset = None
    if isinstance(capacity, str):
        try:
            total = parse_size(capacity)
        except ValueError:
            from ..lab.presets import get_preset

            try:
                p = get_preset(capacity)
            except ValueError as e:
                raise ValueError(f"capacity {capacity!r} is neither a size (e.g. '16GiB') nor a GPU preset: {e}") from None
            total, preset = p.memory, p.name
            if context is None:
                context = p.context_overhead
    else:
        if capacity < 0:
            raise ValueError(f"capacity must be positive; got {capacity} bytes")
        total = capacity
    if total <= 0:
        raise ValueError(f"capacity must be positive; got {capacity!r} ({total} bytes)")
    context = 0 if context is None else int(context)
    if context < 0 or context >= total:
        raise ValueError(f"context overhead {context} bytes must be in [0, capacity={total})")
    return _Spec(capacity=total, name=name or preset, context=context, preset=preset)


class VirtualGPU:
    """A GPU of ``capacity`` bytes, simulated on the CPU with exact storage accounting.

    Args:
        capacity: bytes (``16 * 2**30``), a size (``"16GiB"``, ``"512MB"``) or a GPU preset
            name (``"T4"``, ``"A100-80GB"``: see :mod:`vramlab.lab.presets`).
        name: the device's name in ``snapshot()`` (default: the preset's name, else
            ``"virtual GPU"``).
        round_blocks: count each storage rounded up to a multiple of 512 bytes, as the CUDA
            caching allocator does, so that ``allocated`` predicts a real card's
            ``torch.cuda.memory_allocated``. Off by default: figures are exact ``nbytes``.
        context_overhead: bytes the CUDA context takes on the card (not available to
            tensors). Default: the preset's modelled overhead
            (:data:`vramlab.lab.presets.CUDA_CONTEXT_OVERHEAD`) for a preset, 0 for a size.

    Use::

        with VirtualGPU("T4") as gpu:
            model = make_model(); loss = model(x).sum(); loss.backward()
        gpu.peak, gpu.breakdown()

    Semantics (``docs/virtual-gpu.md``): one VirtualGPU is active at a time in a process
    (entering a second raises ``ValueError``; re-entering the same one after it exited
    resumes its books). Only operations of the thread that entered it are counted; frees
    are counted from any thread, and after ``__exit__`` (figures stay correct while
    tensors die). Tensors that existed before are not counted unless ``adopt()``-ed.
    """

    def __init__(self, capacity: Union[int, str], name: Optional[str] = None, *, round_blocks: bool = False,
                 context_overhead: Optional[int] = None) -> None:
        spec = _resolve_capacity(capacity, name, context_overhead)
        self._spec = spec
        self.round_blocks = bool(round_blocks)
        self._acct = _Accountant(spec.capacity - spec.context, round_blocks=self.round_blocks,
                                 on_oom=self._make_oom)
        self._hooks = _Hooks(self._acct)
        self._orig_resize: Any = None
        self._active = False
        self._provider = self._devices

    # ---------------------------------------------------------------- readings

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
        """Bytes still available to tensors: ``budget - allocated``."""
        return self.budget - self._acct.allocated

    @property
    def num_ooms(self) -> int:
        """How many out-of-memory errors this device raised."""
        return self._acct.num_ooms

    @property
    def active(self) -> bool:
        """Whether the context is active now."""
        return self._active

    def reset_peak(self) -> None:
        """Set the peak (and its breakdown) to what is allocated now."""
        self._acct.reset_peak()

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
            acct._check(n, pending)
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
            if isinstance(t, torch.Tensor) and self._acct.counts(t):
                st = _storage(t)
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
        alloc = self._acct.allocated + pending
        used = alloc + self._spec.context
        return torch.OutOfMemoryError(cuda_oom_message(
            requested, self._spec.capacity, self._spec.capacity - used, used, alloc, self._spec.name))

    # ---------------------------------------------------------------- snapshot provider

    def device_snapshot(self) -> Any:
        """This device as a :class:`vramlab.DeviceSnapshot` (``virtual:0``), in bytes."""
        from .._snapshot import DeviceSnapshot, device_layers

        alloc = self._acct.allocated
        used = alloc + self._spec.context
        total = self._spec.capacity
        return DeviceSnapshot(
            id="virtual:0", kind="virtual", name=self.name, uuid=None, source="virtual", nvml_index=None,
            total=total, free=max(total - used, 0), used=used, driver_reserved=None, process_used=used,
            other_processes_used=0, utilization=None, torch_allocated=alloc, torch_reserved=alloc,
            torch_active=alloc, torch_inactive_split=0, torch_peak_allocated=self._acct.peak,
            torch_peak_reserved=self._acct.peak, num_ooms=self._acct.num_ooms, num_alloc_retries=0,
            mem_info_free=max(total - used, 0), mem_info_total=total, unified_memory=False,
            layers=device_layers(total, used, process_used=used, torch_reserved=alloc, torch_allocated=alloc),
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
            orig = torch.UntypedStorage.resize_
            self._orig_resize = orig

            def resize_(st: torch.UntypedStorage, size: int) -> Any:
                if threading.get_ident() != acct.thread:
                    return orig(st, size)
                return acct.storage_resize(orig, st, size)

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
            self._hooks.install()
            acct.__enter__()
            self._active = True
            from .._snapshot import register_device_provider

            register_device_provider(self._provider)
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._teardown()

    def _teardown(self) -> None:
        global _ACTIVE
        from .._snapshot import unregister_device_provider

        unregister_device_provider(self._provider)
        if self._active:
            self._acct.__exit__(None, None, None)
        self._active = False
        self._hooks.remove()
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            self._orig_resize = None
        with _ACTIVE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return (f"<vramlab.VirtualGPU {self.name!r} {format_bytes(self.capacity)}, {state}: "
                f"allocated {format_bytes(self.allocated)}, peak {format_bytes(self.peak)}>")
