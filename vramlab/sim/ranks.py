"""Ranks: torch's fake process group for an estimate, and real gloo ranks for a measurement.

:func:`fake_process_group` makes torch's *fake process group*
(``torch.testing._internal.distributed.fake_pg``: ``N`` ranks whose collectives move no
data) the default group for a block, so that one process can run one rank of a data-parallel
job on fake tensors. :func:`run_ranks` starts ``N`` CPU processes (``spawn``) joined by
torch.distributed's gloo backend and runs a function on each.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import tempfile
import traceback
from typing import Any, Callable, Iterator

from .._extras import require_torch

require_torch("vramlab's distributed estimate")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

__all__ = ["check_world_size", "fake_process_group", "run_ranks", "MAX_WORLD_SIZE", "MAX_SPAWNED_RANKS"]

#: The most ranks an estimate simulates: 16384, the GPU count of Llama 3 405B's training run
#: (16,384 H100s), among the largest published. One rank runs on a fake process group of ``world_size``
#: ranks: DDP and ZeRO cost about the same at any size (a tiny model: 0.06 s at 100,000 ranks),
#: but FSDP's time and padded shards grow with the ranks (about 1 ms per rank for each sharded
#: unit: 41 s for a two-unit toy at 16384 ranks), and ``rank="all"`` runs every rank in turn.
MAX_WORLD_SIZE = 16384

#: The most ranks :func:`run_ranks` starts: each is a CPU process (spawned) that imports torch,
#: about 0.2 GiB of memory and a second or more of CPU to start, so 64 already ask about 14 GiB.
MAX_SPAWNED_RANKS = 64


def check_world_size(world_size: Any, *, most: int = MAX_WORLD_SIZE) -> int:
    """``world_size`` as an int from 1 to ``most`` (default :data:`MAX_WORLD_SIZE`: 16384
    simulated ranks; :func:`run_ranks` allows :data:`MAX_SPAWNED_RANKS`, 64 processes), or one
    ``ValueError`` naming the value and what is allowed."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer from 1 to {most}; got {world_size!r}")
    if world_size > most:
        if most == MAX_SPAWNED_RANKS:
            why = "each rank is a real CPU process that imports torch, about 0.2 GiB of memory each"
        else:
            why = ("vramlab simulates up to 16384 ranks, as many GPUs as Llama 3 405B trained on; "
                   "FSDP's simulation time and padding grow with the ranks")
        raise ValueError(f"world_size must be an integer from 1 to {most}; got {world_size!r} ({why})")
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
    ``world_size`` is at most :data:`MAX_SPAWNED_RANKS` (64 processes).

    Raises:
        ValueError: ``world_size`` is not an integer from 1 to :data:`MAX_SPAWNED_RANKS`.
        RuntimeError: a rank failed (its traceback in the message) or did not finish in time.
    """
    import queue as _queue
    import time

    import torch.multiprocessing as mp

    world_size = check_world_size(world_size, most=MAX_SPAWNED_RANKS)
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
