"""The ``pre_run_cell``/``post_run_cell`` callbacks that ``%load_ext vramlab`` registers.

- every cell start becomes a marker on the running sampler's timeline;
- with ``%vram auto on`` every cell gets a record, printed as one line after it;
- after a cell that raised a device out-of-memory error, the explanation is displayed
  and an ``oom`` marker is added.

A callback never raises into the kernel, ``KeyboardInterrupt`` included: an interrupt that
lands in ``post_run_cell`` (the cell's code has finished) is absorbed, and one that lands in
``pre_run_cell`` (before the cell's code starts) is handed on to the cell, which then stops
at its first line as if the interrupt had come a moment later. Either way no traceback runs
through vramlab.

A cell is numbered as IPython numbers it (:func:`cell_number`): IPython 9.8 and later add one
to ``shell.execution_count`` *before* ``pre_run_cell``, earlier versions after the cell.

A record is printed so that a ``clear_output(wait=True)`` the cell left pending takes nothing
away (:mod:`vramlab.ipython.outputs`).
"""

from __future__ import annotations

import ast
import sys
from types import FrameType
from typing import Any, Optional

from IPython.display import display

from ..facts import MarkerKind
from ..runtime.cells import batch_size_in, cell_key
from ..runtime.sampler import existing_sampler, get_sampler
from .outputs import OutputTracker, Replay, replay

# The records, the OOM explainer and the readings behind them are imported when a cell
# first needs them, so that %load_ext imports no more than this layer and the data.

__all__ = ["CellEvents", "cell_number", "code_key", "show_record"]

#: how many frames up from a callback :func:`cell_number` looks for IPython's run_cell
_FRAMES = 12


def cell_number(shell: Any, info: Any = None) -> Optional[int]:
    """The number IPython gives the cell now running (``In [n]``), on every IPython version.

    IPython fills ``ExecutionResult.execution_count`` before it triggers ``pre_run_cell``
    and before the cell's code runs, but passes the callback only the ``ExecutionInfo``;
    the result is found in ``run_cell``'s frame (the one whose ``result.info`` is ``info``),
    or, inside a running cell, as the display hook's ``exec_result``. Outside a cell
    (a magic called from Python) it is ``shell.execution_count``.
    """
    hook = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(hook, "execution_count", None)
    if isinstance(count, int) and (info is None or getattr(hook, "info", None) is info):
        return count
    if info is not None:
        frame: Optional[FrameType] = sys._getframe(1)
        for _ in range(_FRAMES):
            if frame is None:
                break
            if frame.f_code.co_name in ("run_cell_async", "_run_cell", "run_cell"):
                result = frame.f_locals.get("result")
                number = getattr(result, "execution_count", None)
                if getattr(result, "info", None) is info and isinstance(number, int):
                    return number
            frame = frame.f_back
    count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None


def _only_vram_lines(raw: str) -> bool:
    """Whether a cell is nothing but ``%vram`` commands (``%vram history``, a mistyped ``%vram
    bogus``): vramlab's own, not the user's work, so auto mode keeps no record of it."""
    lines = [line.strip() for line in raw.splitlines() if line.strip() and not line.strip().startswith("#")]
    return bool(lines) and all(line.startswith("%vram") and not line.startswith("%%") for line in lines)


def code_key(shell: Any, raw: str, count: Optional[int] = None) -> Optional[str]:
    """The :func:`~vramlab.runtime.cells.cell_key` of a cell's code as IPython runs it (its
    magics and shell escapes turned into calls), or of the raw text when that fails. After the
    cell ran, IPython's history holds the code it transformed (``input_hist_parsed[count]``):
    that is used when it is this cell's, rather than transforming the cell again."""
    code: Any = None
    hm = getattr(shell, "history_manager", None)
    if count is not None and hm is not None:
        try:
            if hm.input_hist_raw[count] == raw:
                code = hm.input_hist_parsed[count]
        except Exception:
            code = None
    if not isinstance(code, str):
        try:
            code = shell.transform_cell(raw)
        except Exception:
            code = raw
    return cell_key(code if isinstance(code, str) else raw)


def show_record(shell: Any, tracker: OutputTracker, record: Any, as_line: bool, result_shown: bool = False) -> None:
    """Show a cell's record after its outputs, without letting a pending clear erase them.

    ``as_line`` prints the record's one line (auto mode); otherwise it is displayed (``%%vram``).
    When the cell left a ``clear_output(wait=True)`` pending and its output was too long to
    keep, the record is not shown (it is in ``%vram history`` and ``vramlab.last()``).
    """
    found: Replay = tracker.stop(result_shown=result_shown)
    if record is None or not found.safe:
        return
    if found.pending:
        replay(shell, found.outputs)
    if as_line:
        print(record.line())
    else:
        display(record)


class _InterruptAtStart(ast.NodeTransformer):
    """Puts ``raise KeyboardInterrupt`` before a cell's code, once, when an interrupt was held back."""

    def __init__(self, events: CellEvents) -> None:
        self.events = events

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if not self.events.interrupt_held:
            return node
        self.events.interrupt_held = False
        first = node.body[0] if node.body else None
        where = dict(lineno=getattr(first, "lineno", 1), col_offset=0,
                     end_lineno=getattr(first, "lineno", 1), end_col_offset=0)
        stmt = ast.Raise(exc=ast.Name(id="KeyboardInterrupt", ctx=ast.Load(), **where), cause=None, **where)
        node.body.insert(0, stmt)
        return node


class CellEvents:
    """The pre/post_run_cell callbacks: cell markers, auto records, OOM explanations."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.auto = False
        self.keep_peaks = False
        self.uss = False  # %vram auto on --uss: also read the USS of this process and of its children
        self.in_cell_magic = False
        self.interrupt_held = False  # an interrupt landed in pre_run_cell: the cell's code gets it
        self.tracker = OutputTracker(shell)
        self.interrupter = _InterruptAtStart(self)
        self._token: Any = None
        self._raw = ""  # the auto-mode cell's code as typed (its cell_key is made when it has run)

    def pre_run_cell(self, info: Any = None) -> None:
        """Mark the cell's start; in auto mode, begin its record."""
        try:
            self.in_cell_magic = False
            self._token = None
            self._raw = ""
            self.interrupt_held = False
            count = cell_number(self.shell, info)
            sampler = existing_sampler()
            if sampler is not None and sampler.running:
                sampler.mark(MarkerKind.CELL, count)
            raw = getattr(info, "raw_cell", "") or ""
            if self.auto and not raw.lstrip().startswith("%%vram") and not _only_vram_lines(raw):
                from ..runtime.records import get_recorder

                self._raw = raw  # its key is made when it has run, from IPython's history (code_key)
                self._token = get_recorder().begin(count, keep_peaks=self.keep_peaks, uss=self.uss)
                self.tracker.start()
        except KeyboardInterrupt:
            # the user interrupted before the cell's code began: the cell gets the interrupt
            self._abandon()
            self.interrupt_held = True
        except Exception:
            self._abandon()

    def post_run_cell(self, result: Any = None) -> None:
        """Finish and print the auto-mode record; explain a device out-of-memory error."""
        try:
            self._post_run_cell(result)
        except BaseException:  # KeyboardInterrupt included: the cell's code has finished
            self._abandon()

    def _post_run_cell(self, result: Any) -> None:
        self.interrupt_held = False
        error = getattr(result, "error_in_exec", None)
        record = None
        try:
            if self._token is not None:
                from ..runtime.records import get_recorder

                count = getattr(result, "execution_count", None)
                record = get_recorder().end(self._token, error, execution_count=count,
                                            cell_key=code_key(self.shell, self._raw, count),
                                            batch_size=batch_size_in(self.shell.user_ns))
                self._token = None
                shown = getattr(result, "result", None) is not None
                show_record(self.shell, self.tracker, record, as_line=True, result_shown=shown)
            elif self.in_cell_magic:
                from ..api import last

                record = last()
        except Exception:
            record = None
        finally:
            self.tracker.stop()
        if error is None:
            return
        from ..runtime.oom import explain_oom, is_oom

        if is_oom(error):
            try:
                from ..runtime.records import get_recorder

                n = getattr(result, "execution_count", None)
                get_sampler().mark(MarkerKind.OOM, n if isinstance(n, int) else None)
                # the earlier records let a run of the same cell at a smaller batch give a batch that fits
                display(explain_oom(error, self.shell.user_ns, record, history=tuple(get_recorder().history)))
            except Exception:
                pass

    def _abandon(self) -> None:
        self._token = None
        self._raw = ""
        try:
            self.tracker.stop()
        except BaseException:  # pragma: no cover - removing the wrappers is a few dict operations
            pass
