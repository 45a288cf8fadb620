"""Accounting overhead of the VirtualGPU on a small CNN training step, beside MemTracker's.

    python benchmarks/bench_virtual.py [--rounds N] [--inner N] [--batch B] [--threads T] [--write-doc]

Five contenders run interleaved in one process, round after round, so machine noise hits
them alike: the bare step (the floor), the step inside a ``VirtualGPU`` with exact accounting
(dispatch mode, weakref finalizers, module/optimizer/saved-tensor hooks), the same with the
model of PyTorch's caching allocator (the default: a block from the segments' pools for every
storage), the same on a T4 preset (which adds CUDA's kernels, a ``TorchFunctionMode``) and the
step inside torch's ``MemTracker`` (what a user would otherwise pick). Each
round enters the context once and times ``--inner`` steps in it; the table gives the median
per step and the ratio to the bare step (goals: <= 1.15x exact, <= 1.3x caching). It also
times a tiny op to show the fixed cost per operator.

torch's intra-op threads are pinned (``--threads``, 1 by default): with as many OpenMP threads
as cores on a shared machine, the threads of one contender can spin while another runs, and a
contender measured faster than the bare step (a ratio below 1) is that noise, not a speed-up.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from vramlab.lessons.models import CNN  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads, pinned for the whole run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = CNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
    gpu = VirtualGPU("16GiB", allocator="exact")
    cached = VirtualGPU("16GiB", allocator="caching")
    t4 = VirtualGPU("T4")  # the caching allocator and a T4's CUDA kernels (a TorchFunctionMode)
    for g in (gpu, cached, t4):
        with g:
            g.adopt([model, opt, x, y])
    mt = MemTracker()
    mt.track_external(model, opt, x, y)
    ops = [0]

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    contenders = {
        "bare step": (contextlib.nullcontext, lambda: None),
        "exact": (lambda: gpu, lambda: None),
        "caching": (lambda: cached, lambda: None),
        "caching+T4": (lambda: t4, lambda: None),
        "MemTracker": (lambda: mt, mt.reset_mod_stats),
    }
    for _ in range(3):  # warm-up, and the optimizer's momentum buffers
        for ctx, after in contenders.values():
            with ctx():
                step()
                after()
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, (ctx, after) in contenders.items():
            with ctx():
                t0 = time.perf_counter()
                for _ in range(args.inner):
                    step()
                    after()
                samples[name].append((time.perf_counter() - t0) / args.inner)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):  # type: ignore[no-untyped-def]
            ops[0] += 1
            return func(*a, **(kw or {}))

    with Count():
        step()
    base = statistics.median(samples["bare step"])
    print(f"small CNN training step (SGD momentum), batch {args.batch} of 3x32x32, {ops[0]} aten ops per step,"
          f" {torch.get_num_threads()} threads; median of {args.rounds} rounds x {args.inner} steps")
    print("exact and caching: a VirtualGPU with allocator='exact' / 'caching'; caching+T4: VirtualGPU('T4'), "
          "which adds the T4's CUDA kernels (sim.kernels)")
    print(f"{'contender':<14}{'ms/step':>10}{'ratio':>8}{'us/op added':>13}")
    for name, v in samples.items():
        m = statistics.median(v)
        print(f"{name:<14}{m * 1e3:>10.2f}{m / base:>7.3f}x{(m - base) / ops[0] * 1e6:>13.1f}")

    a, b = torch.randn(16), torch.randn(16)

    def tiny(n: int = 20000) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            torch.add(a, b)
        return (time.perf_counter() - t0) / n * 1e6

    bare = tiny()
    with gpu:
        virt = tiny()
    with cached:
        cach = tiny()
    print(f"one tiny op (torch.add of 16 floats): bare {bare:.2f} us, in a VirtualGPU {virt:.2f} us exact "
          f"(+{virt - bare:.2f} us per operator), {cach:.2f} us caching (+{cach - bare:.2f} us)")


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_virtual", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
