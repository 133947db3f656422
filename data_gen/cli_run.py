"""``python -m data_gen run``: the command line of the synthesis pipeline (``data_gen.run``).

    python -m data_gen run --config configs/data_gen/demo.yaml corpus=CORPUS out=OUT
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --shard 3/16
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --dry-run

Exit status: 0 done, 1 the export cannot stand behind its output, 2 a user error (config,
corpus, shard, plan), 3 a stage left unfinished by temporary endpoint errors (run it again).
"""

from __future__ import annotations

import argparse
import sys

import yaml

from data_gen.config import DataGenConfig
from data_gen.estimate import estimate_text
from data_gen.executor import Shard, ShardError, StageIncomplete
from data_gen.export import ExportError
from data_gen.ingest import IngestError
from data_gen.perturb.plan import UnreachableDimensionError
from data_gen.planning import PlanOffTargetError
from hivig.config import ConfigError, add_config_arguments, config_to_yaml, load_config
from hivig.logging import configure_logging

DESCRIPTION = (
    "The synthesis pipeline: transitions, macro history, perturbation, judge, rationales, export."
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line arguments of ``python -m data_gen run``."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen run",
        description=DESCRIPTION,
        epilog="example: python -m data_gen run --config configs/data_gen/demo.yaml "
        "corpus=CORPUS out=OUT annotator.backend.concurrency=16 (--dry-run prints every key "
        "and the annotator requests the run will send)",
    )
    add_config_arguments(parser, example="annotator.backend.concurrency=16")
    parser.add_argument("--shard", default=None, help="run shard i of N (i/N); default: all, 0/1")
    parser.add_argument(
        "--merge", action="store_true", help="only merge finished shards and export"
    )
    return parser.parse_args(argv)


def read_config(path: str | None, overrides: list[str]) -> DataGenConfig:
    """``load_config`` with every way a config file can be unusable as a ``ConfigError``.

    Raises:
        ConfigError: The file is missing, unreadable, not YAML, or does not fit the schema.
    """
    try:
        return load_config(DataGenConfig, path, overrides)
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(e).split())}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid config {path}: {e}") from None


def main(argv: list[str]) -> int:
    """``python -m data_gen run``; returns the process exit code."""
    args = parse_args(argv)
    try:
        cfg = read_config(args.config, args.overrides)
        if args.dry_run:
            sys.stdout.write(config_to_yaml(cfg))
            sys.stdout.write(estimate_text(cfg))
            return 0
        shard = Shard.parse(args.shard) if args.shard else None
        configure_logging()
        # Imported when called: ``data_gen.run`` re-exports this module's ``main``.
        import data_gen.run as pipeline

        pipeline.run(cfg, shard, args.merge)
    except (
        ConfigError,
        ShardError,
        UnreachableDimensionError,
        PlanOffTargetError,
        IngestError,
    ) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except ExportError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    except StageIncomplete as e:
        # Not a crash: the finished work is kept and a rerun picks up the rest.
        sys.stderr.write(f"incomplete: {e}\n")
        return 3
    return 0
