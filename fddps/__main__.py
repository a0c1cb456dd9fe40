"""``python -m fddps``: the fddps command (see :mod:`fddps.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
