"""``python -m vramlab``: the reconciled snapshot in a terminal.

    python -m vramlab              # the text table
    python -m vramlab --json       # the dict, as JSON
    python -m vramlab --watch 1    # refresh every second until Ctrl-C (or SIGTERM)

``--watch`` stops cleanly, with exit status 0, on Ctrl-C (SIGINT) and on SIGTERM: SIGTERM
is what ``timeout``, ``kill``, ``docker stop`` and systemd send, and the only way to stop
a watch started in the background of a non-interactive shell, where SIGINT is ignored.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Optional, Sequence

from ._version import __version__
from .display.text import snapshot_text
from .reconcile import snapshot

__all__ = ["main"]


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"the interval must be a positive number of seconds, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog="python -m vramlab",
                                description="GPU memory (NVML and the torch allocator), host RAM and swap, reconciled.")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.add_argument("--watch", type=_positive_float, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C or SIGTERM")
    p.add_argument("--uss", action="store_true", help="also read this process's USS (slower)")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def _render(as_json: bool, uss: bool) -> str:
    snap = snapshot(uss=uss)
    return json.dumps(snap.to_dict()) if as_json else snapshot_text(snap)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.version:
        print(__version__)
        return 0
    if args.watch is None:
        try:
            print(_render(args.json, args.uss))
        except BrokenPipeError:
            pass
        return 0
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        tty = sys.stdout.isatty() and not args.json
        while True:
            out = _render(args.json, args.uss)
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + out + "\n")
            else:
                sys.stdout.write(out + "\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except (KeyboardInterrupt, _Terminated):
        if sys.stdout.isatty():
            sys.stdout.write("\n")
        return 0
    except BrokenPipeError:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Terminated(Exception):
    """SIGTERM arrived during ``--watch``."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated()
