"""``--write-doc``: put what a benchmark script printed into ``docs/benchmarks.md``, verbatim.

Each script's section of the doc sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``
markers; :func:`recording` tees the script's output and, when asked, replaces that section
with the command line, the date and machine, and the output itself in a code block. Text
outside the markers is commentary and is never written by a script.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import sys
import time
from pathlib import Path
from typing import Iterator

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


class _Tee(io.TextIOBase):
    def __init__(self, *streams: io.TextIOBase) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


@contextlib.contextmanager
def recording(name: str, write: bool) -> Iterator[None]:
    """Tee stdout; on a clean exit with ``write``, put it into the doc's ``name`` section."""
    buf = io.StringIO()
    real = sys.stdout
    sys.stdout = _Tee(real, buf)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = real
    if write:
        write_section(name, buf.getvalue())


def write_section(name: str, output: str) -> None:
    """Replace the doc's ``name`` section with ``output`` (raises if the markers are missing)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = DOC.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{DOC.name} has no {start} ... {end} section")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    cmd = " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *[a for a in sys.argv[1:] if a != "--write-doc"]])
    when = time.strftime("%Y-%m-%d")
    machine = f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}"
    block = f"{start}\n`{cmd}`, run {when} ({machine}), printed:\n\n```\n{output.rstrip()}\n```\n{end}"
    DOC.write_text(head + block + tail)
    print(f"[wrote the output into {DOC.relative_to(DOC.parent.parent)}]", file=sys.stderr)


def write_flag() -> bool:
    """Take ``--write-doc`` off the command line (before the script's own argparse sees it)."""
    if "--write-doc" in sys.argv:
        sys.argv.remove("--write-doc")
        return True
    return False
