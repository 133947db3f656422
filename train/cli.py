"""Command line of the training stage: ``train`` (default), ``merge-lora`` and ``evaluate``.

python -m train --config configs/train/tiny_cpu.yaml data=DIR out=DIR [key=value ...]
python -m train --config configs/train/qwen3vl_8b_full.yaml --dry-run
python -m train merge-lora --adapter OUT/final --out OUT/merged [--base CKPT]
python -m train evaluate ARGS...      # the offline critic evaluation (train.critic_eval)

Exit status: 0 done, 2 a user error (one line on stderr), 75 preempted after a checkpoint
(rerun to resume), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Only light modules at import (the signal module, a stdlib helper): the preemption handler
# must be in place before torch and transformers take their seconds to import.
from hivig.entry import unwritable
from train.signals import PreemptionFlag


def merge_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m train merge-lora",
        description="Merge LoRA adapters into their base model and save a plain HF checkpoint.",
    )
    parser.add_argument("--adapter", required=True, help="directory with the saved adapter")
    parser.add_argument("--out", required=True, help="directory for the merged checkpoint")
    parser.add_argument("--base", default=None, help="base checkpoint (default: from the adapter)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    adapter_config = Path(args.adapter) / "adapter_config.json"
    if args.base is None and not adapter_config.is_file():
        print(f"error: --adapter: no adapter_config.json in {args.adapter}", file=sys.stderr)
        return 2
    problem = unwritable(args.out)
    if problem is not None:  # before the minutes of loading and merging the weights
        print(
            f"error: --out {args.out}: {problem}; pass a folder you can write to", file=sys.stderr
        )
        return 2
    from hivig.logging import configure_logging
    from train.merge import merge_lora

    configure_logging()
    base = args.base or json.loads(adapter_config.read_text())["base_model_name_or_path"]
    out = merge_lora(args.adapter, args.out, base=base, dtype=args.dtype)
    print(f"merged checkpoint in {out}")
    return 0


def evaluate_main(argv: list[str]) -> int:
    try:
        from train.critic_eval import main as critic_eval_main
    except ImportError as e:
        if getattr(e, "name", None) not in ("train.critic_eval", None):
            raise  # a dependency of the evaluation is missing: show it
        print("error: the critic evaluation (train.critic_eval) is not installed", file=sys.stderr)
        return 2
    return int(critic_eval_main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "merge-lora":
        return merge_main(argv[1:])
    if argv and argv[0] == "evaluate":
        return evaluate_main(argv[1:])
    if argv and argv[0] == "train":
        argv = argv[1:]
    signals = PreemptionFlag()
    from train.sft import main as train_main

    return train_main(argv, signals)
