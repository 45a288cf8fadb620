"""Measurements: the very steps :func:`~vramlab.sim.estimate.estimate` runs, for real.

- :func:`measure`: on the CPU under a :class:`~vramlab.VirtualGPU` (its capacity enforced);
- :func:`measure_distributed`, :func:`measure_distributed_many`: on ``N`` CPU processes joined
  by torch.distributed's gloo backend, each rank under a VirtualGPU that counts DTensors by
  their shards (:mod:`vramlab.sim.strategies` says what the CPU's gloo does not show);
- :func:`measure_cuda`: on a CUDA device, read from ``torch.cuda.max_memory_allocated``.

All sizes are in bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ..facts import Method
from .._extras import require_torch

require_torch("vramlab's simulator")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from .estimate import Estimate, allocator_conf, make_estimate, resolve_allocator, target  # noqa: E402
from .optimizers import paged_bytes  # noqa: E402
from .precision import LossScaler, MasterWeights, resolve_precision  # noqa: E402
from .ranks import check_world_size, run_ranks  # noqa: E402
from .step import (Step, apply_checkpoint, as_step, build_on_meta, checkpoint_modules, count_params,  # noqa: E402
                   init_parameters, make_optimizer, materialize, run_steps, to_device)
from .strategies import device_mesh, prepare, resolve_strategy  # noqa: E402
from .virtual_gpu import VirtualGPU  # noqa: E402

__all__ = ["measure", "measure_distributed", "measure_distributed_many", "RankReading", "measure_cuda",
           "measure_cuda_peaks", "warm_up_cuda"]


@dataclass(frozen=True)
class RankReading:
    """One rank's measured step, in bytes: ``peak``, its ``breakdown`` and ``after`` the step."""

    rank: int
    peak: int
    breakdown: dict[str, int]
    after: int


def _measure_jobs(jobs: list) -> list[RankReading]:
    """In a rank of :func:`~vramlab.sim.ranks.run_ranks`: measure each job."""
    return [_measure_rank(*job) for job in jobs]


_RUN_KEYS = ("factory", "strategy", "batch_size", "optimizer", "dtype", "steps", "precision", "checkpoint")


def _measure_rank(factory: Callable[[], tuple], strategy: Any, batch_size: int, optimizer: Any,
                  dtype: Optional[torch.dtype], steps: int, precision: Optional[str] = None,
                  checkpoint: Any = None) -> RankReading:
    build, make_batch, loss_fn = factory()
    run_ = Step(build, make_batch, batch_size, optimizer, loss_fn, steps=steps, precision=precision, dtype=dtype,
                checkpoint=checkpoint).resolved()
    plan = run_.prec.plan(strategy.name)
    mesh = device_mesh(strategy)
    model = build_on_meta(build, plan.model_dtype)
    gpu = VirtualGPU(2**60, count_shards=True, allocator="exact")
    with gpu:
        model, opt, extra = prepare(strategy, model, plan, optimizer, False, gpu.ledger, gpu.hooks, mesh, checkpoint)
        scaler = LossScaler("cpu") if plan.scale_loss else None
        run_steps(model, run_, opt, plan, scaler)
        for h in extra:
            h.remove()
    return RankReading(torch.distributed.get_rank(), gpu.peak, gpu.breakdown("peak"), gpu.allocated)


def measure_distributed(factory: Callable[[], tuple], *, world_size: int, strategy: Any, batch_size: int,
                        optimizer: Any = "adam", dtype: Optional[torch.dtype] = None, steps: int = 2,
                        precision: Optional[str] = None, checkpoint: Any = None,
                        timeout: float = 120.0) -> list[RankReading]:
    """Run a training step for real on ``world_size`` CPU processes (gloo), each rank under a
    VirtualGPU; return each rank's reading (bytes), rank 0 first.

    ``factory()`` returns ``(build_model, make_batch, loss_fn)`` as in
    :mod:`vramlab.lessons.models`; it must be picklable (a module-level function or a
    ``functools.partial`` of one): the ranks are started with ``spawn``. The ranks run
    exactly the steps :func:`~vramlab.sim.estimate.estimate` runs for the strategy and the
    precision, on the CPU's gloo backend (:mod:`vramlab.sim.strategies` says what that does not
    show), counted by a ``VirtualGPU(count_shards=True)``. ``timeout`` is in seconds, for the
    whole run; a rank that fails or outlives it raises ``RuntimeError``.
    """
    return measure_distributed_many([dict(factory=factory, strategy=strategy, batch_size=batch_size,
                                          optimizer=optimizer, dtype=dtype, steps=steps, precision=precision,
                                          checkpoint=checkpoint)],
                                    world_size=world_size, timeout=timeout)[0]


def measure_distributed_many(runs: list[dict[str, Any]], *, world_size: int,
                             timeout: float = 300.0) -> list[list[RankReading]]:
    """:func:`measure_distributed` for several runs (dicts of its keyword arguments but
    ``world_size`` and ``timeout``) in one start of the ranks: starting them costs more than
    a small model's step. Returns, per run, each rank's reading (bytes)."""
    world_size = check_world_size(world_size)
    jobs = []
    for r in runs:
        unknown = set(r) - set(_RUN_KEYS)
        if unknown or "factory" not in r or "strategy" not in r or "batch_size" not in r:
            raise ValueError(f"a run needs factory, strategy and batch_size (optimizer, dtype, steps, precision, "
                             f"checkpoint optional); got {sorted(r)}")
        resolve_precision(r.get("precision"), r.get("dtype"))  # a bad one says so here, not in a rank
        jobs.append((r["factory"], resolve_strategy(r["strategy"]), r["batch_size"], r.get("optimizer", "adam"),
                     r.get("dtype"), r.get("steps", 2), r.get("precision"), r.get("checkpoint")))
    per_rank = run_ranks(_measure_jobs, jobs, world_size=world_size, timeout=timeout)
    return [[per_rank[rank][i] for rank in range(world_size)] for i in range(len(jobs))]


def measure(build_model: Union[Callable[[], nn.Module], Step], make_batch: Optional[Callable[[int], Any]] = None, *,
            batch_size: Optional[int] = None, optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
            device: Union[None, str, int, VirtualGPU] = None, loss_fn: Optional[Callable[..., Any]] = None,
            steps: Optional[int] = None, round_blocks: Optional[bool] = None, precision: Optional[str] = None,
            checkpoint: Any = None, allocator: Optional[str] = None, alloc_conf: Optional[str] = None,
            accumulate: int = 1, set_to_none: bool = True, step_in_backward: bool = False) -> Estimate:
    """Run the same step as :func:`~vramlab.sim.estimate.estimate` for real, on the CPU, under a VirtualGPU.

    Same arguments (a :class:`~vramlab.sim.step.Step`, or its fields) and result; the model is
    built on the meta device and materialised
    inside the VirtualGPU, exactly as ``estimate`` does with fake tensors. With a
    ``device``, its capacity is enforced (``torch.OutOfMemoryError`` when the step does not
    fit); without one the VirtualGPU is unbounded. This uses real memory and compute.
    """
    t0 = time.perf_counter()
    spec = as_step(build_model, make_batch, dict(
        batch_size=batch_size, optimizer=optimizer, loss_fn=loss_fn, step=step, steps=steps, precision=precision,
        dtype=dtype, checkpoint=checkpoint, accumulate=accumulate, set_to_none=set_to_none,
        step_in_backward=step_in_backward))
    run_ = spec.resolved()
    tgt = target(device)
    plan = run_.prec.plan(None)
    run_ = run_.checked(plan, None)
    train, optimizer, loop = run_.train, run_.optimizer, run_.loop
    rb = tgt.cuda_like if round_blocks is None else bool(round_blocks)
    model = build_on_meta(spec.build_model, plan.model_dtype)
    ckpt = checkpoint_modules(model, spec.checkpoint)
    apply_checkpoint(ckpt)
    cap = tgt.capacity if tgt.capacity is not None else 2**60
    allocator = resolve_allocator(allocator, alloc_conf, tgt)
    allocator_conf(allocator, alloc_conf)  # one clear message for a bad one, before any work
    gpu = VirtualGPU(cap, name=tgt.name, round_blocks=rb, context_overhead=tgt.context, allocator=allocator,
                     alloc_conf=alloc_conf, compute_capability=tgt.cc)
    with gpu:
        materialize(model)
        init_parameters(model)
        gpu.adopt(model)  # created inside: this gives them their categories
        opt = make_optimizer(optimizer, model, tgt.cuda_like, MasterWeights.of if plan.master_weights else None,
                             loop)
        scaler = LossScaler("cpu") if plan.scale_loss and train else None
        run_steps(model, run_, opt, plan, scaler)
    bounded = gpu.allocator_kind == "caching" and tgt.capacity is not None
    return make_estimate(gpu.ledger, tgt, n_params=count_params(model), batch_size=spec.batch_size, step=spec.step,
                         steps=run_.steps, prec=run_.prec, method=Method.MEASURED, t0=t0, notes=[],
                         checkpointed=len(ckpt), limit=(True, None) if bounded else None, loop=loop,
                         paged=paged_bytes(opt))


def warm_up_cuda(torch_mod: Any = torch, device: str = "cuda:0") -> None:
    """Load cuBLAS and cuDNN on ``device`` (their handles and workspaces, which the caching
    allocator counts) so that a baseline read afterwards holds them already."""
    dev = torch_mod.device(device)
    a = torch_mod.randn(256, 256, device=dev, requires_grad=True)
    (a @ a).sum().backward()
    conv = torch_mod.nn.Conv2d(3, 8, 3).to(dev)
    conv(torch_mod.randn(2, 3, 32, 32, device=dev)).sum().backward()
    torch_mod.cuda.synchronize(dev)
    del a, conv
    torch_mod.cuda.empty_cache()


def measure_cuda_peaks(build_model: Callable[[], nn.Module], make_batch: Callable[[int], Any], *, batch_size: int,
                       optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
                       loss_fn: Optional[Callable[..., Any]] = None, steps: Optional[int] = None,
                       device: str = "cuda:0", precision: Optional[str] = None,
                       checkpoint: Any = None) -> tuple[int, int]:
    """Run the very steps :func:`~vramlab.sim.estimate.estimate` runs, for real on a CUDA device;
    return the peak bytes ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` report above
    what was allocated and reserved before.

    The model is built on the device, the optimizer as ``estimate`` builds it for a CUDA
    preset (``foreach=True``), the forward under CUDA's autocast for a mixed precision, and
    ``make_batch``'s tensors are moved to the device. Call :func:`warm_up_cuda` once first, so
    that cuBLAS and cuDNN workspaces are not counted.
    """
    run_ = Step(build_model, make_batch, batch_size, optimizer, loss_fn, step=step, steps=steps, precision=precision,
                dtype=dtype, checkpoint=checkpoint).resolved()
    train, plan = run_.train, run_.prec.plan(None)
    dev = torch.device(device)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    base_reserved = torch.cuda.memory_reserved(dev)
    with torch.device(dev):
        model = build_model()
    if plan.model_dtype is not None:
        model = model.to(plan.model_dtype)
    apply_checkpoint(checkpoint_modules(model, checkpoint))
    opt = make_optimizer(optimizer, model, True, MasterWeights.of if plan.master_weights else None)
    scaler = LossScaler(dev) if plan.scale_loss and train else None
    run_steps(model, run_, opt, plan, scaler, device_type="cuda", make_batch=lambda b: to_device(make_batch(b), dev))
    torch.cuda.synchronize(dev)
    peak = int(torch.cuda.max_memory_allocated(dev)) - int(base)
    peak_reserved = int(torch.cuda.max_memory_reserved(dev)) - int(base_reserved)
    del model, opt
    torch.cuda.empty_cache()
    return peak, peak_reserved


def measure_cuda(build_model: Callable[[], nn.Module], make_batch: Callable[[int], Any], *, batch_size: int,
                 optimizer: Any = None, dtype: Optional[torch.dtype] = None, step: str = "train",
                 loss_fn: Optional[Callable[..., Any]] = None, steps: Optional[int] = None,
                 device: str = "cuda:0", precision: Optional[str] = None, checkpoint: Any = None) -> int:
    """The peak bytes ``torch.cuda.max_memory_allocated`` reports for the steps
    :func:`~vramlab.sim.estimate.estimate` runs (see :func:`measure_cuda_peaks`)."""
    return measure_cuda_peaks(build_model, make_batch, batch_size=batch_size, optimizer=optimizer, dtype=dtype,
                              step=step, loss_fn=loss_fn, steps=steps, device=device, precision=precision,
                              checkpoint=checkpoint)[0]
