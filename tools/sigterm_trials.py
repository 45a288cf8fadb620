"""How often ``python -m vramlab --watch`` stops on SIGTERM, whenever the signal lands.

    python3 tools/sigterm_trials.py [--runs N]

Each run starts the watch (0.1 s refresh, output to /dev/null, SIGINT ignored as in a
non-interactive shell), sends SIGTERM after a random delay from 0 to 1.5 s (so that it lands
while Python starts, imports lazily, reads or sleeps), and waits up to 5 s for it to exit. It
prints how many exited with status 0, with another status, or did not exit (then killed).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ok = other = hung = 0
    t0 = time.monotonic()
    for _ in range(args.runs):
        p = subprocess.Popen([sys.executable, "-m", "vramlab", "--watch", "0.1"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        time.sleep(rng.uniform(0.0, 1.5))
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            hung += 1
            continue
        if rc == 0:
            ok += 1
        else:
            other += 1  # e.g. -15: the signal landed before vramlab installed its handler
    print(f"python -m vramlab --watch 0.1, SIGTERM after 0-1.5 s, {args.runs} runs "
          f"({time.monotonic() - t0:.0f} s): exited 0: {ok}; other status (signal before the handler): {other}; "
          f"did not exit in 5 s: {hung}")
    return 1 if hung else 0


if __name__ == "__main__":
    sys.exit(main())
