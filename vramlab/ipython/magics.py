"""The ``%vram`` magic. It only parses arguments and calls the public API.

Usage::

    %load_ext vramlab
    %vram                      # the reconciled snapshot (tensors, cache, context, others, free; host, swap)
    %vram --json               # the same reading as a JSON dict
    %vram watch                # a live monitor (one shared sampler; --interval 0.25 changes the rate)
    %vram stop                 # stop the sampler; monitors freeze on their last reading
    %vram auto on|off          # a one-line record after every cell
    %vram history              # a table of the last cells (--last N)
    %vram export PATH          # .csv (cells, or --samples) or .json (everything)
    %vram plot                 # a matplotlib timeline with cell spans and OOMs (--last N: the last N cells)
    %vram free                 # drop what the last traceback and the autograd graphs keep alive, collect, empty the cache
    %vram last                 # the latest cell record

    %%vram                     # run the cell, then show its record: wall time, deltas, exact peaks
    %%vram --keep-peaks        # the same without resetting the global peak counters

Per-cell records reset peak counters (host ``VmHWM``, torch ``reset_peak_memory_stats``),
which is global; ``--keep-peaks`` leaves them alone and reports a peak only when the cell
set a new high. ``%vram?`` prints this manual. Unknown subcommands and options raise a
``UsageError`` with the usage line.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
from typing import Any, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..i18n import tr
from .events import CellEvents, cell_number, code_key, show_record

# Each subcommand imports what it calls when it runs: %load_ext stays cheap.

__all__ = ["VramMagics", "SUBCOMMANDS"]

#: subcommand -> one-line help.
SUBCOMMANDS: dict[str, str] = {
    "show": "show the reconciled snapshot (the default)",
    "watch": "display a live monitor (starts the shared sampler)",
    "stop": "stop the sampler",
    "auto": "on|off: a one-line record after every cell",
    "history": "a table of the last cells",
    "export": "PATH: write the history as .csv or .json",
    "plot": "a matplotlib timeline of the history",
    "free": "drop the last traceback's references and the autograd graphs kept by tensors, collect, empty the cache",
    "last": "the latest cell record",
}

_NO_ARGS = ("show", "watch", "stop", "history", "plot", "free", "last")

#: option (argparse dest) -> (its flag, the subcommands it applies to); ``%%vram`` takes only the
#: options in :data:`_CELL_OPTIONS`
_OPTION_SCOPE: dict[str, tuple[str, tuple[str, ...]]] = {
    "json": ("--json", ("show",)),
    "uss": ("--uss", ("show", "auto")),
    "interval": ("--interval", ("watch",)),
    "keep_peaks": ("--keep-peaks", ("auto",)),
    "samples": ("--samples", ("export",)),
    "last": ("--last", ("history", "plot")),
}
#: the options ``%%vram`` takes (they apply to its one cell as to every cell of ``%vram auto``)
_CELL_OPTIONS = ("keep_peaks", "uss")


@magics_class
class VramMagics(Magics):
    """The ``%vram`` line magic and ``%%vram`` cell magic."""

    def __init__(self, shell: Any, events: CellEvents) -> None:
        super().__init__(shell)
        self._events = events

    @magic_arguments()
    @argument("command", nargs="?", default=None, metavar="SUBCOMMAND",
              help="one of: " + ", ".join(SUBCOMMANDS) + " (default: show)")
    @argument("rest", nargs="*", metavar="ARG", help="arguments of the subcommand (auto: on|off; export: PATH)")
    @argument("--json", action="store_true", help="show: print the snapshot as a JSON dict")
    @argument("--uss", action="store_true",
              help="show, %%%%vram and auto: also read the USS of this process and of its children (slower)")
    @argument("--interval", type=str, default=None, metavar="SECONDS",
              help="watch: sampling interval in seconds (default 0.5)")
    @argument("--keep-peaks", action="store_true",
              help="%%%%vram and auto: do not reset the global peak counters")
    @argument("--samples", action="store_true", help="export: write the samples table instead of the cells (CSV)")
    @argument("--last", type=int, default=None, metavar="N",
              help="history: how many cells (default 20); plot: only the last N cells (default all)")
    @line_cell_magic
    def vram(self, line: str = "", cell: Optional[str] = None) -> Any:
        """GPU memory (NVML and the torch allocator), host RAM and swap, reconciled; live and per cell."""
        __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of a %%vram cell's traceback
        args = self._parse(line)
        if args is None:  # -h or --help: the manual, as %vram? shows it
            print(self._manual())
            return None
        if cell is not None:
            stray = [flag for dest, (flag, _) in _OPTION_SCOPE.items() if dest not in _CELL_OPTIONS and _given(args, dest)]
            if args.command is not None or args.rest or stray:
                got = " ".join([*stray, *([args.command] if args.command else []), *args.rest])
                raise UsageError(tr("%%vram takes only --keep-peaks and --uss, got {got}", got=repr(got))
                                 + f"\n{self._usage()}")
            try:
                return self._cell(cell, keep_peaks=args.keep_peaks, uss=args.uss)
            except SyntaxError as e:
                if not getattr(e, "_vramlab_cell", False):
                    raise  # raised by the cell's code as it ran: its own frames stay
                # the body does not parse: shown as a plain cell's syntax error, pointing at the
                # cell's line, without vramlab's frames
                raise e.with_traceback(None) from None
        command = args.command or "show"
        if command not in SUBCOMMANDS:
            raise UsageError(tr("unknown subcommand {command}; choose one of: {names}", command=repr(command),
                                names=", ".join(SUBCOMMANDS)) + f"\n{self._usage()}")
        if command in _NO_ARGS and args.rest:
            raise UsageError(tr("%vram {command} takes no arguments, got {got}", command=command,
                                got=repr(" ".join(args.rest))) + f"\n{self._usage()}")
        for dest, (flag, scope) in _OPTION_SCOPE.items():
            if _given(args, dest) and command not in scope:
                magics = [f"%vram {c}" for c in scope] + (["%%vram"] if dest in _CELL_OPTIONS else [])
                where = f" {tr('and')} ".join(magics)
                raise UsageError(tr("{flag} goes with {where}, not %vram {command}", flag=flag, where=where,
                                    command=command) + f"\n{self._usage()}")
        return getattr(self, f"_cmd_{command}")(args)

    # -- subcommands
    def _cmd_show(self, args: Any) -> None:
        from ..reconcile import snapshot

        snap = snapshot(uss=args.uss)
        if args.json:
            print(json.dumps(snap.to_dict(), indent=2))
            return
        display(snap)

    def _cmd_watch(self, args: Any) -> Any:
        from .. import api

        from ..display.text import interval_problem
        from ..units import IntervalError, check_interval

        interval = None
        if args.interval is not None:
            try:  # checked here, before the sampler stops or starts anything
                interval = check_interval(args.interval)
            except IntervalError as e:
                raise UsageError(interval_problem(e, "--interval")) from None
        try:
            mon = api.watch(interval)
        except IntervalError as e:
            raise UsageError(interval_problem(e, "--interval")) from None
        if getattr(self.shell, "kernel", None) is None:
            # a terminal IPython has no widgets: the monitor shows only its name
            print(tr("[vramlab] the live monitor is a widget for Jupyter (JupyterLab, Notebook, VS Code); "
                     "in a terminal run: python -m vramlab --watch 1"))
        display(mon)
        return None

    def _cmd_stop(self, args: Any) -> None:
        from .. import api

        if api.stop():
            print(tr("[vramlab] sampler stopped"))
        else:
            print(tr("[vramlab] the sampler was not running: nothing to stop (%vram watch starts it)"))

    def _cmd_auto(self, args: Any) -> None:
        if len(args.rest) != 1 or args.rest[0] not in ("on", "off"):
            raise UsageError(tr("%vram auto takes on or off") + f"\n{self._usage()}")
        self._events.auto = args.rest[0] == "on"
        self._events.keep_peaks = args.keep_peaks
        self._events.uss = args.uss
        kept = [w for w, on in ((tr("peak counters kept"), args.keep_peaks), (tr("USS read"), args.uss)) if on]
        print((tr("[vramlab] per-cell records on") if self._events.auto else tr("[vramlab] per-cell records off"))
              + (f" ({', '.join(kept)})" if self._events.auto and kept else ""))

    def _cmd_history(self, args: Any) -> None:
        from ..runtime.history import history

        print(history().text(last=max(20 if args.last is None else args.last, 1)))

    def _cmd_export(self, args: Any) -> None:
        from ..runtime.history import history

        if len(args.rest) != 1:
            raise UsageError(tr("%vram export takes one PATH (.csv or .json)") + f"\n{self._usage()}")
        path = os.path.expanduser(args.rest[0])
        try:
            written = history().export(path, which="samples" if args.samples else "cells")
        except (ValueError, OSError) as e:
            raise UsageError(f"%vram export: {e}") from None
        print(tr("[vramlab] wrote {path}", path=written))

    def _cmd_plot(self, args: Any) -> Any:
        from .. import api
        from .._extras import MissingExtra

        try:
            return api.plot(last=args.last)
        except (MissingExtra, ValueError) as e:
            raise UsageError(str(e)) from None

    def _cmd_free(self, args: Any) -> None:
        from ..runtime.oom import free_last_error

        print(free_last_error(self.shell).text())

    def _cmd_last(self, args: Any) -> Any:
        from .. import api

        rec = api.last()
        if rec is None:
            print(tr("no cell records yet: use %%vram on a cell, or %vram auto on"))
            return None
        display(rec)
        return None

    # -- %%vram
    def _cell(self, cell: str, keep_peaks: bool, uss: bool = False) -> Any:
        from ..runtime.cells import batch_size_in
        from ..runtime.records import get_recorder

        __tracebackhide__ = True  # noqa: F841
        rec = get_recorder()
        self._events.in_cell_magic = True
        count = cell_number(self.shell)
        try:
            key = code_key(self.shell, cell)  # the body: the same key as the cell run under %vram auto on
            token = rec.begin(count, keep_peaks=keep_peaks, uss=uss)
        except KeyboardInterrupt:
            # the user's interrupt came before the cell's code: it stops the cell, and the
            # traceback shows none of vramlab's reading
            raise KeyboardInterrupt from None
        tracker = self._events.tracker
        tracker.start()
        error: Optional[BaseException] = None
        try:
            return _run_code(self.shell, cell, count)
        except BaseException as e:
            error = e
            raise
        finally:
            try:
                record = rec.end(token, error, cell_key=key, batch_size=batch_size_in(getattr(self.shell, "user_ns", None)))
                show_record(self.shell, tracker, record, as_line=False)
            except BaseException:  # an interrupt after the cell's code: the code's outcome stands
                tracker.stop()

    # -- helpers
    def _parse(self, line: str) -> Any:
        """Split ``line`` as a shell would (quotes removed, ``\\ `` keeps a space) and parse it;
        options may come anywhere, before or after the subcommand and its arguments."""
        try:
            argv = shlex.split(line, posix=os.name != "nt")
        except ValueError as e:  # an unbalanced quote
            raise UsageError(tr("cannot split the arguments: {error}", error=e) + f"\n{self._usage()}") from None
        if os.name == "nt":  # pragma: no cover - Windows paths keep their backslashes; strip the quotes
            argv = [a[1:-1] if len(a) > 1 and a[0] == a[-1] and a[0] in "\"'" else a for a in argv]
        if any(a in ("-h", "--help") for a in argv):
            return None
        try:
            return self.vram.parser.parse_intermixed_args(argv)
        except UsageError as e:
            raise UsageError(f"{e}\n{self._usage()}") from None
        except SystemExit:  # pragma: no cover - argparse exits only for --help, handled above
            raise UsageError(self._usage()) from None

    def _manual(self) -> str:
        """The module's usage summary, then every option (what ``%vram?`` shows, plus the summary),
        in the current language."""
        return _usage_summary() + "\n\n" + self._parser().format_help().replace("::", "").strip()

    def _usage(self) -> str:
        text = self._parser().format_usage().replace("::", " ")
        return tr("usage:") + " " + " ".join(text.split()).removeprefix("usage: ")

    def _parser(self) -> Any:
        """The magic's parser, its description, headings and option help in the current language."""
        parser = self.vram.parser
        parser.description = tr("GPU memory (NVML and the torch allocator), host RAM and swap, reconciled; live and "
                                "per cell.")
        parser._positionals.title = tr("positional arguments")
        parser._optionals.title = tr("options")
        helps = _option_help()
        for action in parser._actions:
            if action.dest in helps:
                action.help = helps[action.dest].replace("%", "%%")  # argparse %-formats the help
        return parser


def _option_help() -> dict[str, str]:
    """The help of each option (argparse dest), in the current language."""
    return {
        "command": tr("one of: {names} (default: show)", names=", ".join(SUBCOMMANDS)),
        "rest": tr("arguments of the subcommand (auto: on|off; export: PATH)"),
        "json": tr("show: print the snapshot as a JSON dict"),
        "uss": tr("show, %%vram and auto: also read the USS of this process and of its children (slower)"),
        "interval": tr("watch: sampling interval in seconds (default 0.5)"),
        "keep_peaks": tr("%%vram and auto: do not reset the global peak counters"),
        "samples": tr("export: write the samples table instead of the cells (CSV)"),
        "last": tr("history: how many cells (default 20); plot: only the last N cells (default all)"),
    }


def _usage_summary() -> str:
    """The usage summary of the module's docs (``Usage::`` to the paragraph on peaks), in the current language."""
    rows = [
        ("%load_ext vramlab", None),
        ("%vram", tr("the reconciled snapshot (tensors, cache, context, others, free; host, swap)")),
        ("%vram --json", tr("the same reading as a JSON dict")),
        ("%vram watch", tr("a live monitor (one shared sampler; --interval 0.25 changes the rate)")),
        ("%vram stop", tr("stop the sampler; monitors freeze on their last reading")),
        ("%vram auto on|off", tr("a one-line record after every cell")),
        ("%vram history", tr("a table of the last cells (--last N)")),
        ("%vram export PATH", tr(".csv (cells, or --samples) or .json (everything)")),
        ("%vram plot", tr("a matplotlib timeline with cell spans and OOMs (--last N: the last N cells)")),
        ("%vram free", tr("drop what the last traceback and the autograd graphs keep alive, collect, empty the cache")),
        ("%vram last", tr("the latest cell record")),
        ("", None),
        ("%%vram", tr("run the cell, then show its record: wall time, deltas, exact peaks")),
        ("%%vram --keep-peaks", tr("the same without resetting the global peak counters")),
    ]
    lines = [tr("Usage:"), ""]
    lines += [f"    {cmd:<27}# {what}" if what else (f"    {cmd}" if cmd else "") for cmd, what in rows]
    return "\n".join(lines)


def _cache_source(shell: Any, code: str, raw: str, count: Optional[int]) -> str:
    """Register the cell's source as IPython does for an ordinary cell (as cell ``count``);
    return its filename."""
    cache = getattr(shell.compile, "cache", None)
    if cache is None:  # pragma: no cover - a shell without IPython's CachingCompiler
        return "<vram-cell>"
    number = shell.execution_count if count is None else count
    try:
        return str(cache(code, number, raw_code=raw))
    except TypeError:  # pragma: no cover - an IPython without raw_code
        return str(cache(code, number))


def _given(args: Any, dest: str) -> bool:
    """Whether the option ``dest`` was on the line (flags default to False, values to None)."""
    value = getattr(args, dest)
    return value is not None and value is not False


def _run_code(shell: Any, cell: str, count: Optional[int] = None) -> Any:
    """Run a cell's code in the user namespace; return the last expression's value (like %%time).

    ``count`` is the cell's number, under which its source is registered for tracebacks."""
    __tracebackhide__ = True  # noqa: F841
    code = shell.transform_cell(cell)
    # registered in linecache under a name of IPython's own, so tracebacks (and a syntax error)
    # show the cell's lines
    name = _cache_source(shell, code, cell, count)
    try:
        tree = shell.compile.ast_parse(code, filename=name)
    except SyntaxError as e:
        e._vramlab_cell = True  # type: ignore[attr-defined]
        raise
    last: Optional[ast.Expression] = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(shell.compile(tree, name, "exec"), shell.user_ns)
    if last is not None:
        return eval(shell.compile(last, name, "eval"), shell.user_ns)
    return None
