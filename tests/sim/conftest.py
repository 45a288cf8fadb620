"""Shared fixtures of the simulator's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_leftover_gpu():
    """After the test: no VirtualGPU left active for the next (a failed test may leave one)."""
    yield
    from vramlab.sim.virtual_gpu import active_virtual_gpu

    gpu = active_virtual_gpu()
    if gpu is not None:
        gpu.__exit__(None, None, None)
