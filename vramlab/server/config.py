"""The server extension's settings (traitlets, read from Jupyter's config files and command line)."""

from __future__ import annotations

from traitlets import Float
from traitlets.config import Configurable

__all__ = ["VramlabLab"]


class VramlabLab(Configurable):
    """How often the status bar and the side panel read each kernel's memory.

    In ``jupyter_server_config.py``: ``c.VramlabLab.refresh_interval = 5.0``.
    """

    refresh_interval = Float(2.0, config=True, help="Seconds between two readings in the browser (status bar, side panel).")
    min_interval = Float(
        1.0, config=True,
        help="Seconds a reading is served again before the server reads anew: any number of tabs cost one reading "
             "per this interval.")
    history_seconds = Float(600.0, config=True, help="Seconds of each kernel's history kept for the side panel's sparkline.")
    warn_fraction = Float(0.9, config=True,
                          help="The fraction of a device's memory (or of the host's limit) above which the status bar turns red.")
