"""``python -m train`` (and the ``hivig-train`` console script); see ``train/_cli.py``."""

from __future__ import annotations

import sys

from train._cli import main

if __name__ == "__main__":
    sys.exit(main())
