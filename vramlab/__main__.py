"""``python -m vramlab``: the command line (:mod:`vramlab.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
