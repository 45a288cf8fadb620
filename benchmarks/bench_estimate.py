"""estimate(): time for a 0.8B-parameter transformer, and accuracy against measured peaks.

    python benchmarks/bench_estimate.py [--skip-large] [--write-doc]

1. Time to estimate a training step (AdamW, two steps: the first creates the optimizer
   state) of the 0.8B GPT in ``vramlab.lessons.models`` on an A100-80GB preset, in float32 and
   bfloat16 (target: under a minute on a 2-core machine).
2. On small models (an MLP, a CNN, a small GPT) at several batch sizes, the peak measured
   for real on the CPU (``measure()``: the same steps under a VirtualGPU, and the same
   steps under torch's ``MemTracker``) against two estimates: vramlab's ``estimate()`` and
   the parameters-only rule of ``accelerate estimate-memory`` ("Training using Adam":
   4x the model's size, no activations; computed with accelerate's own functions when it
   is installed). The table gives each estimate's error relative to the measured peak.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from vramlab.units import format_bytes  # noqa: E402
from vramlab.lessons import models  # noqa: E402
from vramlab.sim.estimate import estimate  # noqa: E402
from vramlab.sim.measure import measure  # noqa: E402


def accelerate_rule(build) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """accelerate estimate-memory's 'Training using Adam' figure for a float32 model."""
    with torch.device("meta"):
        model = build()
    try:
        from accelerate.commands.estimate import estimate_training_usage
        from accelerate.utils import calculate_maximum_sizes
    except Exception:
        size = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
        return 4 * size, "4x rule (accelerate not installed)"
    total, _largest = calculate_maximum_sizes(model)
    return int(max(estimate_training_usage(total, "float32").values())), "accelerate's functions"


def memtracker_peak(build, make_batch, loss_fn, bs: int) -> int:  # type: ignore[no-untyped-def]
    from torch.distributed._tools.mem_tracker import MemTracker

    model = build()
    opt = torch.optim.Adam(model.parameters())
    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        for _ in range(2):
            x, *t = make_batch(bs)
            loss_fn(model(x), *t).backward()
            opt.step()
            opt.zero_grad()
            del x, t
            mt.reset_mod_stats()
    return mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def err(est: int, real: int) -> str:
    return f"{100.0 * (est - real) / real:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-large", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_large:
        build, make_batch, loss_fn = models.make_gpt("0.8B", seq=1024)
        print("\n0.8B GPT (d=1536, 26 layers, vocab 32000, seq 1024), AdamW, 2 training steps, on A100-80GB:")
        print(f"{'dtype':<10}{'batch':>6}{'params':>15}{'peak':>12}{'fits':>6}{'seconds':>9}")
        for dtype in (None, torch.bfloat16):
            for bs in (1, 8):
                e = estimate(build, make_batch, batch_size=bs, optimizer="adamw", dtype=dtype, loss_fn=loss_fn,
                             device="A100-80GB")
                print(f"{e.dtype or 'float32':<10}{bs:>6}{e.parameters:>15,}{format_bytes(e.peak):>12}"
                      f"{str(e.fits):>6}{e.seconds:>9.2f}")
        rule, how = accelerate_rule(build)
        print(f"accelerate estimate-memory rule for it, any batch: {format_bytes(rule)} ({how})")

    print("\nsmall models, Adam, 2 training steps, float32; errors relative to the peak measured on the CPU")
    cases = [("MLP", models.make_mlp(), (16, 256, 2048)), ("CNN", models.make_cnn(), (8, 64, 256)),
             ("GPT small", models.make_gpt("small", seq=256), (1, 4, 8))]
    print(f"{'model':<10}{'batch':>6}{'measured':>12}{'MemTracker':>12}{'estimate()':>12}{'accel 4x':>12}"
          f"{'est err':>9}{'4x err':>9}{'est s':>7}")
    for name, (build, make_batch, loss_fn), batches in cases:
        rule, _how = accelerate_rule(build)
        for bs in batches:
            real = measure(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn)
            mt = memtracker_peak(build, make_batch, loss_fn, bs)
            est = estimate(build, make_batch, batch_size=bs, optimizer="adam", loss_fn=loss_fn)
            print(f"{name:<10}{bs:>6}{format_bytes(real.peak):>12}{format_bytes(mt):>12}{format_bytes(est.peak):>12}"
                  f"{format_bytes(rule):>12}{err(est.peak, real.peak):>9}{err(rule, real.peak):>9}{est.seconds:>7.2f}")


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_estimate", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
