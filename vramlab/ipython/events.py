"""The ``pre_run_cell``/``post_run_cell`` callbacks that ``%load_ext vramlab`` registers.

- every cell start becomes a marker on the running sampler's timeline;
- with ``%vram auto on`` every cell gets a record, printed as one line after it;
- after a cell that raised a device out-of-memory error, the explanation is displayed
  and an ``oom`` marker is added.

A callback never raises into the kernel.
"""

from __future__ import annotations

from typing import Any

from IPython.display import display

from ..runtime.sampler import existing_sampler, get_sampler

# The records, the OOM explainer and the readings behind them are imported when a cell
# first needs them, so that %load_ext imports no more than this layer and the data.

__all__ = ["CellEvents"]


class CellEvents:
    """The pre/post_run_cell callbacks: cell markers, auto records, OOM explanations."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.auto = False
        self.keep_peaks = False
        self.uss = False  # %vram auto on --uss: also read the USS of this process and its children
        self.in_cell_magic = False
        self._token: Any = None

    def pre_run_cell(self, info: Any = None) -> None:
        try:
            count = self.shell.execution_count
            sampler = existing_sampler()
            if sampler is not None and sampler.running:
                sampler.mark("cell", f"[{count}]")
            self.in_cell_magic = False
            self._token = None
            raw = getattr(info, "raw_cell", "") or ""
            if self.auto and not raw.lstrip().startswith("%%vram"):
                from ..runtime.records import get_recorder

                self._token = get_recorder().begin(count, keep_peaks=self.keep_peaks, uss=self.uss)
        except Exception:
            self._token = None

    def post_run_cell(self, result: Any = None) -> None:
        error = getattr(result, "error_in_exec", None)
        record = None
        try:
            if self._token is not None:
                from ..runtime.records import get_recorder

                record = get_recorder().end(self._token, error)
                self._token = None
                if record is not None:
                    print(record.line())
            elif self.in_cell_magic:
                from ..api import last

                record = last()
        except Exception:
            record = None
        if error is None:
            return
        from ..runtime.oom import explain_oom, is_oom

        if is_oom(error):
            try:
                get_sampler().mark("oom", f"OOM in [{getattr(result, 'execution_count', '?')}]")
                display(explain_oom(error, self.shell.user_ns, record))
            except Exception:
                pass
