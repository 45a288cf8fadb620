"""The frontend extension's own unit tests (jest, from the official extension template), run by the
README's test command; and the source and the built extension agree on their version."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
