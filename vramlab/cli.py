"""``python -m vramlab``: the reconciled snapshot in a terminal.

    python -m vramlab              # the text table
    python -m vramlab --json       # the dict, as JSON
    python -m vramlab --watch 1    # refresh every second until Ctrl-C (or SIGTERM)
    python -m vramlab --prometheus                # Prometheus' text format, to stdout
    python -m vramlab --prometheus FILE --watch 15  # rewrite FILE (atomically) every 15 s

``--watch`` stops cleanly, with exit status 0, on Ctrl-C (SIGINT) and on SIGTERM: SIGTERM
is what ``timeout``, ``kill``, ``docker stop`` and systemd send, and the only way to stop
a watch started in the background of a non-interactive shell, where SIGINT is ignored.

``--prometheus FILE`` is for node_exporter's textfile collector (:mod:`vramlab.exposition`,
``docs/prometheus.md``): each write goes to a temporary file beside FILE that is renamed
over it, with SIGINT and SIGTERM held back until the rename is done, so the collector never
reads half a file and a stopped watch leaves no temporary file behind. It prints nothing
and opens no port. ``--prometheus-label KEY=VALUE`` (repeatable) adds a label to every
series, e.g. the Slurm job's id. It needs prometheus_client (``pip install
'vramlab[prometheus]'``); without it the CLI prints one line saying so and exits with 2.
A file that cannot be written is one line on stderr and exit status 1.

The text table, the help and the messages speak ``VRAMLAB_LANG`` (:mod:`vramlab.i18n`); the JSON
and the Prometheus output, which programs read, stay English.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
import sys
from typing import Iterator, Optional, Sequence

from ._extras import MissingExtra, require_prometheus_client
from ._version import __version__
from .display.words import note_dict
from .display.text import interval_problem, snapshot_text
from .i18n import tr
from .exposition import check_labels, exposition_text, write_textfile
from .reconcile import snapshot
from .units import IntervalError, check_interval

__all__ = ["main"]


def _interval(text: str) -> float:
    try:
        return check_interval(text)
    except IntervalError as e:
        raise argparse.ArgumentTypeError(interval_problem(e, "--watch")) from None


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog="python -m vramlab",
                                description=tr("GPU memory (NVML and the torch allocator), host RAM and swap, reconciled."))
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help=tr("print the snapshot as JSON"))
    fmt.add_argument("--prometheus", nargs="?", const="-", metavar="FILE",
                     help=tr("write Prometheus' text format (node_exporter's textfile collector) atomically to FILE, "
                             "or to stdout without FILE; needs pip install 'vramlab[prometheus]'"))
    p.add_argument("--watch", type=_interval, metavar="SECONDS", help=tr("refresh every SECONDS until Ctrl-C or SIGTERM"))
    p.add_argument("--prometheus-label", action="append", default=[], metavar="KEY=VALUE",
                   help=tr("with --prometheus: add this label to every series (repeatable)"))
    p.add_argument("--uss", action="store_true", help=tr("also read this process's USS (slower)"))
    p.add_argument("--version", action="store_true", help=tr("print the version and exit"))
    return p


def _parse_labels(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"argument --prometheus-label: expected KEY=VALUE, got {item!r}")
        labels[key] = value
    try:
        return check_labels(labels)
    except ValueError as e:
        parser.error(f"argument --prometheus-label: {e}")
    raise AssertionError("unreachable")  # parser.error exits


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while a file is written and renamed (POSIX; elsewhere a no-op).

    A signal that arrives meanwhile is delivered when the block ends, so the watch stops
    after the rename, never between the temporary file and it.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Output:
    """One refresh of the chosen output: a string to print, or a file written (returns None)."""

    def __init__(self, args: argparse.Namespace, labels: dict[str, str]) -> None:
        self.args = args
        self.labels = labels
        self.path: Optional[str] = args.prometheus if args.prometheus not in (None, "-") else None

    def __call__(self) -> Optional[str]:
        snap = snapshot(uss=self.args.uss)
        if self.path is not None:
            with _signals_held():
                write_textfile(self.path, snap, labels=self.labels)
            return None
        if self.args.prometheus is not None:
            return exposition_text(snap, labels=self.labels).rstrip("\n")
        if self.args.json:
            d = snap.to_dict()
            d["notes"] = [note_dict(n) for n in snap.notes]
            return json.dumps(d)
        return snapshot_text(snap) + "\n" + tr("(this process is the vramlab command itself: a kernel's own memory "
                                              "is read in the kernel, with %vram, or for every kernel in "
                                              "JupyterLab's status bar)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(__version__)
        return 0
    labels: dict[str, str] = {}
    if args.prometheus_label and args.prometheus is None:
        parser.error(tr("argument --prometheus-label: only with --prometheus"))
    if args.prometheus is not None:
        labels = _parse_labels(parser, args.prometheus_label)
        try:
            require_prometheus_client("python -m vramlab --prometheus")
        except MissingExtra as e:
            print(f"{parser.prog}: {e}", file=sys.stderr)
            return 2
    render = _Output(args, labels)
    if render.path is not None and not render.path.endswith(".prom"):
        print(f"{parser.prog}: " + tr("note: node_exporter's textfile collector reads only files named *.prom"), file=sys.stderr)
    try:
        return _run(render, args)
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            return 0
        target = repr(render.path) if render.path is not None else tr("to stdout")
        print(f"{parser.prog}: " + tr("cannot write {target}: {why}", target=target, why=e.strerror or e), file=sys.stderr)
        return 1


def _run(render: _Output, args: argparse.Namespace) -> int:
    if args.watch is None:
        out = render()
        if out is not None:
            print(out)
        return 0
    _TERMINATED.clear()
    previous = signal.signal(signal.SIGTERM, _terminated)
    printed = False
    failing: Optional[str] = None  # why the exporter's file cannot be written now (said once)
    try:
        tty = sys.stdout.isatty() and not args.json
        # the flag is checked as well as the exception raised: CPython drops an exception that a
        # signal handler raises while it compiles a lazily imported module, and the watch must stop
        while not _TERMINATED.is_set():
            try:
                out = render()
            except OSError as e:
                if render.path is None or isinstance(e, BrokenPipeError):
                    raise
                # a full disk, a lost mount: the old file stays whole (the writer is atomic); say so
                # once, and try again at the next refresh
                why = str(e.strerror or e)
                if why != failing:
                    print(tr("cannot write {target}: {why}; the last file written is kept, and vramlab tries "
                             "again every {seconds} s", target=repr(render.path), why=why,
                             seconds=f"{args.watch:g}"), file=sys.stderr, flush=True)
                failing = why
                out = None
            else:
                if failing is not None and render.path is not None:
                    print(tr("{target} is written again", target=repr(render.path)), file=sys.stderr, flush=True)
                    failing = None
            if out is not None:
                if tty:
                    sys.stdout.write("\x1b[H\x1b[2J" + out + "\n")
                else:
                    sys.stdout.write(out + "\n")
                sys.stdout.flush()
                printed = True
            _TERMINATED.wait(args.watch)
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if printed and sys.stdout.isatty():
        sys.stdout.write("\n")
    return 0


class _Terminated(BaseException):
    """SIGTERM arrived during ``--watch``.

    A ``BaseException``, as ``KeyboardInterrupt`` is: a probe's ``except Exception`` around
    a reading that the signal interrupts must not swallow it and keep the watch running.
    """


#: set by the SIGTERM handler; the watch loop checks it (see :func:`_run`)
_TERMINATED = threading.Event()


def _terminated(signum: int, frame: object) -> None:
    _TERMINATED.set()
    raise _Terminated()
