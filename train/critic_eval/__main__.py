"""``python -m train.critic_eval``; see ``train/critic_eval/cli.py``."""

from __future__ import annotations

import sys

from train.critic_eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
