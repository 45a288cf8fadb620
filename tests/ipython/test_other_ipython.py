"""The IPython-facing tests again, under the other IPython series.

IPython 9.8 changed when a cell is numbered (``execution_count`` goes up before
``pre_run_cell``), and the README's install brings whatever IPython the environment has or
pip picks. So this runs ``tests/ipython`` a second time in a small virtual environment that
sees this one's packages but has the other series of IPython: the newest 9.x when this
environment has an older one, the newest 8.x when it has 9.8 or later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import IPython
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _other_series() -> str:
    major, minor = (int(x) for x in IPython.__version__.split(".")[:2])
    return "ipython>=8.39,<9" if (major, minor) >= (9, 8) else "ipython>=9.8"


def _run(cmd: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMLAB_", "PYTEST_"))}
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_ipython_tests_pass_under_the_other_ipython_series(tmp_path):
    venv = tmp_path / "other-ipython"
    r = _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], timeout=120)
    assert r.returncode == 0, r.stderr
    py = str(venv / "bin" / "python")
    want = _other_series()
    r = _run([py, "-m", "pip", "install", "-q", want], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = _run([py, "-c", "import IPython, vramlab; print(IPython.__version__); print(vramlab.__file__)"], timeout=120)
    version, where = r.stdout.split()
    assert version != IPython.__version__ and Path(where).resolve().is_relative_to(ROOT), r.stdout + r.stderr
    r = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/ipython",
              "--deselect", "tests/ipython/test_other_ipython.py"], timeout=900, cwd=str(ROOT))
    assert r.returncode == 0, f"under IPython {version}:\n" + r.stdout[-6000:] + r.stderr[-2000:]
