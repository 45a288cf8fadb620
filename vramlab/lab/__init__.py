"""The lab: run memory lessons on a machine without the GPU they are about.

- :mod:`vramlab.lab.presets`: real GPUs (memory, bandwidth, host link), by name.
- :mod:`vramlab.lab.estimate`: :func:`estimate`, one step under ``FakeTensorMode``: the
  peak and its breakdown without real memory, and whether it fits a preset.
- :mod:`vramlab.lab.batch`: :func:`find_max_batch_size`, the exact largest batch that fits.
- :mod:`vramlab.lab.models`: small reference models (MLP, CNN, GPT) for lessons and checks.
- :mod:`vramlab.lab.device`: ``pick_device()``, CUDA when present, else a virtual GPU.

The virtual GPU itself is :class:`vramlab.probes.virtual.VirtualGPU`.
Importing this package does not import torch; ``estimate`` and ``find_max_batch_size``
import it when first used. All sizes are in bytes.
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
    "estimate",
    "measure",
    "Estimate",
    "find_max_batch_size",
    "BatchSearch",
    "Trial",
    "VirtualGPU",
]

_LAZY = {
    "estimate": ("estimate", "estimate"),
    "measure": ("estimate", "measure"),
    "Estimate": ("estimate", "Estimate"),
    "find_max_batch_size": ("batch", "find_max_batch_size"),
    "BatchSearch": ("batch", "BatchSearch"),
    "Trial": ("batch", "Trial"),
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "VirtualGPU":
        return importlib.import_module("vramlab.probes.virtual").VirtualGPU
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vramlab.lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
