"""Jupyter Server's own pytest fixtures (``jp_fetch``, ``jp_serverapp``...), for this folder only.

pytest-jupyter's plugin registers autouse fixtures (an event loop, a server cleanup) and a
hook that runs ``async def`` tests; imported here, they apply to the server-extension tests
and to nothing else in the suite.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403


@pytest.fixture
def jp_server_config():  # noqa: F811 (replaces the plugin's empty config)
    """vramlab's server extension on, and every endpoint behind authentication."""
    return {"ServerApp": {"jpserver_extensions": {"vramlab.server": True}, "allow_unauthenticated_access": False}}


@pytest.fixture
def sleeper():
    """A real process standing in for a kernel (PID, asleep)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    yield p.pid
    p.kill()
    p.wait()
