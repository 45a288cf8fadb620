"""A helper for tests of threads: wait for a condition, without a timed assertion."""

import time


def wait_for(cond, timeout=10.0):
    """Poll ``cond()`` every 10 ms until it is true (``True``) or ``timeout`` seconds pass (``False``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False
