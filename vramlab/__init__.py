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

from ._version import __version__

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
    "Step",
    "find_max_batch_size",
    "GPU_PRESETS",
    "sim",
    "lessons",
    "distributed",
    "format_bytes",
    "parse_size",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
]

from . import display as _display  # noqa: F401 - registers the text/HTML renderers of the model's objects
from .units import format_bytes, parse_size

_LAZY = {
    "snapshot": ("reconcile", "snapshot"),
    "Snapshot": ("model", "Snapshot"),
    "HostSnapshot": ("model", "HostSnapshot"),
    "DeviceSnapshot": ("model", "DeviceSnapshot"),
    "CellRecord": ("model", "CellRecord"),
    "watch": ("api", "watch"),
    "stop": ("api", "stop"),
    "last": ("api", "last"),
    "plot": ("api", "plot"),
    "free": ("api", "free"),
    "history": ("runtime.history", "history"),
    "explain_oom": ("runtime.oom", "explain_oom"),
    "pick_device": ("lessons.device", "pick_device"),
    "VirtualGPU": ("sim.virtual_gpu", "VirtualGPU"),
    "estimate": ("sim.estimate", "estimate"),
    "Step": ("sim.step", "Step"),
    "find_max_batch_size": ("sim.batch_finder", "find_max_batch_size"),
    "GPU_PRESETS": ("sim.presets", "GPU_PRESETS"),
}
_SUBPACKAGES = ("sim", "lessons", "distributed")
#: lazy names that need torch: asking for one without torch is one line saying what to install
_NEEDS_TORCH = {"VirtualGPU", "estimate", "Step", "pick_device", "find_max_batch_size"}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        mod, attr = _LAZY[name]
        if name in _NEEDS_TORCH:
            from ._extras import require_torch

            require_torch(f"vramlab.{name}")
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vramlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt JupyterLab extension lies in this package (read by ``jupyter
    labextension develop``; the wheel installs it under ``share/jupyter/labextensions``)."""
    return [{"src": "labextension", "dest": "vramlab"}]


def load_ipython_extension(ip: Any) -> None:
    """Called by ``%load_ext vramlab``: registers the ``%vram`` magic."""
    from .ipython.extension import load

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    """Called by ``%unload_ext vramlab``: removes everything the extension registered."""
    from .ipython.extension import unload

    unload(ip)
