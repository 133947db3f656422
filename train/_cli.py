"""Command line of the training stage: ``train`` (default) and ``merge-lora``.

python -m train --config configs/train/tiny_cpu.yaml data=DIR out=DIR [key=value ...]
python -m train --config configs/train/qwen3vl_8b_full.yaml --dry-run
python -m train merge-lora --adapter OUT/final --out OUT/merged [--base CKPT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hivig.config import ConfigError, add_config_arguments, config_to_yaml, load_config
from hivig.logging import configure_logging
from train.config import TrainConfig


def train_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m train",
        description="Supervised fine-tuning of the Qwen3-VL critic.",
        epilog="Other command: `python -m train merge-lora --adapter DIR --out DIR [--base CKPT]` "
        "merges a LoRA run's adapters into its base model (see `python -m train merge-lora -h`).",
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(config_to_yaml(cfg), end="")
        return 0
    from train.sft import run

    try:
        result = run(cfg)
    except ConfigError as e:  # settings refused once the launcher's are known (precision)
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = result.final_dir or f"{cfg.out}/checkpoints (preempted)"
    print(f"finished at step {result.state.step}: {where}")
    return 0


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
    configure_logging()
    from train.merge import merge_lora

    base = (
        args.base
        or json.loads((Path(args.adapter) / "adapter_config.json").read_text())[
            "base_model_name_or_path"
        ]
    )
    out = merge_lora(args.adapter, args.out, base=base, dtype=args.dtype)
    print(f"merged checkpoint in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "merge-lora":
        return merge_main(argv[1:])
    if argv and argv[0] == "train":
        argv = argv[1:]
    return train_main(argv)
