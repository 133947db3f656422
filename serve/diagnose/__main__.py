"""``python -m serve.diagnose PATH --out DIR``."""

import sys

from serve.diagnose.cli import main

if __name__ == "__main__":
    sys.exit(main())
