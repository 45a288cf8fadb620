"""What data parallelism sends: the bytes of every collective of one training step, per rank,
counted on real ``torch.distributed`` ranks (gloo, on the CPU) for DDP, ZeRO-1 and FSDP2.

:func:`communication_per_step` starts ``world_size`` processes, runs two training steps of the
strategy in each (the first builds the buckets and the optimizer state), and counts the second
step's collectives on every rank:

- ``"ddp"``: :class:`~torch.nn.parallel.DistributedDataParallel`. Its reducer calls the
  all-reduce from C++, out of Python's sight, so each rank registers torch's own all-reduce
  communication hook (``ddp_comm_hooks.default_hooks.allreduce_hook``), which makes the same
  call from Python, one per gradient bucket;
- ``"zero1"``: DDP with :class:`~torch.distributed.optim.ZeroRedundancyOptimizer`, whose step
  broadcasts each rank's updated parameters (``torch.distributed.broadcast``);
- ``"fsdp"``: FSDP2's :func:`~torch.distributed.fsdp.fully_shard` on every unit (each child of
  a ``ModuleList``/``Sequential`` that has parameters, then the root), which all-gathers the
  parameters of each unit for forward and again for backward, and reduce-scatters gradients.

The Python-level collectives (``broadcast``, ``all_reduce``, ``all_gather_single``,
``reduce_scatter_single``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``) are counted by
wrapping ``torch.distributed``'s functions in each rank. **Payload** is the tensor the call
moves: the buffer of an all-reduce or a broadcast, the *gathered* output of an all-gather, the
*unreduced* input of a reduce-scatter. A broadcast is counted by this rank's place in it:
``broadcast_root`` (the rank sends the buffer), ``broadcast_forward`` (a receiver that passes it
on) and ``broadcast_last`` (the last receiver, which sends nothing), as in a ring (chain)
broadcast from the root ``src`` through ``src+1, ...`` to ``src-1``: at 2 ranks the receiver sends
nothing. :func:`ring_bytes_sent` converts payloads into what one rank sends under the ring
algorithm (an all-reduce sends ``2 (N-1)/N`` of its buffer, an all-gather or a reduce-scatter
``(N-1)/N``, a broadcast the buffer from its root and from each forwarding receiver, nothing from
the last): arithmetic on the counted payloads, not a measurement of the wire. NCCL on GPUs picks other algorithms (trees,
NVLS) for some sizes; no GPU run has checked these counts there.

Sizes are in bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["STRATEGIES", "CommCount", "communication_per_step", "communication_per_step_many", "ring_bytes_sent",
           "fsdp_units"]

#: The strategies :func:`communication_per_step` runs.
STRATEGIES = ("ddp", "zero1", "fsdp")

_COUNTED = ("broadcast", "all_reduce", "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
            "reduce_scatter_tensor")


@dataclass(frozen=True)
class CommCount:
    """One rank's collectives in one training step.

    Attributes:
        rank: the rank.
        payload: bytes per collective kind (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``,
            ``"broadcast_root"``, ``"broadcast_forward"``, ``"broadcast_last"``), as defined in the
            module's docs.
        calls: number of calls per kind.
        parameter_bytes: the bytes of the full (unsharded) model's parameters.
    """

    rank: int
    payload: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    parameter_bytes: int = 0

    @property
    def total(self) -> int:
        """All payload bytes of the step."""
        return sum(self.payload.values())


def ring_bytes_sent(payload: dict[str, int], world_size: int) -> int:
    """Bytes one rank sends for these payloads under the ring algorithm (module docs)."""
    n = world_size
    f = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
         "broadcast_root": 1.0, "broadcast_forward": 1.0, "broadcast_last": 0.0}
    return int(sum(f[k] * v for k, v in payload.items()))


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 is applied to, inner first: each child of a ``ModuleList`` or
    ``Sequential`` that holds parameters (the layers of a stack), then the root."""
    units: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            units += [c for c in m.children() if any(True for _ in c.parameters())]
    return units + [model]


def _kind(name: str) -> str:
    return {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
            "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter"}.get(name, name)


class _Counter:
    def __init__(self) -> None:
        self.on = False
        self.payload: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def add(self, kind: str, nbytes: int) -> None:
        if self.on:
            self.payload[kind] += int(nbytes)
            self.calls[kind] += 1


def _local_bytes(t: Any) -> int:
    t = getattr(t, "_local_tensor", t)
    return int(t.numel() * t.element_size())


def _broadcast_role(src: int, group: Any = None) -> str:
    """This rank's place in a chain broadcast from ``src`` (a global rank): root, forwarding
    receiver, or the last receiver (``src - 1``, which passes nothing on)."""
    rank, n = dist.get_rank(), dist.get_world_size(group)
    if rank == src:
        return "broadcast_root"
    return "broadcast_last" if rank == (src - 1) % n else "broadcast_forward"


def _wrap_collectives(counter: _Counter) -> None:
    for name in _COUNTED:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def wrapped(*args: Any, _fn: Callable = fn, _name: str = name, **kw: Any) -> Any:
            kind = _kind(_name)
            if kind == "all_gather":
                t = kw.get("output_tensor", kw.get("output", args[0] if args else None))
            else:
                t = kw.get("tensor", kw.get("input", args[0] if args else None))
                if kind == "reduce_scatter":
                    t = kw.get("input", args[1] if len(args) > 1 else t)
            if kind == "broadcast":
                kind = _broadcast_role(kw.get("src", args[1] if len(args) > 1 else 0), kw.get("group"))
            if isinstance(t, torch.Tensor):
                counter.add(kind, _local_bytes(t))
            return _fn(*args, **kw)

        setattr(dist, name, wrapped)


def _rank_step(rank: int, world_size: int, strategy: str, factory: Callable[[], tuple], batch_size: int) -> CommCount:
    torch.manual_seed(0)
    build, make_batch, loss_fn = factory()
    counter = _Counter()
    _wrap_collectives(counter)
    model = build()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for unit in fsdp_units(model):
            fully_shard(unit)
        opt: Any = torch.optim.Adam(model.parameters())
        step_model: nn.Module = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model)
        # torch's own all-reduce hook calls torch.distributed.all_reduce from Python, where the
        # wrapper counts it; DDP's built-in path calls it from C++, out of sight
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        step_model.register_comm_hook(None, allreduce_hook)
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
        else:
            opt = torch.optim.Adam(model.parameters())
    for step in range(2):
        counter.on = step == 1
        batch = make_batch(batch_size)
        *inputs, target = batch if isinstance(batch, (tuple, list)) else (batch,)
        loss = loss_fn(step_model(*inputs), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    counter.on = False
    return CommCount(rank=rank, payload=dict(counter.payload), calls=dict(counter.calls), parameter_bytes=param_bytes)


def _comm_jobs(jobs: list) -> list[CommCount]:
    """In a rank of :func:`vramlab.sim.ranks.run_ranks`: count each job's step."""
    return [_rank_step(dist.get_rank(), dist.get_world_size(), *job) for job in jobs]


def communication_per_step(factory: Callable[[], tuple], *, strategy: str, world_size: int, batch_size: int,
                           timeout: float = 120.0) -> list[CommCount]:
    """Count one training step's collectives on ``world_size`` real gloo ranks (module docs).

    ``factory()`` returns ``(build_model, make_batch, loss_fn)`` as in
    :mod:`vramlab.lessons.models` and must be picklable (a module-level function or a
    ``functools.partial`` of one): the ranks are started with ``spawn``. ``batch_size`` is per
    rank; ``timeout`` in seconds for the whole run. Returns each rank's count, rank 0 first.

    Raises:
        ValueError: an unknown strategy or a world size below 2.
        RuntimeError: a rank failed or outlived ``timeout`` (its traceback in the message).
    """
    return communication_per_step_many(factory, strategies=(strategy,), world_size=world_size,
                                       batch_size=batch_size, timeout=timeout)[strategy]


def communication_per_step_many(factory: Callable[[], tuple], *, strategies: tuple[str, ...] = STRATEGIES,
                                world_size: int, batch_size: int, timeout: float = 180.0) -> dict[str, list[CommCount]]:
    """:func:`communication_per_step` for several strategies in one start of the ranks
    (starting them costs more than a small model's steps): strategy -> each rank's count."""
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 2:
        raise ValueError(f"world_size must be an int of at least 2; got {world_size!r}")
    from ..sim.ranks import run_ranks

    per_rank = run_ranks(_comm_jobs, [(s, factory, batch_size) for s in strategies], world_size=world_size,
                         timeout=timeout)
    return {s: [per_rank[r][i] for r in range(world_size)] for i, s in enumerate(strategies)}
