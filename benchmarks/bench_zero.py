"""Data-parallel strategies: vramlab's per-rank estimate against real gloo ranks and two rules.

    python benchmarks/bench_zero.py [--write-doc]

Two sections. Small scale: on the MLP, the CNN and the tiny GPT of ``vramlab.lessons.models`` (small configs), Adam,
float32, 2 training steps, for 2 and 4 ranks and the strategies ``ddp``, ``zero1``,
``zero2`` (vramlab's model: torch has no ZeRO-2) and ``fsdp`` (FSDP2 ``fully_shard``):

- measured: the highest per-rank peak of the real run, N CPU processes on torch.distributed's
  gloo backend, each rank's storages counted exactly (``measure_distributed_many``);
- vramlab: ``estimate(..., world_size=N, strategy=...)`` (torch's wrappers on fake tensors and
  a fake process group);
- DeepSpeed: the published model-states formulas, re-implemented here (DeepSpeed is not
  installed), without offload, as in DeepSpeed v0.16.4+ (microsoft/DeepSpeed commit
  38327e07f6cd39b63418f60cedd1651b0be3e7c3): ``estimate_zero2_model_states_mem_needs``
  (deepspeed/runtime/zero/stage_1_and_2.py) gives ``2*P + int(18*P/N)`` bytes per GPU (before
  v0.14.3 it gave ``4*P + 16*P/N``) and ``estimate_zero3_model_states_mem_needs``
  (deepspeed/runtime/zero/stage3.py) gives ``4*L + int(18*P/N)``, where P is the parameter
  count (shared ones once) and L the largest module's own parameters (``model_to_params``).
  Both assume fp16 mixed precision (16-bit params and gradients, fp32 master copy and Adam
  moments) and leave activations out; they are shown against zero2 and fsdp respectively;
- accelerate: ``accelerate estimate-memory``'s "Training using Adam" rule, 4x the model's
  size, parameters only, no activations, and no notion of ranks (the same for every N).

Ratios are against the measured figure. Gloo on CPU is not NCCL on GPUs: no CUDA streams
(FSDP2 overlaps communication there and may hold more buffers at once), no caching
allocator; no GPU figure is claimed here.

At scale (estimates only, nothing measured but their wall time): lesson 11's 7B GPT on 8
ranks and the ZeRO paper's Figure-1 model (Psi = 7.5e9: 64 equal ``Linear(15625, 7500)``) on
64 ranks, bf16-mixed, Adam, batch 1 per rank, on ``H100-80GB``: vramlab's per-rank model
states and peak against the paper's formulas (Rajbhandari et al. 2020, Figure 1, K=12: DDP
16Psi, ZeRO-1 4Psi+12Psi/N, ZeRO-2 2Psi+14Psi/N, FSDP 16Psi/N), DeepSpeed's two estimators
above and accelerate's "Training using Adam" rule for bf16 (accelerate v1.14.0,
src/accelerate/commands/estimate.py ``estimate_training_usage``: the max of model (fp32
size), gradients (fp32 + fp16 size), optimizer and step (2x fp32 size), 8 bytes per
parameter; no notion of ranks); for the Figure-1 model also the paper's published figures.
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from vramlab.lessons import models  # noqa: E402
from vramlab.sim.estimate import estimate  # noqa: E402
from vramlab.sim.measure import measure_distributed_many  # noqa: E402
from vramlab.sim.strategies import DDP, ZeRO1  # noqa: E402
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


# --------------------------------------------------------------------------- at scale

GB = 1e9
# Rajbhandari et al. (2020), ZeRO, Figure 1 (K = 12), bytes per rank
PAPER = {"ddp": lambda psi, n: 16 * psi, "zero1": lambda psi, n: 4 * psi + 12 * psi / n,
         "zero2": lambda psi, n: 2 * psi + 14 * psi / n, "fsdp": lambda psi, n: 16 * psi / n}
# the paper's Figure 1 for Psi = 7.5B, N = 64, GB (published; Table 1 gives 1.88 for P_os+g+p)
FIGURE_1 = {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "fsdp": 1.9}
# (label, paper's strategy, vramlab's strategy): views as the paper counts, then torch's default
ROWS = [("ddp views", "ddp", DDP(gradient_as_bucket_view=True)), ("ddp default", "ddp", "ddp"),
        ("zero1 views", "zero1", ZeRO1(gradient_as_bucket_view=True)), ("zero1 default", "zero1", "zero1"),
        ("zero2", "zero2", "zero2"), ("fsdp", "fsdp", "fsdp")]


class Figure1(nn.Module):
    """The paper's Figure-1 model: Psi = 64 x 15625 x 7500 = 7.5e9 parameters, 64 equal tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(15625, 7500, bias=False) for _ in range(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers[0](x).sum()
        for layer in self.layers[1:]:
            out = out + layer(x).sum()
        return out


def figure1_batch(b: int) -> torch.Tensor:
    return torch.randn(b, 15625)


def figure1_batch_grad(b: int) -> torch.Tensor:
    return torch.randn(b, 15625, requires_grad=True)


def accelerate_bf16(fp32_size: int) -> int:
    """accelerate's estimate_training_usage(fp32_size, "bfloat16"), the max of its four sizes."""
    return max(fp32_size, fp32_size + fp32_size // 2, 2 * fp32_size, 2 * fp32_size)


def at_scale() -> None:
    gpt_build, gpt_batch, gpt_loss = models.make_gpt("7B", seq=512)
    cases = [("(a) lesson 11's 7B GPT (seq 512)", gpt_build, gpt_batch, gpt_loss, 8),
             ("(b) the ZeRO paper's Figure-1 model (64 x Linear(15625, 7500))", Figure1, figure1_batch,
              lambda out: out, 64)]
    print("\nat scale: estimates only; bf16-mixed, Adam, batch 1 per rank, device H100-80GB; GB = 1e9 bytes;\n"
          "states = vramlab's per-rank model states when the step ends; vl/pp = states / paper formula")
    for title, build, make_batch, loss_fn, n in cases:
        p, largest, size = counts(build)
        fig1 = n == 64
        print(f"\n{title}, Psi = {p:,}, largest module {largest:,}, {n} ranks\n"
              f"{'strategy':<15}{'states':>8}{'peak':>8}{'est s':>7}{'paper':>8}{'vl/pp':>7}"
              f"{'DeepSpeed':>10}{'accel bf16':>11}" + (f"{'Fig.1 published':>16}" if fig1 else ""))
        rows = ROWS + ([("fsdp x.grad", "fsdp", "fsdp")] if fig1 else [])
        took: list[float] = []
        for label, paper, strategy in rows:
            batch = figure1_batch_grad if label == "fsdp x.grad" else make_batch
            e = estimate(build, batch, batch_size=1, optimizer="adam", loss_fn=loss_fn, world_size=n,
                         strategy=strategy, precision="bf16-mixed", device="H100-80GB")
            pp = PAPER[paper](p, n)
            ds = deepspeed_zero2(p, n) if paper == "zero2" else deepspeed_zero3(p, largest, n) if paper == "fsdp" else None
            print(f"{label:<15}{e.model_states_total / GB:>8.2f}{e.peak / GB:>8.2f}{e.seconds:>7.1f}{pp / GB:>8.2f}"
                  f"{e.model_states_total / pp:>7.3f}{f'{ds / GB:.2f}' if ds else '-':>10}"
                  f"{accelerate_bf16(size) / GB:>11.2f}" + (f"{FIGURE_1[paper]:>16}" if fig1 else ""), flush=True)
            took.append(e.seconds)
        print(f"wall time of the {len(took)} estimates: longest {max(took):.1f} s, together {sum(took):.1f} s")
    print("\nviews: DDP/ZeRO1(gradient_as_bucket_view=True), gradients are views of DDP's buckets (one copy, as the\n"
          "paper counts). default: torch's default (False) copies the gradients into the buckets: +4Psi of fp32\n"
          "gradients for DDP (fp32 model under autocast), +2Psi of bf16 ones for ZeRO-1 (bf16 model, fp32 masters).\n"
          "zero2 is vramlab's model (module docs). DeepSpeed: estimate_zero2_model_states_mem_needs beside zero2,\n"
          "estimate_zero3_model_states_mem_needs beside fsdp, no offload. accel bf16: accelerate estimate-memory's\n"
          "'Training using Adam' for bf16, 8 bytes per parameter, the same for every N.\n"
          "(b): ZeRO's partitions are even (64 equal tensors); FSDP pads each layer's 7500 rows to a multiple of 64\n"
          "(7552), +0.7% on its states. Fig.1 published: the paper's own figures, not computed here (its Table 1\n"
          "gives 1.88 GB for P_os+g+p).\n"
          "(b) fsdp's peak: the batch does not require grad, so FSDP2 runs each layer's post-backward (reshard,\n"
          "reduce-scatter) only in the root's final callback, and every layer's all-gathered weights and unsharded\n"
          "gradients are alive together at the end of backward; 'fsdp x.grad' is the same step with a batch that\n"
          "requires grad.")


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_zero", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
        at_scale()
