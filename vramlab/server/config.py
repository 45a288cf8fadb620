"""The server extension's settings (traitlets, read from Jupyter's config files and command line)."""

from __future__ import annotations

from typing import Any

from traitlets import Float, TraitError, validate
from traitlets.config import Configurable

from ..units import IntervalError, check_interval

__all__ = ["VramlabLab"]


class VramlabLab(Configurable):
    """How often the status bar and the side panel read each kernel's memory.

    In ``jupyter_server_config.py``: ``c.VramlabLab.refresh_interval = 2.0``.
    """

    refresh_interval = Float(
        5.0, config=True,
        help="Seconds between two readings in the browser (status bar, side panel); 5 s, as jupyter-resource-usage, keeps "
             "the server under 1% of a core for one browser (benchmarks/bench_lab.py).")
    min_interval = Float(
        1.0, config=True,
        help="Seconds a reading is served again before the server reads anew: any number of tabs cost one reading "
             "per this interval.")
    history_seconds = Float(600.0, config=True, help="Seconds of each kernel's history kept for the side panel's sparkline.")
    read_timeout = Float(10.0, config=True,
                         help="Seconds a request waits for a reading before it is served the last one, marked stale.")
    warn_fraction = Float(0.9, config=True,
                          help="The fraction of a device's memory (or of the host's limit) above which the status bar turns red.")

    @validate("refresh_interval")
    def _refresh_at_least_half_a_second(self, proposal: Any) -> float:
        try:
            return check_interval(proposal["value"], minimum=0.5)
        except IntervalError as e:
            raise TraitError(f"VramlabLab.refresh_interval: {e}") from None
