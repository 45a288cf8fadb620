"""vramlab in JupyterLab and Notebook 7: each kernel's GPU and host memory, always in view.

Two parts, installed together by ``pip install vramlab``:

- a **Jupyter Server extension** (this package, enabled by the
  ``jupyter_server_config.d/vramlab.json`` file the wheel installs): ``GET
  <base_url>/vramlab/kernels`` answers, for each running kernel of the server, its PID
  tree's host memory and its GPU memory per device from NVML's process lists (see
  :func:`vramlab.server.readings.read_kernels`). Jupyter's own authentication guards it; no new
  port is opened.
- a **JupyterLab 4 / Notebook 7 frontend extension** (TypeScript, prebuilt into the wheel's
  ``share/jupyter/labextensions/vramlab``): a status-bar item for the active notebook's
  kernel and a side panel that lists every kernel.

Settings (``jupyter_server_config.py``, or ``--VramlabLab.refresh_interval=5`` on the command
line): :class:`vramlab.server.config.VramlabLab`.

The server imports neither torch nor IPython for this: the probes read ``/proc`` and NVML.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENDPOINT"]

ENDPOINT = "vramlab"  # the API's namespace under the server's base URL


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The server extension's entry point (read by Jupyter Server)."""
    return [{"module": "vramlab.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Register the handlers on the server's web application (called by Jupyter Server)."""
    from .handlers import setup_handlers

    setup_handlers(server_app)
