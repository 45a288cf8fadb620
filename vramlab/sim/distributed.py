"""Data-parallel strategies for :func:`~vramlab.sim.estimate.estimate`: one rank's memory.

``estimate(..., world_size=N, strategy="fsdp")`` gives the peak of ONE rank of an
``N``-rank data-parallel job. It does not re-derive what each strategy shards: it runs
torch's own wrappers on fake tensors, in this one process, on torch's *fake process group*
(``torch.testing._internal.distributed.fake_pg``: a process group of ``N`` ranks whose
collectives move no data), so that every buffer the wrapper allocates on the rank's device
is counted by the estimate's ledger. The strategies:

- ``"ddp"``: :class:`torch.nn.parallel.DistributedDataParallel`. Full parameters, gradients
  and optimizer state on every rank, plus the reducer's flat gradient buckets
  (``bucket_cap_mb=25``, the first bucket 1 MiB; with ``gradient_as_bucket_view=False``,
  torch's default, the gradients are copied into them: two copies of the gradients).
- ``"zero1"``: DDP plus :class:`torch.distributed.optim.ZeroRedundancyOptimizer`, as torch's
  documentation pairs them: each rank keeps the optimizer state of its partition (parameters
  assigned greedily, largest first, to the rank holding the fewest elements so far).
- ``"zero2"``: *modelled by vramlab, not torch's and not DeepSpeed's*: torch has no ZeRO-2.
  The ZeroRedundancyOptimizer partition; no DDP; each gradient, once accumulated, is reduced
  to the rank that owns its parameter (``dist.reduce``) and dropped on every other rank, so a
  rank keeps the gradients of its partition only. No gradient buckets (DeepSpeed's
  ``reduce_bucket_size`` buffers are not modelled).
- ``"fsdp"``: FSDP2, :func:`torch.distributed.fsdp.fully_shard` (ZeRO-3-like). Parameters,
  gradients and optimizer state sharded on dim 0 (padded to a multiple of ``N`` rows), plus
  the all-gathered parameters of the units being computed (FSDP2 prefetches the next unit in
  backward) and the reduce-scatter buffers. The model is built on the meta device, sharded
  (each child of an ``nn.ModuleList``/``nn.Sequential`` that has parameters is a unit, then
  the root), and materialised with ``to_empty``, as FSDP2's documentation does it.

For ZeRO every rank is estimated (their partitions differ, and the rank holding the most
optimizer state is not always the one with the highest peak: gradients arrive at different
times) and the highest peak is reported; DDP's ranks are alike, and FSDP's nearly (every
shard's storage is padded to the same size; the last rank's unpadded shard is smaller, and
measured its peak lower by a few KiB): rank 0, the highest, is estimated. ``batch_size`` is per rank.

:func:`vramlab.sim.estimate.measure_distributed` runs the very same steps for real: ``N`` processes on the CPU,
torch.distributed's gloo backend, each rank under a :class:`~vramlab.VirtualGPU`, and returns
each rank's measured peak. What the VirtualGPU sees: every storage the rank's Python thread
creates (DDP's C++ reducer allocates its buckets on that thread and they are counted);
gloo's own temporaries, made on its worker threads inside a collective, are not counted
(on a GPU, NCCL's buffers lie outside PyTorch's allocator too). gloo's worker thread can also hold a tensor
for a moment after its collective is done, so that its bytes would leave the books at a time
set by thread scheduling (measured once: a ZeRO-1 rank 12% above the estimate on a loaded
machine); the real ranks therefore never hand gloo a tensor whose bytes are freed during the
step: DDP's parameters and buffers are broadcast in place instead of through flat copies, its
first buckets are kept (fake and real ranks alike), FSDP2's all-gathers and reduce-scatters go
through uncounted copies, and ZeRO-2 resizes the gradients it drops to zero. It is the CPU's gloo: NCCL
and CUDA streams (where FSDP2 overlaps communication and may hold more buffers at once) are
not measured here.

All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import signal
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from .._extras import require_torch

require_torch("vramlab's distributed estimate")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402
from torch.nn.parallel.distributed import _BufferCommHookLocation  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (  # noqa: E402
    DefaultAllGather, DefaultReduceScatter)
from torch.utils._python_dispatch import _disable_current_modes, is_traceable_wrapper_subclass  # noqa: E402

from .ledger import Ledger, LedgerHooks, _alias_flags, storage_of  # noqa: E402

__all__ = ["DDP", "ZeRO1", "ZeRO2", "FSDP", "Strategy", "STRATEGIES", "resolve_strategy", "check_world_size",
           "fake_process_group", "StepKit", "prepare", "optimizer_class", "device_mesh", "ShardLedger",
           "counted_storage_resize", "shard_virtual_gpu", "run_ranks"]


@dataclass(frozen=True)
class DDP:
    """DistributedDataParallel. ``bucket_cap_mb``: bucket size in MiB (torch's default 25);
    ``gradient_as_bucket_view``: gradients are views into the buckets (one copy) instead of
    being copied into them (two copies, torch's default)."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    name: str = field(default="ddp", init=False)


@dataclass(frozen=True)
class ZeRO1:
    """DDP (its options as :class:`DDP`'s) plus ZeroRedundancyOptimizer: sharded optimizer state."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    parameters_as_bucket_view: bool = False
    name: str = field(default="zero1", init=False)


@dataclass(frozen=True)
class ZeRO2:
    """vramlab's model of ZeRO-2 (module docs): ZeroRedundancyOptimizer's partition, each
    gradient reduced to its owner and dropped elsewhere. Modelled; torch has no ZeRO-2."""

    name: str = field(default="zero2", init=False)


@dataclass(frozen=True)
class FSDP:
    """FSDP2 ``fully_shard``. ``units``: ``model -> iterable of submodules`` to shard as units
    before the root (default: every child of an ``nn.ModuleList`` or ``nn.Sequential`` that
    has parameters); ``reshard_after_forward``: as ``fully_shard``'s (default ``True``)."""

    units: Optional[Callable[[nn.Module], Iterable[nn.Module]]] = None
    reshard_after_forward: bool = True
    name: str = field(default="fsdp", init=False)


Strategy = Union[DDP, ZeRO1, ZeRO2, FSDP]

#: Strategies by name, for ``strategy="fsdp"``.
STRATEGIES: dict[str, Callable[[], Strategy]] = {"ddp": DDP, "zero1": ZeRO1, "zero2": ZeRO2, "fsdp": FSDP}


def resolve_strategy(spec: Any) -> Strategy:
    """A strategy from its name (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"fsdp"``) or an instance."""
    if isinstance(spec, (DDP, ZeRO1, ZeRO2, FSDP)):
        return spec
    if isinstance(spec, str) and spec.lower() in STRATEGIES:
        return STRATEGIES[spec.lower()]()
    raise ValueError(f"unknown strategy {spec!r}; known: {', '.join(STRATEGIES)} (or DDP(...), ZeRO1(...), "
                     f"ZeRO2(), FSDP(...) from vramlab.sim.distributed)")


def check_world_size(world_size: Any) -> int:
    """``world_size`` as an int >= 1, or one clear ``ValueError``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    return world_size


# --------------------------------------------------------------------------- the fake group


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int) -> Iterator[None]:
    """Make torch's fake process group (``world_size`` ranks, this process is ``rank``) the
    default group for the block, and destroy it after. Refuses when a default group exists."""
    if dist.is_initialized():
        raise RuntimeError("estimate(world_size=...) runs the strategy on torch's fake process group, which must be "
                           "the default group: call it in a process where torch.distributed is not initialised")
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    dist.init_process_group("fake", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the ledger


class ShardLedger(Ledger):
    r"""A :class:`~vramlab.sim.ledger.Ledger` that counts a tensor subclass by what it holds.

    FSDP2's sharded parameters, gradients and optimizer state are ``DTensor``\ s: wrapper
    subclasses whose own "storage" has the *global* shape's size and no data, while the
    rank's memory is the local shard inside. The plain ledger (and so a plain VirtualGPU)
    counts the wrapper: the full tensor's bytes on every rank (measured: twice the shard on
    2 ranks), and a fake-tensor ledger counts nothing. This one counts the inner tensors of
    every traceable wrapper subclass (``__tensor_flatten__``) instead of the wrapper.
    """

    def _account(self, func: Any, outs: Any, single: bool) -> None:
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
        super()._account(func, outs, single)

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
    dispatch mode sees. Only the calling thread's resizes are counted."""
    import threading

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


def shard_virtual_gpu(capacity: int = 2**60) -> Any:
    """A :class:`~vramlab.VirtualGPU` whose books are a :class:`ShardLedger` (same
    capacity, hooks and OOMs; DTensors counted by their local shards). Bytes."""
    from .virtual_gpu import VirtualGPU

    gpu = VirtualGPU(capacity)
    old = gpu.ledger
    gpu._acct = ShardLedger(old.budget, round_blocks=old.round_blocks, fake=False, on_oom=old.on_oom)
    gpu._hooks = LedgerHooks(gpu._acct)
    return gpu


# --------------------------------------------------------------------------- building a rank


def _default_units(model: nn.Module) -> list[nn.Module]:
    """Every child of an ``nn.ModuleList``/``nn.Sequential`` that has parameters, inner ones
    first (``fully_shard`` wants a unit's sub-units sharded before it)."""
    out: list[nn.Module] = []
    seen: set[int] = set()

    def walk(m: nn.Module) -> None:
        for c in m.children():
            walk(c)
            if isinstance(m, (nn.ModuleList, nn.Sequential)) and id(c) not in seen \
                    and any(True for _ in c.parameters()):
                seen.add(id(c))
                out.append(c)

    walk(model)
    return out


def optimizer_class(spec: Any, optimizers: dict[str, type]) -> tuple[type, dict[str, Any]]:
    """The Optimizer class ZeroRedundancyOptimizer needs, from a name (in ``optimizers``) or a
    class; a factory or an instance gets one ``TypeError``."""
    cls = optimizers.get(spec.lower()) if isinstance(spec, str) else spec
    if cls is None:
        raise ValueError(f"unknown optimizer {spec!r}; known: {', '.join(optimizers)}")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise TypeError("ZeRO strategies need the optimizer as a name or an Optimizer class (ZeroRedundancyOptimizer "
                        f"builds one per partition); got {spec!r}")
    return cls, {}


def _local(t: Any) -> Any:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _classify_sharded(acct: Any, model: nn.Module, opt: Any) -> None:
    """Give DTensor locals (FSDP's shards) their breakdown categories; the ledger's own
    hooks see only plain tensors."""
    for p in model.parameters():
        acct.classify(_local(p), "parameters", force=True)
        if p.grad is not None:
            acct.classify(_local(p.grad), "gradients", force=True)
    if opt is not None:
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    acct.classify(_local(v), "optimizer_state", force=True)


def _zero2_hooks(model: nn.Module, opt: Any, rank: int) -> list[Any]:
    owner: dict[int, int] = {}
    for r, groups in enumerate(opt._partition_parameters()):
        for g in groups:
            for p in g["params"]:
                owner[id(p)] = r

    def reduce_to_owner(p: torch.Tensor) -> None:
        dst = owner[id(p)]
        assert p.grad is not None  # a post-accumulate-grad hook runs once the gradient exists
        dist.reduce(p.grad, dst=dst)
        if dst != rank:  # this rank keeps only its partition's gradients
            g, p.grad = p.grad, None
            # free its bytes now: gloo's finished work may still hold a reference for a moment
            # (until its worker thread lets go), which would make the peak depend on timing
            g.untyped_storage().resize_(0)

    return [p.register_post_accumulate_grad_hook(reduce_to_owner) for p in model.parameters() if p.requires_grad]


class _CountedAllGather(DefaultAllGather):
    """FSDP2's default all-gather, whose output buffer (the unsharded parameters) the ledger
    counts as parameters. ``staged`` (real ranks): gloo reads and writes uncounted copies and
    the result is copied into FSDP's output once the collective is done, because gloo's worker
    thread may hold its tensors for a moment after it finishes, and FSDP's own buffers must
    leave the books when FSDP drops them."""

    def __init__(self, acct: Ledger, staged: bool) -> None:
        super().__init__()
        self.acct, self.staged = acct, staged

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        with self.acct.category("parameters"):
            return super().allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> Any:
        if not self.staged:
            return super().__call__(output_tensor, input_tensor, group, async_op)
        with _disable_current_modes():  # no ledger sees the copies or the collective
            out, inp = torch.empty_like(output_tensor), input_tensor.detach().clone()
            work = dist.all_gather_single(out, inp, group=group, async_op=True)
            work.wait()
        with torch.no_grad():
            output_tensor.copy_(out)
        return work if async_op else None  # FSDP frees its result differently after an async all-gather


class _CountedReduceScatter(DefaultReduceScatter):
    """FSDP2's default reduce-scatter, whose input buffer (the unsharded gradients) the ledger
    counts as gradients; ``staged`` as in :class:`_CountedAllGather`."""

    def __init__(self, acct: Ledger, staged: bool) -> None:
        super().__init__()
        self.acct, self.staged = acct, staged

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        with self.acct.category("gradients"):
            return super().allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> Any:
        if not self.staged:
            return super().__call__(output_tensor, input_tensor, group, op, async_op)
        with _disable_current_modes():
            out, inp = torch.empty_like(output_tensor), input_tensor.detach().clone()
            work = dist.reduce_scatter_single(output=out, input=inp, group=group, op=op, async_op=True)
            work.wait()
        with torch.no_grad():
            output_tensor.copy_(out)
        return work if async_op else None


def device_mesh(strategy: Strategy) -> Any:
    """FSDP's 1-D CPU device mesh over the default group (``None`` for the other strategies).
    Made before the ledger is entered: it is bookkeeping, and a fake tensor could not hold
    its rank map."""
    if not isinstance(strategy, FSDP):
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


@dataclass(frozen=True)
class StepKit:
    """What :func:`prepare` needs of the single-device step (``vramlab.sim.estimate`` passes
    its own functions: this module does not import it)."""

    build_on_meta: Callable[[Callable[[], nn.Module], Optional[torch.dtype]], nn.Module]
    materialize: Callable[[nn.Module], None]
    init_parameters: Callable[[nn.Module], None]
    make_optimizer: Callable[[Any, nn.Module, bool], Any]
    optimizers: dict[str, type]


def prepare(strategy: Strategy, build_model: Callable[[], nn.Module], dtype: Optional[torch.dtype], optimizer: Any,
            cuda_like: bool, acct: Any, hooks: Any, kit: StepKit, mesh: Any = None) -> tuple[nn.Module, Any, list[Any]]:
    """Build one rank's model and optimizer under ``strategy``, with the default process
    group (fake or real) already set up and the ledger ``acct`` active (``mesh``: from
    :func:`device_mesh`, for FSDP). Returns the model to step, the optimizer and any hook
    handles to remove after."""
    rank = dist.get_rank()
    model = kit.build_on_meta(build_model, dtype)
    extra: list[Any] = []
    if isinstance(strategy, FSDP):
        from torch.distributed.fsdp import fully_shard

        units = list(strategy.units(model)) if strategy.units is not None else _default_units(model)
        for u in units:
            fully_shard(u, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward)
        model.to_empty(device="cpu")
        # the gathered parameters and the gradients to reduce are counted as what they are; on
        # real ranks gloo gets uncounted copies (module docs), so a finished collective's buffers
        # leave the books when FSDP drops them, not when gloo's thread lets go
        staged = not isinstance(_local(next(iter(model.parameters()))), FakeTensor)
        for m in [*units, model]:
            fsdp: Any = m  # an FSDPModule since fully_shard
            fsdp.set_custom_all_gather(_CountedAllGather(acct, staged))
            fsdp.set_custom_reduce_scatter(_CountedReduceScatter(acct, staged))
        kit.init_parameters(model)
        opt = kit.make_optimizer(optimizer, model, cuda_like)
        _classify_sharded(acct, model, None)
        if opt is not None:
            extra.append(opt.register_step_post_hook(lambda o, a, k: _classify_sharded(acct, model, o)))
        return model, opt, extra
    kit.materialize(model)
    kit.init_parameters(model)
    hooks.classify_module(model, recurse=True)
    opt = None
    if isinstance(strategy, (ZeRO1, ZeRO2)) and optimizer is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, kw = optimizer_class(optimizer, kit.optimizers)
        if cuda_like and "foreach" in inspect.signature(cls).parameters:
            kw["foreach"] = True
        params = [p for p in model.parameters() if p.requires_grad]
        pab = getattr(strategy, "parameters_as_bucket_view", False)
        opt = ZeroRedundancyOptimizer(params, optimizer_class=cls, parameters_as_bucket_view=pab, **kw)
        if isinstance(strategy, ZeRO2):
            extra.extend(_zero2_hooks(model, opt, rank))
    if isinstance(strategy, (DDP, ZeRO1)):
        from torch.nn.parallel import DistributedDataParallel

        # DDP's own start-up sync broadcasts one flat copy of the parameters and its forward one
        # flat copy of the buffers, and its bucket rebuild (second step) frees the old buckets:
        # on real ranks gloo's worker thread may hold such a tensor after the collective is done,
        # so when its bytes leave the books would depend on thread scheduling (measured: a rank
        # 574,404 bytes above the estimate under load). Instead, on real and fake ranks alike:
        # the parameters and buffers are broadcast in place, one tensor at a time (no copy), and
        # the first buckets are kept (the same parameters, so the same bytes).
        fake = isinstance(next(iter(model.parameters()), None), FakeTensor)
        if not fake:
            _broadcast_in_place(list(model.parameters()) + list(model.buffers()))
        with acct.category("gradients"):  # its buckets: one flat copy of the gradients
            model = DistributedDataParallel(model, bucket_cap_mb=strategy.bucket_cap_mb,
                                            gradient_as_bucket_view=strategy.gradient_as_bucket_view,
                                            init_sync=False)
        model._register_buffer_comm_hook(fake, _broadcast_buffers_hook, _BufferCommHookLocation.PRE_FORWARD)
        if fake:  # the fake group's futures carry no tensor: complete each bucket in place, as allreduce does
            model.register_comm_hook(None, _fake_allreduce_hook)
        model.reducer = _KeepBuckets(model.reducer)  # type: ignore[assignment]
    if opt is None:
        opt = kit.make_optimizer(optimizer, model, cuda_like)
    return model, opt, extra


def _broadcast_in_place(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Broadcast each tensor from ``src`` into itself (no flat copy: nothing new for gloo to hold)."""
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.detach(), src=src)


def _broadcast_buffers_hook(fake: bool, named_buffers: dict[str, torch.Tensor]) -> None:
    """DDP's buffer sync before each forward (rank 0's buffers win, as by default), one buffer
    at a time in place; on the fake group nothing moves, so nothing is sent."""
    if not fake:
        _broadcast_in_place(list(named_buffers.values()))


class _KeepBuckets:
    """DDP's reducer, except that it keeps its first buckets. After the first backward a real
    reducer rebuilds them in the order gradients became ready (the same parameters, so the
    same bytes; the old buckets are freed first), syncing the new order across ranks with a
    tensor whose data a fake tensor does not have, and which (like the old buckets) gloo's
    worker thread may still hold for a moment on real ranks."""

    def __init__(self, reducer: Any) -> None:
        object.__setattr__(self, "_reducer", reducer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def _fake_allreduce_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buf)  # in place, like the default hook's allreduce of the bucket
    return fut


# DDP checks the hook's annotations as objects (this module's are strings: ``annotations``)
_fake_allreduce_hook.__annotations__.update(bucket=dist.GradBucket, state=object,
                                            **{"return": torch.futures.Future[torch.Tensor]})


def _spawned_rank(rank: int, world_size: int, rdzv: str, timeout_s: float, rank_fn: Callable[[Any], Any], job: Any,
                  q: Any) -> None:
    """One spawned rank: join the gloo group, run ``rank_fn(job)``, send back its result or its traceback."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # whatever the parent ignored
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import warnings

        warnings.simplefilter("ignore")  # a rank says nothing (DTensor's CPU RNG warning, ...)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            q.put(("ok", rank, rank_fn(job)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # the parent reports it; a child never prints
        q.put(("error", rank, traceback.format_exc(limit=8)))


def run_ranks(rank_fn: Callable[[Any], Any], job: Any, *, world_size: int, timeout: float) -> list[Any]:
    """Run ``rank_fn(job)`` on ``world_size`` spawned CPU processes joined in a gloo process
    group (a ``file://`` rendezvous in a temporary folder); return each rank's result, rank 0
    first. ``rank_fn`` and ``job`` must be picklable (module-level). The ranks get one thread
    each and SIGINT/SIGTERM at their defaults; ``timeout`` (seconds) bounds the whole run.

    Raises:
        RuntimeError: a rank failed (its traceback in the message) or did not finish in time.
    """
    import queue as _queue
    import time

    import torch.multiprocessing as mp

    world_size = check_world_size(world_size)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    old = {k: os.environ.get(k) for k in env}
    procs = []
    results: dict[int, Any] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vramlab-ranks-") as tmp:
        rdzv = os.path.join(tmp, "rendezvous")
        try:
            os.environ.update(env)  # spawn passes the environment at start
            for r in range(world_size):
                p = ctx.Process(target=_spawned_rank, args=(r, world_size, rdzv, timeout, rank_fn, job, q), daemon=True)
                p.start()
                procs.append(p)
            deadline = time.monotonic() + timeout
            while len(results) + len(errors) < world_size and time.monotonic() < deadline:
                try:
                    kind, rank, payload = q.get(timeout=1.0)
                except _queue.Empty:
                    if not any(p.is_alive() for p in procs) and q.empty():
                        break
                    continue
                if kind == "ok":
                    results[rank] = payload
                else:
                    errors.append(f"rank {rank}:\n{payload}")
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    if errors:
        raise RuntimeError("a rank failed: " + errors[0])
    if len(results) < world_size:
        raise RuntimeError(f"{world_size - len(results)} of {world_size} ranks did not finish within {timeout} s")
    return [results[rank] for rank in range(world_size)]
