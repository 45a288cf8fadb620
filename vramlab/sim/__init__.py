"""The simulator: run memory questions on a machine without the GPU they are about.

- :mod:`vramlab.sim.ledger`: :class:`Ledger`, the storage accounting (a ``TorchDispatchMode``)
  that the two below share.
- :mod:`vramlab.sim.virtual_gpu`: :class:`VirtualGPU`, a GPU of a given capacity on the CPU,
  with exact storage accounting and CUDA-shaped OOMs.
- :mod:`vramlab.sim.presets`: real GPUs (memory, bandwidth, host link), by name.
- :mod:`vramlab.sim.step`: one training or inference step (build on meta, materialise,
  initialise, forward, backward, optimizer step), as every estimate and measurement runs it.
- :mod:`vramlab.sim.precision`: ``precision=`` by Lightning's names, and what mixed precision
  means per strategy (autocast, float32 master weights, FSDP2's ``MixedPrecisionPolicy``).
- :mod:`vramlab.sim.strategies`: the data-parallel strategies ``estimate(world_size=N,
  strategy=...)`` runs (DDP, ZeRO-1, ZeRO-2, FSDP2) with torch's own wrappers.
- :mod:`vramlab.sim.ranks`: torch's fake process group, and real gloo ranks on the CPU.
- :mod:`vramlab.sim.estimate`: :func:`estimate`, one step under ``FakeTensorMode``: the
  peak and its breakdown without real memory, and whether it fits a preset.
- :mod:`vramlab.sim.measure`: :func:`measure` (under a VirtualGPU), :func:`measure_distributed`
  (real gloo ranks) and ``measure_cuda``: the same steps, run for real.
- :mod:`vramlab.sim.distributed`: the strategies' and ranks' names in one import (as before).
- :mod:`vramlab.sim.batch_finder`: :func:`find_max_batch_size`, the exact largest batch that fits.

Everything here but the presets and the batch finder needs torch (``pip install 'vramlab[sim]'``);
importing this package does not import it, and asking for a name that needs it without torch
raises :class:`~vramlab._extras.MissingExtra`, one line saying what to install.
The core of vramlab never imports this package: the virtual GPU joins :func:`vramlab.snapshot`
by registering itself as a device provider while it is active. All sizes are in bytes.
"""

from __future__ import annotations

from typing import Any

from .presets import CUDA_CONTEXT_OVERHEAD, GPU_PRESETS, GPUPreset, get_preset, preset_names

__all__ = [
    "GPU_PRESETS",
    "GPUPreset",
    "CUDA_CONTEXT_OVERHEAD",
    "get_preset",
    "preset_names",
    "Ledger",
    "VirtualGPU",
    "estimate",
    "measure",
    "Estimate",
    "Step",
    "measure_distributed",
    "measure_distributed_many",
    "find_max_batch_size",
    "BatchSearch",
    "Trial",
]

_LAZY = {
    "Ledger": ("ledger", "Ledger"),
    "VirtualGPU": ("virtual_gpu", "VirtualGPU"),
    "estimate": ("estimate", "estimate"),
    "measure": ("measure", "measure"),
    "Estimate": ("estimate", "Estimate"),
    "Step": ("step", "Step"),
    "measure_distributed": ("measure", "measure_distributed"),
    "measure_distributed_many": ("measure", "measure_distributed_many"),
    "find_max_batch_size": ("batch_finder", "find_max_batch_size"),
    "BatchSearch": ("batch_finder", "BatchSearch"),
    "Trial": ("batch_finder", "Trial"),
}


_NEEDS_TORCH = {"Ledger", "VirtualGPU", "estimate", "measure", "Estimate", "Step", "measure_distributed",
                "measure_distributed_many"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        if name in _NEEDS_TORCH:
            from .._extras import require_torch

            require_torch(f"vramlab.sim.{name}")
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vramlab.sim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
