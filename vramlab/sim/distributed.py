"""The data-parallel names in one import, as earlier versions had them here.

The strategies live in :mod:`vramlab.sim.strategies` (what each shards, and how a rank's
memory is estimated and measured), the process groups in :mod:`vramlab.sim.ranks`; this
module re-exports both so that ``from vramlab.sim.distributed import FSDP`` keeps working.
"""

from __future__ import annotations

from .ranks import MAX_SPAWNED_RANKS, MAX_WORLD_SIZE, check_world_size, fake_process_group, run_ranks
from .strategies import (DDP, FSDP, STRATEGIES, Strategy, ZeRO1, ZeRO2, device_mesh, optimizer_class, prepare,
                         ranks_to_estimate, resolve_strategy, zero_partition)

__all__ = ["DDP", "ZeRO1", "ZeRO2", "FSDP", "Strategy", "STRATEGIES", "resolve_strategy", "check_world_size",
           "fake_process_group", "prepare", "optimizer_class", "device_mesh", "run_ranks", "zero_partition",
           "ranks_to_estimate", "MAX_WORLD_SIZE", "MAX_SPAWNED_RANKS"]
