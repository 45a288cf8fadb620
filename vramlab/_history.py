"""History: the cell records and the sampler's samples, as tables and files.

``vramlab.history()`` returns a :class:`History`: ``.cells`` (records, oldest first),
``.samples`` and ``.markers`` (from the sampler's ring buffer). ``export(path)`` writes
CSV or JSON, chosen by the suffix. Sizes in bytes, times in seconds since the epoch.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from .cells import CellRecord
from .sampler import Marker, Sample

__all__ = ["History", "history"]


def _cell_row(r: CellRecord) -> dict[str, Any]:
    row: dict[str, Any] = {
        "execution_count": r.execution_count, "started": r.started, "wall_s": r.wall_s, "error": r.error,
        "host_rss_delta": r.host.rss_delta, "host_peak_delta": r.host.peak_delta, "host_swap_delta": r.host.swap_delta,
    }
    for d in r.devices:
        row[f"{d.id}_allocated_delta"] = d.allocated_delta
        row[f"{d.id}_peak_allocated_delta"] = d.peak_allocated_delta
        row[f"{d.id}_reserved_delta"] = d.reserved_delta
        row[f"{d.id}_nvml_delta"] = d.nvml_delta
    return row


def _sample_row(s: Sample) -> dict[str, Any]:
    row: dict[str, Any] = {"time": s.time, "rss": s.rss, "peak": s.peak, "host_used": s.host_used,
                           "available": s.available, "limit": s.limit, "swap_used": s.swap_used,
                           "swap_in": s.swap_in, "swap_out": s.swap_out}
    for id_, alloc, reserved, used, total in s.devices:
        row[f"{id_}_allocated"] = alloc
        row[f"{id_}_reserved"] = reserved
        row[f"{id_}_used"] = used
        row[f"{id_}_total"] = total
    return row


@dataclass(frozen=True)
class History:
    """A frozen copy of the cell records, samples and markers."""

    cells: tuple[CellRecord, ...]
    samples: tuple[Sample, ...]
    markers: tuple[Marker, ...]

    def cell_rows(self) -> list[dict[str, Any]]:
        """One flat dict per cell record."""
        return [_cell_row(r) for r in self.cells]

    def sample_rows(self) -> list[dict[str, Any]]:
        """One flat dict per sample."""
        return [_sample_row(s) for s in self.samples]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: ``{"cells": [...], "samples": [...], "markers": [...]}``."""
        return {"cells": [r.to_dict() for r in self.cells], "samples": self.sample_rows(),
                "markers": [asdict(m) for m in self.markers]}

    def to_pandas(self, which: str = "cells") -> Any:
        """A DataFrame of the cells (``which="cells"``) or samples (``"samples"``); needs pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("History.to_pandas() needs pandas: pip install pandas") from None
        rows = self.cell_rows() if which == "cells" else self.sample_rows()
        return pd.DataFrame(rows)

    def export(self, path: str | os.PathLike[str], which: str = "cells") -> str:
        """Write ``path``: ``.json`` gets everything, ``.csv`` one table (``which``: cells or samples).

        Raises:
            ValueError: an unknown suffix or table.
            OSError: the path cannot be written (the message names it).
        """
        p = os.fspath(path)
        suffix = os.path.splitext(p)[1].lower()
        if suffix not in (".csv", ".json"):
            raise ValueError(f"cannot tell the format of {p!r}: use a .csv or .json suffix")
        if which not in ("cells", "samples"):
            raise ValueError(f"unknown table {which!r}: cells or samples")
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            raise OSError(f"cannot write {p!r}: the folder {parent!r} does not exist")
        if suffix == ".json":
            with open(p, "w") as f:
                json.dump(self.to_dict(), f, indent=1)
            return p
        rows = self.cell_rows() if which == "cells" else self.sample_rows()
        cols: list[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        return p

    def text(self, last: int = 20) -> str:
        """A table of the last ``last`` cells."""
        from ._sizes import format_bytes as fb

        cells = self.cells[-last:]
        if not cells:
            return "no cell records yet: use %%vram on a cell, or %vram auto on"
        ids = []
        for r in cells:
            ids.extend(d.id for d in r.devices if d.allocated_delta is not None and d.id not in ids)
        head = f"{'cell':>5} {'wall s':>8} {'RSS delta':>12} {'RSS peak':>12}"
        for i in ids:
            head += f" {i + ' alloc':>16} {i + ' peak':>16}"
        lines = [head]
        for r in cells:
            line = (f"{r.execution_count if r.execution_count is not None else '-':>5} {r.wall_s:>8.3f} "
                    f"{fb(r.host.rss_delta, signed=True):>12} "
                    f"{('+' + fb(max(r.host.peak_delta, 0))) if r.host.peak_delta is not None else 'n/a':>12}")
            devs = {d.id: d for d in r.devices}
            for i in ids:
                d = devs.get(i)
                a = fb(d.allocated_delta, signed=True) if d and d.allocated_delta is not None else "n/a"
                pk = ("+" + fb(max(d.peak_allocated_delta, 0))) if d and d.peak_allocated_delta is not None else "n/a"
                line += f" {a:>16} {pk:>16}"
            if r.error:
                line += f"  {r.error}"
            lines.append(line)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<vramlab.History {len(self.cells)} cells, {len(self.samples)} samples>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text()}


def history() -> History:
    """A frozen copy of this kernel's cell records and samples."""
    from .cells import get_recorder
    from .sampler import get_sampler

    s = get_sampler()
    return History(cells=tuple(get_recorder().history), samples=tuple(s.samples), markers=tuple(s.markers))
