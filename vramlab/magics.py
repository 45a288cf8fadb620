"""The ``%vram`` magic. It only parses arguments and calls the public API.

Usage::

    %load_ext vramlab
    %vram              # the reconciled snapshot: a table with a stacked bar per device and the host
    %vram --json       # the same reading as a JSON dict
    %vram --uss        # also read this process's USS (slower)

``%vram?`` prints this manual. Unknown subcommands and options raise a
``UsageError`` with the usage line.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

__all__ = ["VramMagics", "load", "unload", "SUBCOMMANDS"]

#: subcommand -> (handler name, one-line help). Later modules add entries here.
SUBCOMMANDS: dict[str, str] = {
    "show": "show the reconciled snapshot (the default)",
}


@magics_class
class VramMagics(Magics):
    """The ``%vram`` magic."""

    @magic_arguments()
    @argument("command", nargs="?", default=None, metavar="SUBCOMMAND",
              help="one of: " + ", ".join(SUBCOMMANDS) + " (default: show)")
    @argument("rest", nargs="*", metavar="ARG", help="arguments of the subcommand")
    @argument("--json", action="store_true", help="print the snapshot as a JSON dict")
    @argument("--uss", action="store_true", help="also read this process's USS (slower: walks every mapping)")
    @line_magic
    def vram(self, line: str = "") -> None:
        """Show GPU memory (NVML and the torch allocator), host RAM and swap, reconciled."""
        args = self._parse(line)
        command = args.command or "show"
        if command == "show":
            if args.rest:
                raise UsageError(f"%vram show takes no arguments, got {' '.join(args.rest)!r}\n{self._usage()}")
            self._show(args)
            return None
        raise UsageError(f"unknown subcommand {command!r}; choose one of: {', '.join(SUBCOMMANDS)}\n{self._usage()}")

    # -- helpers
    def _parse(self, line: str) -> Any:
        try:
            return parse_argstring(self.vram, line)
        except UsageError as e:
            raise UsageError(f"{e}\n{self._usage()}") from None
        except SystemExit:  # pragma: no cover - argparse --help paths
            raise UsageError(self._usage()) from None

    def _usage(self) -> str:
        text = self.vram.parser.format_usage().replace("::", " ")
        return "usage: " + " ".join(text.split()).removeprefix("usage: ")

    def _show(self, args: Any) -> None:
        from ._snapshot import snapshot

        snap = snapshot(uss=args.uss)
        if args.json:
            print(json.dumps(snap.to_dict(), indent=2))
            return
        from IPython.display import display

        display(snap)


_REGISTERED: dict[int, list[tuple[str, str]]] = {}
_UNLOAD_HOOKS: list[Callable[[Any], None]] = []


def load(ip: Any) -> None:
    """Register the magics on shell ``ip``. Loading twice is harmless."""
    key = id(ip)
    if key in _REGISTERED:
        return
    ip.register_magics(VramMagics)
    _REGISTERED[key] = [("line", "vram")]


def unload(ip: Any) -> None:
    """Remove everything :func:`load` registered on ``ip``."""
    for hook in list(_UNLOAD_HOOKS):
        try:
            hook(ip)
        except Exception:
            pass
    entries = _REGISTERED.pop(id(ip), [])
    magics = ip.magics_manager.magics
    for kind, name in entries:
        magics.get(kind, {}).pop(name, None)
    ip.magics_manager.registry.pop("VramMagics", None)


def registered(ip: Optional[Any]) -> bool:
    """Whether the magics are loaded on ``ip``."""
    return ip is not None and id(ip) in _REGISTERED
