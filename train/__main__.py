"""``python -m train`` (and the ``hivig-train`` console script); see ``train/cli.py``."""

from __future__ import annotations

import sys

from hivig.entry import DATA_IMPORTS, extras_of, prog_name, run_entry
from train import cli

TRAIN_IMPORTS = (
    "torchvision",
    "transformers",
    "tokenizers",
    "accelerate",
    "deepspeed",
    "peft",
    "matplotlib",
    "dashscope",
)
"""Import names the ``train`` extra brings on top of ``data``."""


def main(argv: list[str] | None = None) -> int:
    """Train (or merge / evaluate); without the training stack, one line naming the extra."""
    extras = extras_of((TRAIN_IMPORTS, "train"), (DATA_IMPORTS, "train"))
    return run_entry(prog_name("python -m train"), cli.main, argv, extras)


if __name__ == "__main__":
    sys.exit(main())
