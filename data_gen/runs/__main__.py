"""``python -m data_gen.runs --format F --root RESULTS --out CORPUS`` (same as ``ingest-runs``)."""

import sys

from data_gen.runs import main

if __name__ == "__main__":
    sys.exit(main())
