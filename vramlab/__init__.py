"""vramlab: see GPU memory, host RAM and swap from inside a notebook.

Load it in IPython or Jupyter::

    %load_ext vramlab
    %vram            # the reconciled table: tensors, torch cache, context, other processes, free
    %vram --json     # the same as a dict

or from Python::

    import vramlab
    snap = vramlab.snapshot()
    snap.device("cuda:0").layer("tensors")   # bytes

Importing vramlab and loading the extension never import torch; torch's allocators
are read only when torch is already imported, and CUDA only when it is initialised.
All sizes are in bytes.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "snapshot",
    "Snapshot",
    "HostSnapshot",
    "DeviceSnapshot",
    "watch",
    "stop",
    "last",
    "history",
    "plot",
    "free",
    "explain_oom",
    "CellRecord",
    "pick_device",
    "VirtualGPU",
    "estimate",
    "find_max_batch_size",
    "GPU_PRESETS",
    "lab",
    "format_bytes",
    "parse_size",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
]

from ._sizes import format_bytes, parse_size

_LAZY = {
    "snapshot": ("_snapshot", "snapshot"),
    "Snapshot": ("_snapshot", "Snapshot"),
    "HostSnapshot": ("_snapshot", "HostSnapshot"),
    "DeviceSnapshot": ("_snapshot", "DeviceSnapshot"),
    "watch": ("_api", "watch"),
    "stop": ("_api", "stop"),
    "last": ("_api", "last"),
    "plot": ("_api", "plot"),
    "free": ("_api", "free"),
    "history": ("_history", "history"),
    "explain_oom": ("oom", "explain_oom"),
    "CellRecord": ("cells", "CellRecord"),
    "pick_device": ("lab.device", "pick_device"),
    "VirtualGPU": ("probes.virtual", "VirtualGPU"),
    "estimate": ("lab.estimate", "estimate"),
    "find_max_batch_size": ("lab.batch", "find_max_batch_size"),
    "GPU_PRESETS": ("lab.presets", "GPU_PRESETS"),
}


def __getattr__(name: str) -> Any:
    if name == "lab":
        import importlib

        return importlib.import_module(".lab", __name__)
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vramlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ip: Any) -> None:
    """Called by ``%load_ext vramlab``: registers the ``%vram`` magic."""
    from .magics import load

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    """Called by ``%unload_ext vramlab``: removes everything the extension registered."""
    from .magics import unload

    unload(ip)
