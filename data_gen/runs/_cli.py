"""The ``ingest-runs`` command line (see ``data_gen.runs`` for what it writes)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from data_gen.runs._api import OUTCOMES, IngestRunsError, ingest_runs
from data_gen.runs._discover import FORMATS


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Reports a usage mistake as one line (``main`` prints it and returns 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--format", required=True, choices=FORMATS, help="the runner's result layout")
    p.add_argument("--root", required=True, help="the results root (or one task folder/file)")
    p.add_argument("--out", required=True, help="a new or empty folder for the corpus")
    p.add_argument(
        "--outcomes",
        nargs="+",
        default=list(OUTCOMES),
        choices=OUTCOMES,
        help="keep episodes with these evaluated outcomes",
    )
    p.add_argument(
        "--examples",
        default=None,
        help="osworld/waa: the benchmark's evaluation_examples/examples folder (instructions)",
    )
    p.add_argument(
        "--diagnoses",
        default=None,
        help="a folder of diagnosis.json files (serve.diagnose --out): root causes -> sidecars",
    )
    return p


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``ingest-runs`` on an argparse subparsers object (``set_defaults(handler=...)``)."""
    p = subparsers.add_parser("ingest-runs", help="agent result folders / traces -> a corpus")
    _configure(p)
    p.set_defaults(handler=_run)
    return p


def _run(args: argparse.Namespace) -> int:
    try:
        stats = ingest_runs(
            args.format, args.root, args.out, args.outcomes, args.examples, args.diagnoses
        )
    except IngestRunsError as exc:
        print(f"ingest-runs: {exc}", file=sys.stderr)
        return 2
    dropped = ", ".join(f"{k} {v}" for k, v in stats["dropped"].items()) or "none"
    print(
        f"ingest-runs: {stats['in']} in = {stats['kept']} kept + "
        f"{sum(stats['dropped'].values())} dropped ({dropped}); {stats['episodes']} episodes "
        f"{stats['outcomes']}; corpus in {args.out}"
    )
    if stats["terminate_disagrees_with_outcome"]:
        print(
            f"ingest-runs: {stats['terminate_disagrees_with_outcome']} episode(s) end in a "
            "terminate status the evaluator contradicts; the sidecars hold the evaluated outcome"
        )
    if "diagnoses" in stats:
        d = stats["diagnoses"]
        print(
            f"ingest-runs: {d['files']} diagnoses = {d['matched']} recorded + "
            f"{sum(d['dropped'].values())} dropped {d['dropped'] or ''}".rstrip()
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m data_gen ingest-runs ...``; returns the exit status (2 on a user mistake)."""
    parser = _configure(
        _Parser(
            prog="python -m data_gen ingest-runs",
            description="agent result folders or gateway traces -> a ScaleCUA-layout corpus",
        )
    )
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as exc:
        print(f"ingest-runs: {exc} (see --help)", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    return _run(args)
