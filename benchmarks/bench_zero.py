"""Data-parallel strategies: vramlab's per-rank estimate against real gloo ranks and two rules.

    python benchmarks/bench_zero.py [--write-doc]

On the MLP, the CNN and the tiny GPT of ``vramlab.lessons.models`` (small configs), Adam,
float32, 2 training steps, for 2 and 4 ranks and the strategies ``ddp``, ``zero1``,
``zero2`` (vramlab's model: torch has no ZeRO-2) and ``fsdp`` (FSDP2 ``fully_shard``):

- measured: the highest per-rank peak of the real run, N CPU processes on torch.distributed's
  gloo backend, each rank's storages counted exactly (``measure_distributed_many``);
- vramlab: ``estimate(..., world_size=N, strategy=...)`` (torch's wrappers on fake tensors and
  a fake process group);
- DeepSpeed: the published model-states formulas, re-implemented here (DeepSpeed is not
  installed), without offload: ``estimate_zero2_model_states_mem_needs`` gives
  ``2*P + 18*P/N`` bytes per GPU (deepspeed/runtime/zero/stage_1_and_2.py, commit
  02aa38c3a55174c87b33c4ad17a304389d037443) and ``estimate_zero3_model_states_mem_needs``
  gives ``4*L + 18*P/N`` (stage3.py, commit 007cca6a2ffe3ed9d393459f4a3081bd54341ba6), where
  P is the parameter count (shared ones once) and L the largest module's own parameters.
  Both assume fp16 mixed precision (16-bit params and gradients, fp32 master copy and Adam
  moments) and leave activations out; they are shown against zero2 and fsdp respectively;
- accelerate: ``accelerate estimate-memory``'s "Training using Adam" rule, 4x the model's
  size, parameters only, no activations, and no notion of ranks (the same for every N).

Ratios are against the measured figure. Gloo on CPU is not NCCL on GPUs: no CUDA streams
(FSDP2 overlaps communication there and may hold more buffers at once), no caching
allocator; no GPU figure is claimed here.
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from vramlab.lessons import models  # noqa: E402
from vramlab.sim.estimate import estimate  # noqa: E402
from vramlab.sim.measure import measure_distributed_many  # noqa: E402
from vramlab.units import format_bytes  # noqa: E402

CASES = [
    ("MLP", functools.partial(models.make_mlp, width=256, depth=3), 64),
    ("CNN", functools.partial(models.make_cnn, channels=(16, 32)), 8),
    ("GPT tiny", functools.partial(models.make_gpt, "tiny", seq=64), 2),
]
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")


def counts(build) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """(parameter count P, largest module's own parameter count L, model bytes)."""
    with torch.device("meta"):
        m = build()
    uniq = {id(p): p for p in m.parameters()}.values()
    largest = max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in m.modules())
    return sum(p.numel() for p in uniq), largest, sum(p.numel() * p.element_size() for p in uniq)


def deepspeed_zero2(p: int, n: int) -> int:
    """estimate_zero2_model_states_mem_needs(cpu_offload=False)'s gpu_mem, in bytes."""
    return 2 * p + int(18 * p / n)


def deepspeed_zero3(p: int, largest: int, n: int) -> int:
    """estimate_zero3_model_states_mem_needs(cpu_offload=False)'s gpu_mem, in bytes."""
    return 4 * largest + int(18 * p / n)


def ratio(x: int, real: int) -> str:
    return f"{x / real:.2f}"


def main() -> None:
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}; Adam, float32, 2 training steps; batch per rank; "
          f"ratios = figure / measured")
    head = (f"{'model':<9}{'N':>2} {'strategy':<7}{'measured':>11}{'vramlab':>11}{'DeepSpeed':>11}"
            f"{'accel 4x':>11}{'vl/m':>6}{'DS/m':>6}{'4x/m':>6}")
    for n in (2, 4):
        runs = [dict(factory=f, strategy=s, batch_size=b, optimizer="adam") for _, f, b in CASES for s in STRATEGIES]
        readings = iter(measure_distributed_many(runs, world_size=n, timeout=600))
        print(f"\n{n} ranks (gloo, CPU)\n" + head)
        for name, factory, bs in CASES:
            build, make_batch, loss_fn = factory()
            p, largest, size = counts(build)
            for s in STRATEGIES:
                real = max(r.peak for r in next(readings))
                est = estimate(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn,
                               world_size=n, strategy=s).peak
                ds = deepspeed_zero2(p, n) if s == "zero2" else deepspeed_zero3(p, largest, n) if s == "fsdp" else None
                label = s + ("*" if s == "zero2" else "")
                print(f"{name:<9}{n:>2} {label:<7}{format_bytes(real):>11}{format_bytes(est):>11}"
                      f"{format_bytes(ds) if ds else '-':>11}{format_bytes(4 * size):>11}"
                      f"{ratio(est, real):>6}{ratio(ds, real) if ds else '-':>6}{ratio(4 * size, real):>6}")
    print("\n* zero2 is vramlab's model (each gradient reduced to its owner rank, then dropped elsewhere; "
          "no buckets), measured as that model run for real: not torch's, not DeepSpeed's.")
    print("DeepSpeed's formulas assume fp16 mixed precision and exclude activations; these runs are float32.")


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_zero", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
