"""Metadata beside every matplotlib figure a shell shows as PNG.

IPython's PNG formatter may return ``(data, metadata)`` instead of the bare image, and
``DisplayFormatter.format`` files that metadata under the ``image/png`` key of the display
message's metadata; the inline backend's ``display(fig, metadata=...)`` merges its own
top-level keys (``needs_background``) into that dict without replacing it. A saved notebook
keeps the output's metadata, so whatever a provider computes from the figure travels with
its picture.

:func:`add_figure_metadata` wraps the PNG formatter's printer for ``matplotlib.figure.Figure``
(and its subclasses) so that each output also carries ``{key: provider(fig)}`` for every
provider registered on that shell. The inline backend registers its own printer whenever it
selects the figure formats (when it activates, on ``%matplotlib inline``, on
``%config InlineBackend.figure_formats``), popping the old one: so the formatter's
``for_type`` and ``for_type_by_name`` are wrapped on that formatter instance too, and every
printer registered for a figure later is wrapped as it is registered. Nothing is registered
where no printer exists (a terminal without the inline backend shows no PNG, and still
shows none), and matplotlib is never imported here.

A provider that raises, or a printer whose result is not an image, leaves the output as the
printer made it; only the printer's own errors reach IPython, as they did before.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

__all__ = ["add_figure_metadata", "MIME"]

#: the one format whose figures carry the metadata
MIME = "image/png"
_FIGURE = ("matplotlib.figure", "Figure")
#: the attribute of the PNG formatter that holds its providers: {metadata key: provider}
_PROVIDERS = "_vramlab_figure_metadata"
_HOOK = "_vramlab_figure_hook"

Provider = Callable[[Any], Any]


class _WithMetadata:
    """A figure printer, wrapped: the printer's image, with each provider's value in its metadata."""

    def __init__(self, printer: Callable[[Any], Any], providers: dict[str, Provider]) -> None:
        self.printer = printer
        self.providers = providers

    def __call__(self, fig: Any) -> Any:
        result = self.printer(fig)
        try:
            data, md = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
            if data is None or not self.providers:
                return result
            extra = {}
            for key, provider in list(self.providers.items()):
                try:
                    extra[key] = provider(fig)
                except Exception:
                    continue
            if not extra:
                return result
            merged = dict(md) if isinstance(md, dict) else {}
            merged.update(extra)
            return data, merged
        except Exception:
            return result

    def __repr__(self) -> str:
        return f"<figure printer with metadata {sorted(self.providers)}: {self.printer!r}>"


def _is_figure_class(typ: Any) -> bool:
    """Whether ``typ`` is ``matplotlib.figure.Figure``, a subclass of it, or its dotted name."""
    if isinstance(typ, str):
        return tuple(typ.rsplit(".", 1)) == _FIGURE
    return any((getattr(c, "__module__", None), getattr(c, "__name__", None)) == _FIGURE
               for c in getattr(typ, "__mro__", ()))


def _wrap(printer: Any, providers: dict[str, Provider]) -> Any:
    if printer is None or isinstance(printer, _WithMetadata) or not callable(printer):
        return printer
    return _WithMetadata(printer, providers)


def _hook(formatter: Any, providers: dict[str, Provider]) -> None:
    """Wrap every figure printer that ``formatter.for_type``/``for_type_by_name`` registers from now on."""
    if getattr(formatter, _HOOK, False):
        return
    for_type, for_type_by_name = formatter.for_type, formatter.for_type_by_name

    def hooked_for_type(typ: Any, func: Any = None) -> Any:
        if func is not None and _is_figure_class(typ):
            func = _wrap(func, providers)
        return for_type(typ, func)

    def hooked_for_type_by_name(type_module: str, type_name: str, func: Any = None) -> Any:
        if func is not None and (type_module, type_name) == _FIGURE:
            func = _wrap(func, providers)
        return for_type_by_name(type_module, type_name, func)

    formatter.for_type = hooked_for_type
    formatter.for_type_by_name = hooked_for_type_by_name
    setattr(formatter, _HOOK, True)


def _wrap_registered(formatter: Any, providers: dict[str, Provider]) -> None:
    """Wrap the figure printers already registered, by class or (deferred) by name."""
    printers = formatter.type_printers
    for cls in [c for c in printers if _is_figure_class(c)]:
        printers[cls] = _wrap(printers[cls], providers)
    deferred = formatter.deferred_printers
    if _FIGURE in deferred:
        deferred[_FIGURE] = _wrap(deferred[_FIGURE], providers)


def _current_shell() -> Any:
    if "IPython" not in sys.modules:  # not inside IPython: do not import it
        return None
    from IPython import get_ipython

    return get_ipython()


def add_figure_metadata(key: str, provider: Provider, shell: Optional[Any] = None) -> bool:
    """Have every figure ``shell`` shows as PNG carry ``provider(fig)`` under ``key`` in its metadata.

    ``shell`` defaults to the running IPython shell. Adding the same key again replaces its
    provider; the printer is wrapped once, whatever the number of keys or calls. The provider's
    value should be JSON-serialisable (it goes into the display message and the notebook).

    Returns:
        whether the provider is registered (False outside IPython, or if anything failed).
    """
    try:
        shell = _current_shell() if shell is None else shell
        if shell is None:
            return False
        formatter = shell.display_formatter.formatters[MIME]
        providers: Optional[dict[str, Provider]] = getattr(formatter, _PROVIDERS, None)
        if providers is None:
            providers = {}
            setattr(formatter, _PROVIDERS, providers)
        providers[key] = provider
        _hook(formatter, providers)
        _wrap_registered(formatter, providers)
        return True
    except Exception:
        return False
