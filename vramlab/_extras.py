"""The optional dependencies: torch for the simulator, matplotlib for the plot.

The core of vramlab (the snapshot, the monitor, the magics, the CLI) needs neither. A
feature that does calls :func:`require_torch` or :func:`require_matplotlib` first, which
returns the module or raises :class:`MissingExtra`: an ``ImportError`` whose message is
one line saying what is missing and what to install, and which IPython shows as that one
line, without a traceback.

torch is checked by feature, not by version string: the simulator uses the APIs in
:data:`TORCH_FEATURES`, the newest of which (``torch.OutOfMemoryError``) appeared in
torch 2.5, so 2.5 is the oldest supported torch (:data:`MIN_TORCH`). A torch that lacks
one of them is named with what it lacks.

This module imports neither torch nor matplotlib at import time.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = [
    "MissingExtra", "require_torch", "require_matplotlib", "require_prometheus_client", "TORCH_FEATURES", "MIN_TORCH",
    "torch_gaps",
]

#: The oldest torch whose APIs the simulator and the lessons use (see :data:`TORCH_FEATURES`).
MIN_TORCH = "2.5"

#: ``(module, attribute)`` pairs the simulator needs; the comment says since when torch has them.
TORCH_FEATURES: tuple[tuple[str, str], ...] = (
    ("torch", "OutOfMemoryError"),  # torch 2.5: the device-agnostic OOM error the virtual GPU raises
    ("torch", "UntypedStorage"),  # torch 2.0
    ("torch.utils._python_dispatch", "TorchDispatchMode"),  # torch 2.0
    ("torch.utils.weak", "WeakIdKeyDictionary"),  # torch 2.0
    ("torch._subclasses.fake_tensor", "FakeTensorMode"),  # torch 2.0
)


class MissingExtra(ImportError):
    """A feature needs an optional dependency that is missing (or too old).

    ``str(e)`` is one line: what needs what, and the command that installs it. IPython
    shows only that line (``_render_traceback_``), not a traceback.
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def _render_traceback_(self) -> list[str]:
        """IPython's hook: the lines it prints instead of a traceback."""
        return [f"{type(self).__name__}: {self.message}"]


def torch_gaps(torch: Any) -> list[str]:
    """The names in :data:`TORCH_FEATURES` that this ``torch`` lacks (empty when it has them all)."""
    gaps = []
    for mod, attr in TORCH_FEATURES:
        try:
            m = torch if mod == "torch" else importlib.import_module(mod)
        except ImportError:
            gaps.append(f"{mod}.{attr}")
            continue
        if not hasattr(m, attr):
            gaps.append(f"{mod}.{attr}")
    return gaps


def require_torch(feature: str) -> ModuleType:
    """Import torch for ``feature`` (e.g. ``"VirtualGPU"``) and return it.

    Raises:
        MissingExtra: torch is not installed, or lacks an API the simulator uses.
    """
    try:
        import torch
    except ImportError:
        raise MissingExtra(
            f"{feature} needs PyTorch, which is not installed: pip install 'vramlab[sim]' "
            f"(or any torch >= {MIN_TORCH}; the rest of vramlab works without it)", name="torch") from None
    gaps = torch_gaps(torch)
    if gaps:
        raise MissingExtra(
            f"{feature} needs torch >= {MIN_TORCH}; this torch ({getattr(torch, '__version__', '?')}) lacks "
            f"{', '.join(gaps)}", name="torch")
    return torch


def _require_module(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`MissingExtra` naming ``vramlab[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{feature} needs {module}, which is not installed: pip install 'vramlab[{extra}]' "
            "(the rest of vramlab works without it)", name=module) from None


def require_matplotlib(feature: str) -> ModuleType:
    """Import matplotlib for ``feature`` (e.g. ``"%vram plot"``) and return it.

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    return _require_module("matplotlib", "plot", feature)


def require_prometheus_client(feature: str) -> ModuleType:
    """Import prometheus_client for ``feature`` (e.g. ``"python -m vramlab --prometheus"``) and return it.

    Raises:
        MissingExtra: prometheus_client is not installed.
    """
    return _require_module("prometheus_client", "prometheus", feature)
