"""The README's IPython transcript, from a real run.

``python3 tools/readme_transcript.py`` prints what a fresh IPython session shows for
``%load_ext vramlab``, ``%vram`` and ``%vram bogus``; ``--write`` puts it into README.md
between the ``transcript`` markers. ``tests/test_readme.py`` runs it and fails when the
README's copy is not what vramlab prints (figures and times aside).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- transcript:start -->", "<!-- transcript:end -->"
CELLS = ("%load_ext vramlab", "%vram", "%vram bogus")

_SESSION = r'''
import contextlib, io, json, sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance(colors="NoColor")
shown = []
for i, cell in enumerate(json.loads(sys.argv[1]), start=1):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        ip.run_cell(cell, store_history=True)
    shown.append((i, cell, out.getvalue()))
print(json.dumps(shown))
'''


def transcript() -> str:
    """Run the cells in a fresh IPython (this checkout's vramlab, torch not imported); the text it shows."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, "-c", _SESSION, json.dumps(CELLS)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=str(ROOT),
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    lines: list[str] = []
    for i, cell, out in json.loads(r.stdout):
        lines.append(f"In [{i}]: {cell}")
        body = out.rstrip("\n")
        if body:
            lines.append(body)
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def readme_block(text: str) -> str:
    """The transcript inside README's markers (without the code fence)."""
    inner = text.split(START, 1)[1].split(END, 1)[0]
    return inner.strip("\n").removeprefix("```text\n").removesuffix("```").rstrip("\n") + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the transcript into README.md")
    args = ap.parse_args()
    t = transcript()
    if not args.write:
        print(t, end="")
        return 0
    text = README.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n```text\n{t}```\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
