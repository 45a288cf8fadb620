"""Static checks run with the tests: mypy over the package (strict on the core: probes, model,
reconcile, runtime, display; see ``pyproject.toml``) and ruff's small rule set over the code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MYPY", "RUFF"))}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
def test_mypy_finds_nothing():
    r = _run(["mypy", "--no-incremental", "--config-file", "pyproject.toml"])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert "Success: no issues found" in r.stdout


def test_ruff_finds_nothing():
    r = _run(["ruff", "check", "--no-cache", "vramlab", "tests", "tools", "benchmarks"])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
