"""What a cell shows in its output area, followed just far enough to print a record safely.

``clear_output(wait=True)`` asks the frontend to clear the cell's output when the *next*
output arrives: a training loop that prints a line and then calls it keeps its last line
on screen only because nothing comes after. A vramlab record printed after such a cell
would be that next output, and the frontend would erase the loop's last line to show it.

:class:`OutputTracker` follows a cell's outputs (its ``stdout``/``stderr`` writes and the
display publisher's ``publish``/``clear_output`` calls) from the cell's start, as the
frontend applies them: when the cell ends with a clear pending, :meth:`OutputTracker.stop`
returns what the frontend still shows, and :func:`replay` shows it again before the record,
so the clear takes nothing away. It holds at most :data:`LIMIT` characters of a cell's
output; past that it gives up (the caller then prints no record rather than erase more than
it can restore).

It wraps the streams' ``write`` and the publisher's methods on their instances while a
record is taken, and removes exactly its own wrappers when it stops.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

__all__ = ["OutputTracker", "Replay", "StreamText", "DisplayData", "replay", "LIMIT"]

#: the most characters of one cell's visible output the tracker keeps to show again
LIMIT = 1_000_000


@dataclass(frozen=True)
class StreamText:
    """Text written to ``stdout`` or ``stderr`` (``name``)."""

    name: str
    text: str


@dataclass(frozen=True)
class DisplayData:
    """One ``display_data`` output: its MIME bundle and metadata."""

    data: dict[str, Any]
    metadata: dict[str, Any]


Output = Union[StreamText, DisplayData]


@dataclass
class Replay:
    """What :meth:`OutputTracker.stop` found: whether a clear is pending, and what it would erase.

    Attributes:
        pending: the cell ended with ``clear_output(wait=True)`` and no output after it.
        outputs: what the frontend shows now and the pending clear would erase, in order.
        complete: ``outputs`` is all of it (False once the cell's output passed :data:`LIMIT`).
    """

    pending: bool = False
    outputs: list[Output] = field(default_factory=list)
    complete: bool = True

    @property
    def safe(self) -> bool:
        """Whether a record can be shown without erasing what the cell left on screen."""
        return not self.pending or self.complete


class _Buffer:
    """Outputs since the last clear, with their size in characters."""

    def __init__(self) -> None:
        self.items: list[Output] = []
        self.size = 0
        self.complete = True

    def add(self, item: Output) -> None:
        n = len(item.text) if isinstance(item, StreamText) else sum(len(str(v)) for v in item.data.values())
        if not self.complete or self.size + n > LIMIT:
            self.items, self.complete = [], False
            return
        if isinstance(item, StreamText) and self.items:
            prev = self.items[-1]
            if isinstance(prev, StreamText) and prev.name == item.name:
                self.items[-1] = StreamText(item.name, prev.text + item.text)
                self.size += n
                return
        self.items.append(item)
        self.size += n


class OutputTracker:
    """Follows one cell's outputs through ``shell.display_pub`` and ``sys.stdout``/``sys.stderr``.

    :meth:`start` at the cell's start, :meth:`stop` before the record is shown.
    """

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._active = False
        self._wrapped: list[tuple[Any, str, Callable[..., Any]]] = []
        self._current = _Buffer()  # since the last clear: what the frontend shows once that clear is done
        self._visible = _Buffer()  # what the frontend shows while a clear waits
        self._pending = False

    @property
    def active(self) -> bool:
        """Whether the tracker's wrappers are in place."""
        return self._active

    def start(self) -> None:
        """Begin following a cell's outputs (from an empty output area)."""
        self.stop()
        self._current, self._visible, self._pending = _Buffer(), _Buffer(), False
        pub = getattr(self.shell, "display_pub", None)
        if pub is not None:
            self._wrap(pub, "clear_output", self._on_clear)
            self._wrap(pub, "publish", self._on_publish)
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name, None)
            if stream is not None:
                self._wrap(stream, "write", self._on_write(name))
        self._active = True

    def stop(self, result_shown: bool = False) -> Replay:
        """Remove the wrappers; say whether a clear waits and what it would erase.

        Args:
            result_shown: the cell's last expression was displayed after the code ran
                (IPython's ``execute_result``), which is an output the tracker does not see.
        """
        for obj, name, wrapper in reversed(self._wrapped):
            try:
                if obj.__dict__.get(name) is wrapper:
                    del obj.__dict__[name]
            except (AttributeError, TypeError):  # pragma: no cover - an object without __dict__
                pass
        self._wrapped = []
        was_active, self._active = self._active, False
        if not was_active or not self._pending or result_shown:
            return Replay()
        return Replay(pending=True, outputs=list(self._visible.items), complete=self._visible.complete)

    # -- what the frontend does with each message
    # (the user's call is made first and its result returned as is; the bookkeeping after it
    # never raises into the user's code)
    def _output(self, item: Output) -> None:
        self._pending = False  # an output makes the frontend do a waiting clear: the screen starts here
        self._current.add(item)

    def _on_clear(self, original: Callable[..., Any], wait: bool = False, *a: Any, **k: Any) -> Any:
        out = original(wait, *a, **k)
        if wait:
            if not self._pending:  # what is on screen now stays there until the next output
                self._visible = self._current
            self._pending = True
        else:
            self._visible, self._pending = _Buffer(), False
        self._current = _Buffer()
        return out

    def _on_publish(self, original: Callable[..., Any], data: Any = None, metadata: Any = None,
                    *a: Any, **k: Any) -> Any:
        out = original(data, metadata, *a, **k)
        if not k.get("update") and isinstance(data, dict):  # an update replaces in place: no clear
            try:
                self._output(DisplayData(dict(data), dict(metadata or {})))
            except Exception:  # pragma: no cover - a bundle that cannot be copied: give up on replay
                self._current.complete = False
        return out

    def _on_write(self, name: str) -> Callable[..., Any]:
        def on_write(original: Callable[..., Any], text: Any, *a: Any, **k: Any) -> Any:
            out = original(text, *a, **k)
            if isinstance(text, str) and text:
                self._output(StreamText(name, text))
            return out

        return on_write

    def _wrap(self, obj: Any, name: str, handler: Callable[..., Any]) -> None:
        original = getattr(obj, name, None)
        if original is None:
            return

        def wrapper(*a: Any, **k: Any) -> Any:
            return handler(original, *a, **k)

        try:
            setattr(obj, name, wrapper)
        except (AttributeError, TypeError):  # a stream that takes no attributes: not followed
            return
        self._wrapped.append((obj, name, wrapper))


def replay(shell: Any, outputs: list[Output]) -> None:
    """Show ``outputs`` again, in order (streams to their stream, displays through the publisher)."""
    for item in outputs:
        if isinstance(item, StreamText):
            stream: Optional[Any] = getattr(sys, item.name, None)
            if stream is not None:
                stream.write(item.text)
                stream.flush()
        else:
            shell.display_pub.publish(data=item.data, metadata=item.metadata)
