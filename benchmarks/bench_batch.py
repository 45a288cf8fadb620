"""Batch-size finders side by side on steps whose memory is known in closed form.

    python benchmarks/bench_batch.py [--write-doc]

Each step holds ``fixed`` MiB plus ``per`` MiB per sample at once, on a virtual GPU of
``capacity`` MiB with exact accounting (``allocator="exact"``), so the true largest batch is
``(capacity - fixed) // per``. (Under the caching allocator a request of 1 to 10 MiB takes a
20 MiB segment, as in PyTorch: on a 12 MiB card nothing of 4 MiB fits, and every finder rightly
finds 0; the closed form would not be the truth there.) Contenders:

- vramlab ``find_max_batch_size`` (start 1): doubling, then bisection to the exact boundary;
- accelerate's ``find_executable_batch_size`` (the real function when accelerate is
  installed, else a faithful copy: ``int(0.9 * batch)`` after every OOM, never up), from its
  default start of 128 and from 1024;
- Lightning's ``BatchSizeFinder(mode="binsearch")``: a re-implementation of
  ``_run_binary_scaling`` (doubling from ``init_val=2``, bisection, ``max_trials=25``) and of
  the ``margin=0.05`` reduction applied at the end; every trial runs ``steps_per_trial=3``
  steps. (Lightning is not installed here; its loop is copied, not imported.)

Columns: the batch found, its gap to the true maximum, the number of trials (distinct
batch sizes tried) and of step runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from vramlab.runtime.oom import is_oom  # noqa: E402
from vramlab.sim.batch_finder import find_max_batch_size  # noqa: E402
from vramlab.sim.virtual_gpu import VirtualGPU  # noqa: E402

MiB = 2**20


class Counted:
    """A closed-form step, run on a fresh VirtualGPU each call; counts calls and batches."""

    def __init__(self, fixed: int, per: int, capacity: int, own_gpu: bool = True) -> None:
        self.fixed, self.per, self.capacity, self.own_gpu = fixed, per, capacity, own_gpu
        self.calls = 0
        self.batches: list[int] = []

    def __call__(self, b: int) -> None:
        self.calls += 1
        if not self.batches or self.batches[-1] != b:
            self.batches.append(b)
        if not self.own_gpu:  # the finder gives it a fresh VirtualGPU of the capacity
            self.allocate(b)
            return
        with VirtualGPU(self.capacity * MiB, allocator="exact"):
            self.allocate(b)

    def allocate(self, b: int) -> None:
        fixed = torch.empty(self.fixed * MiB, dtype=torch.uint8)
        per = torch.empty(b * self.per * MiB, dtype=torch.uint8)
        del fixed, per


def accelerate_finder(step: Callable[[int], None], start: int) -> int:
    try:
        from accelerate.utils import find_executable_batch_size
    except Exception:
        find_executable_batch_size = None
    if find_executable_batch_size is not None:
        @find_executable_batch_size(starting_batch_size=start)
        def run(batch_size: int) -> int:
            step(batch_size)
            return batch_size

        try:
            return run()
        except RuntimeError as e:  # "No executable batch size found, reached zero."
            if "reached zero" in str(e):
                return 0
            raise
    b = start  # faithful copy of the loop above
    while b > 0:
        try:
            step(b)
            return b
        except Exception as e:
            if not is_oom(e):
                raise
            b = int(b * 0.9)
    return 0


def lightning_binsearch(step: Callable[[int], None], init_val: int = 2, max_trials: int = 25,
                        steps_per_trial: int = 3, margin: float = 0.05) -> int:
    """Lightning's _run_binary_scaling loop and its margin, on a plain step function."""
    def try_run(b: int) -> None:
        for _ in range(steps_per_trial):
            step(b)

    new_size = init_val
    low, high, count = 1, None, 0
    last_successful = new_size
    while True:
        try:
            try_run(new_size)
            last_successful = new_size
            count += 1
            if count >= max_trials:
                new_size = last_successful
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                new_size = (high + low) // 2
            else:
                new_size = new_size * 2
        except RuntimeError as e:
            if not is_oom(e):
                raise
            high = new_size
            new_size = (high + low) // 2
            if high - low <= 1:
                break
    return max(1, int(last_successful * (1 - margin))) if margin > 0 else new_size


def main() -> None:
    cases = [(10, 1, 256), (10, 1, 4096), (100, 3, 1024), (4, 1, 12)]
    accel = "accelerate (real)"
    try:
        import accelerate  # noqa: F401
    except Exception:
        accel = "accelerate (copy)"
    print(f"{'step (MiB)':<26}{'true':>6}  {'finder':<28}{'found':>6}{'gap':>6}{'trials':>8}{'runs':>6}")
    for fixed, per, cap in cases:
        true = (cap - fixed) // per
        label = f"{fixed}+{per}/sample on {cap}"
        rows = []
        s = Counted(fixed, per, cap, own_gpu=False)
        r = find_max_batch_size(s, device=VirtualGPU(cap * MiB, allocator="exact"))
        rows.append(("vramlab find_max_batch_size", r.max_batch_size, s))
        for start in (128, 1024):
            s = Counted(fixed, per, cap)
            rows.append((f"{accel}, start {start}", accelerate_finder(s, start), s))
        s = Counted(fixed, per, cap)
        rows.append(("Lightning binsearch (copy)", lightning_binsearch(s), s))
        for name, found, s in rows:
            print(f"{label:<26}{true:>6}  {name:<28}{found:>6}{found - true:>6}{len(s.batches):>8}{s.calls:>6}")
            label = ""
        print()


if __name__ == "__main__":
    from _doc import recording, write_flag

    with recording("bench_batch", write_flag()):  # --write-doc: the output goes into docs/benchmarks.md
        main()
