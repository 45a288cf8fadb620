"""The frontend extension's own unit tests (jest, from the official extension template), run by the
README's test command; and the source and the built extension agree on their version."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_typescript_unit_tests_pass():
    jlpm = shutil.which("jlpm")
    if shutil.which("node") is None or jlpm is None or not (ROOT / "node_modules" / ".bin" / "jest").exists():
        pytest.skip("no Node, jlpm or node_modules here: pip install -e . from a checkout installs them (.ci/run does)")
    env = dict(os.environ, CI="true", FORCE_COLOR="0")
    r = subprocess.run([jlpm, "jest", "--ci", "--reporters=default"], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=300, env=env, stdin=subprocess.DEVNULL,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "failed" not in out.split("Tests:")[-1].splitlines()[0], out[-2000:]


def test_the_built_extension_is_this_source():
    built = ROOT / "vramlab" / "labextension" / "package.json"
    if not built.exists():
        pytest.skip("the extension is not built in this checkout (pip install -e . builds it)")
    src = json.loads((ROOT / "package.json").read_text())
    out = json.loads(built.read_text())
    assert out["name"] == src["name"] and out["version"] == src["version"]
    assert out["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")


def _jupyter(*args: str) -> str:
    import sys

    r = subprocess.run([sys.executable, "-m", "jupyter", *args], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"),
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stdout + r.stderr
    return re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)


@pytest.mark.slow
def test_jupyter_lists_both_extensions_enabled():
    """What pip installed: the prebuilt frontend extension and the server extension, both on by default."""
    from vramlab import __version__

    labext = _jupyter("labextension", "list")
    assert re.search(rf"\bvramlab v{re.escape(__version__)} enabled OK\b", labext), labext
    server = _jupyter("server", "extension", "list")
    assert re.search(r"\bvramlab\.server enabled\b", server) and re.search(r"vramlab\.server\s+OK", server), server
