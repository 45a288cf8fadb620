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
- precision (:mod:`vramlab.sim.precision`): under ``"bf16-mixed"``/``"16-mixed"`` DDP runs its
  float32 model under autocast, ZeRO-1/2 a 16-bit model with float32 master weights of the
  rank's partition (:class:`~vramlab.sim.precision.MasterWeights` as ZeroRedundancyOptimizer's
  optimizer class), and FSDP2 float32 shards with ``MixedPrecisionPolicy``.
- ``"fsdp"``: FSDP2, :func:`torch.distributed.fsdp.fully_shard` (ZeRO-3-like). Parameters,
  gradients and optimizer state sharded on dim 0 (padded to a multiple of ``N`` rows), plus
  the all-gathered parameters of the units being computed (FSDP2 prefetches the next unit in
  backward) and the reduce-scatter buffers. The model is built on the meta device, sharded
  (each child of an ``nn.ModuleList``/``nn.Sequential`` that has parameters is a unit, then
  the root), and materialised with ``to_empty``, as FSDP2's documentation does it.

For ZeRO the ranks hold different partitions: rank 0, the rank the partition rule gives the
most elements (:func:`zero_partition`, torch's own greedy rule) and, under ZeRO-2, the ranks
that may peak at the end of backward (:func:`zero2_candidates`) are estimated and the highest
peak is reported (``rank="all"`` estimates every rank); DDP's ranks are alike, and FSDP's nearly (every
shard's storage is padded to the same size; the last rank's unpadded shard is smaller, and
measured its peak lower by a few KiB): rank 0, the highest, is estimated. ``batch_size`` is per rank.

:func:`vramlab.sim.measure.measure_distributed` runs the very same steps for real: ``N`` processes on the CPU,
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

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from .._extras import require_torch

require_torch("vramlab's distributed estimate")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (  # noqa: E402
    DefaultAllGather, DefaultReduceScatter)
from torch.nn.parallel.distributed import _BufferCommHookLocation  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

from .ledger import Ledger, LedgerHooks  # noqa: E402
from .optimizers import OptimizerChoice  # noqa: E402
from .precision import MasterWeights, Plan  # noqa: E402
from .step import (apply_checkpoint, checkpoint_modules, default_units, init_parameters,  # noqa: E402
                   make_optimizer, materialize, optimizer_spec)

__all__ = ["DDP", "ZeRO1", "ZeRO2", "FSDP", "Strategy", "STRATEGIES", "resolve_strategy", "prepare",
           "optimizer_class", "device_mesh", "zero_partition", "zero_owners", "zero2_candidates", "ranks_to_estimate"]


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



def zero_owners(numels: list[int], world_size: int) -> list[int]:
    """The rank that owns each parameter (in the order given) under ZeroRedundancyOptimizer's
    own rule (``_partition_parameters``: parameters sorted by size, largest first, stably, each
    given to the rank holding the fewest elements so far, the lowest such rank on a tie)."""
    sizes = [0] * world_size
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):
        r = sizes.index(min(sizes))
        owners[i] = r
        sizes[r] += numels[i]
    return owners


def zero_partition(numels: Iterable[int], world_size: int) -> list[int]:
    """Elements each rank's ZeRO partition holds (:func:`zero_owners`' rule)."""
    numels = list(numels)
    sizes = [0] * world_size
    for n, r in zip(numels, zero_owners(numels, world_size)):
        sizes[r] += n
    return sizes


def ranks_to_estimate(strategy: Strategy, model: nn.Module, world_size: int, rank: Any) -> list[int]:
    """The ranks an estimate runs first: ``rank`` itself; every rank for ``rank="all"``; for
    ZeRO without a rank, rank 0 and the rank whose partition holds the most elements (then
    :func:`zero2_candidates` adds the ranks that may peak at the end of backward); rank 0 for
    DDP and FSDP (their ranks hold alike)."""
    if rank == "all":
        return list(range(world_size))
    if rank is not None:
        return [rank]
    if not isinstance(strategy, (ZeRO1, ZeRO2)):
        return [0]
    sizes = zero_partition([p.numel() for p in model.parameters() if p.requires_grad], world_size)
    busiest = sizes.index(max(sizes))
    return sorted({0, busiest})


def zero2_candidates(numels: list[int], ready: list[tuple[int, int]], world_size: int, grad_bytes: float,
                     state_bytes: float, peak0: int, most: int = 3) -> list[int]:
    """ZeRO-2's ranks that may peak above rank 0, most likely first (at most ``most``).

    A ZeRO-2 rank keeps the gradients it owns as they become ready and the state of its whole
    partition, on top of what every rank holds alike. From rank 0's run, ``ready`` gives each
    gradient's parameter index, in the order it became ready, with the bytes rank 0 held at
    moment (the most since the previous gradient), and ``peak0`` its peak. Rank ``r`` then holds
    about rank 0's bytes plus ``grad_bytes`` per element of its ready gradients and
    ``state_bytes`` per element of its partition, less rank 0's (its gradients counted as before
    the window's last one, rank ``r``'s as after it: an overestimate, on purpose): the ranks whose highest such moment (or whose optimizer step,
    where every owned gradient is present) passes ``peak0`` are returned, highest first. An
    approximation between gradients; the estimate runs each returned rank exactly.
    """
    owners = zero_owners(numels, world_size)
    total = [0] * world_size
    for n, r in zip(numels, owners):
        total[r] += n
    have = [0] * world_size
    step = [peak0 + (state_bytes + grad_bytes) * (total[r] - total[0]) for r in range(world_size)]
    best = list(step)
    for i, held0 in ready:
        before0 = have[0]  # the window's peak may come before this gradient is there on rank 0,
        have[owners[i]] += numels[i]  # and after it is there on rank r: count it both ways
        for r in range(1, world_size):
            guess = held0 + grad_bytes * (have[r] - before0) + state_bytes * (total[r] - total[0])
            if guess > best[r]:
                best[r] = guess
    above = [r for r in range(1, world_size) if best[r] > peak0]
    return sorted(above, key=lambda r: (-best[r], r))[:most]


def optimizer_class(spec: Any) -> tuple[type, dict[str, Any]]:
    """The Optimizer class ZeroRedundancyOptimizer needs and the keyword arguments to pass it,
    from a name, a class or a probed factory (:func:`~vramlab.sim.optimizers.resolve_optimizer`:
    its class and settings); a factory that could not be probed, or an instance, gets one ``TypeError``."""
    cls = optimizer_spec(spec)
    if isinstance(cls, OptimizerChoice) and cls.cls is not None:
        return cls.cls, dict(cls.kwargs)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        why = f" ({cls.why_not})" if isinstance(cls, OptimizerChoice) else ""
        raise TypeError("ZeRO strategies need the optimizer as a name, an Optimizer class or a factory vramlab can "
                        f"probe (ZeroRedundancyOptimizer builds one per partition from a class); got {spec!r}{why}")
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



class _Staged:
    """On real ranks (``staged``), a collective runs on uncounted copies and its result is
    copied into FSDP's own buffer once it is done: gloo's worker thread may hold its tensors
    for a moment after it finishes, and FSDP's buffers must leave the books when FSDP drops
    them. On fake ranks the collective runs as FSDP's default does."""

    def _staged(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, async_op: bool,
                run: Callable[[torch.Tensor, torch.Tensor], Any]) -> Any:
        with _disable_current_modes():  # no ledger sees the copies or the collective
            out, inp = torch.empty_like(output_tensor), input_tensor.detach().clone()
            work = run(out, inp)
            work.wait()
        with torch.no_grad():
            output_tensor.copy_(out)
        return work if async_op else None  # FSDP frees its result differently after an async collective


class _CountedAllGather(_Staged, DefaultAllGather):
    """FSDP2's default all-gather, whose output buffer (the unsharded parameters) the ledger
    counts as parameters; staged on real ranks (:class:`_Staged`)."""

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
        return self._staged(output_tensor, input_tensor, async_op,
                            lambda o, i: dist.all_gather_single(o, i, group=group, async_op=True))


class _CountedReduceScatter(_Staged, DefaultReduceScatter):
    """FSDP2's default reduce-scatter, whose input buffer (the unsharded gradients) the ledger
    counts as gradients; staged on real ranks (:class:`_Staged`)."""

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
        return self._staged(output_tensor, input_tensor, async_op,
                            lambda o, i: dist.reduce_scatter_single(output=o, input=i, group=group, op=op,
                                                                    async_op=True))


def device_mesh(strategy: Strategy) -> Any:
    """FSDP's 1-D CPU device mesh over the default group (``None`` for the other strategies).
    Made before the ledger is entered: it is bookkeeping, and a fake tensor could not hold
    its rank map."""
    if not isinstance(strategy, FSDP):
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))



def prepare(strategy: Strategy, model: nn.Module, plan: Plan, optimizer: Any, cuda_like: bool, acct: Ledger,
            hooks: LedgerHooks, mesh: Any = None, checkpoint: Any = None) -> tuple[nn.Module, Any, list[Any]]:
    """Make one rank's model and optimizer under ``strategy``, with the default process group
    (fake or real) already set up and the ledger ``acct`` active. ``model`` was built on the
    meta device and cast as ``plan`` says (:func:`~vramlab.sim.step.build_on_meta`), before
    the ledger and any fake mode; ``mesh``: from :func:`device_mesh`, for FSDP;
    ``checkpoint``: as :func:`~vramlab.sim.step.checkpoint_modules` takes it. Returns the
    model to step, the optimizer and any hook handles to remove after."""
    rank = dist.get_rank()
    extra: list[Any] = []
    apply_checkpoint(checkpoint_modules(model, checkpoint))
    if isinstance(strategy, FSDP):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy() if plan.fsdp_param_dtype is None else \
            MixedPrecisionPolicy(param_dtype=plan.fsdp_param_dtype, reduce_dtype=torch.float32)
        units = list(strategy.units(model)) if strategy.units is not None else default_units(model)
        for u in units:
            fully_shard(u, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward, mp_policy=mp)
        model.to_empty(device="cpu")
        # the gathered parameters and the gradients to reduce are counted as what they are; on
        # real ranks gloo gets uncounted copies (module docs), so a finished collective's buffers
        # leave the books when FSDP drops them, not when gloo's thread lets go
        staged = not isinstance(_local(next(iter(model.parameters()))), FakeTensor)
        for m in [*units, model]:
            fsdp: Any = m  # an FSDPModule since fully_shard
            fsdp.set_custom_all_gather(_CountedAllGather(acct, staged))
            fsdp.set_custom_reduce_scatter(_CountedReduceScatter(acct, staged))
        init_parameters(model)
        opt = make_optimizer(optimizer, model, cuda_like)
        _classify_sharded(acct, model, None)
        if opt is not None:
            extra.append(opt.register_step_post_hook(lambda o, a, k: _classify_sharded(acct, model, o)))
        return model, opt, extra
    materialize(model)
    init_parameters(model)
    hooks.classify_module(model, recurse=True)
    wrap = MasterWeights.of if plan.master_weights else None
    opt = None
    if isinstance(strategy, (ZeRO1, ZeRO2)) and optimizer is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, kw = optimizer_class(optimizer)
        if cuda_like and "foreach" in inspect.signature(cls).parameters and kw.get("foreach") is None:
            kw["foreach"] = True  # CUDA's default, where the settings leave it unset
        if wrap is not None:
            cls, kw = wrap(cls, **kw), {k: v for k, v in kw.items() if k == "foreach"}
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
        opt = make_optimizer(optimizer, model, cuda_like, wrap)
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
