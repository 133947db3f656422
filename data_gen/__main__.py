"""The data_gen command line (also installed as ``hivig-gen``).

    python -m data_gen make-sample --out CORPUS --trajectories 60 --seed 0
    python -m data_gen ingest --root CORPUS --out OUT [--platforms web android] [--shard 0/4]
    python -m data_gen split --in OUT/trajectories.jsonl --out SPLITS --val 0.05 --test 0.05
    python -m data_gen run --config configs/data_gen/tiny.yaml      # the synthesis pipeline
    python -m data_gen ingest-runs --format osworld --root RESULTS --out CORPUS [--examples EX]

On SLURM, ingest runs as an array job with ``--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT``.
Every command ends with a one-screen summary on stdout; progress bars go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hivig.actions import PLATFORMS
from hivig.config import screen_size
from hivig.entry import DATA_IMPORTS, extras_of, prog_name, run_entry, unwritable
from hivig.logging import configure_logging

DESCRIPTION = """\
hivig data generation.

  make-sample  write a synthetic corpus in the exact ScaleCUA-Data layout (meta.json,
               annotations/*.jsonl, data/data_YYYYMMDD/<platform>/images/...) plus an
               elements.jsonl sidecar with element boxes per screenshot
  ingest       read a ScaleCUA-format corpus, reconstruct trajectories, normalise actions to
               Qwen3-VL tool-call arguments; writes trajectories.jsonl, quarantine.jsonl,
               stats.json and report.json
  split        assign whole episodes to train/val/test (deterministic for a seed)
  run          the synthesis pipeline (transitions, history, perturbation, rationales, export);
               see `python -m data_gen run --help`
  audit        the shortcut audit of a finished run (text-only probes, AUC per family)
  ingest-runs  an agent's own result folders (osworld, waa, webarena-lite, androidlab,
               androidworld) or the gateway's traces -> a ScaleCUA-layout corpus plus one
               sidecar per episode; see `python -m data_gen ingest-runs --help`
"""


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/N, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= i < N, got {text!r}")
    return i, n


_size = screen_size(min_side=64)
"""``--*-size`` values: screens of at least 64x64 pixels."""


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's and epilog's line breaks and shows every option's default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # Required options and plain switches have no default worth showing.
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


def _wrap(text: str) -> str:
    return textwrap.fill(" ".join(text.split()), width=88)


INGEST_EXAMPLES = """\
examples:
  python -m data_gen ingest --root CORPUS --out OUT
  python -m data_gen ingest --root CORPUS --out OUT --platforms web android --verify-images full
  python -m data_gen ingest --root CORPUS --out OUT --shard 0/4     # shard 0 of 4 (SLURM array)
"""
SPLIT_EXAMPLES = """\
examples:
  python -m data_gen split --in OUT/trajectories.jsonl --out SPLITS
  python -m data_gen split --in OUT/trajectories.jsonl --out SPLITS --val 0.1 --test 0.1 --seed 3
"""
SAMPLE_EXAMPLES = """\
examples:
  python -m data_gen make-sample --out CORPUS --trajectories 60 --seed 0
  python -m data_gen make-sample --out CORPUS --platforms android --phone-size 720x1600
  python -m data_gen make-sample --out CORPUS --copies 0.5 --boost-variants 2
"""


def _out_dir(text: str) -> str:
    """An output folder: refused up front when it exists as a file (not after all the work)."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return text


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _add_ingest(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``ingest`` subcommand."""
    p = sub.add_parser(
        "ingest",
        parents=[common],
        help="ScaleCUA corpus -> trajectories, quarantine, stats",
        description=_wrap(
            "Read CORPUS/meta.json and the annotation files it lists, rebuild "
            "trajectories and write OUT/trajectories.jsonl, quarantine.jsonl (reason per rejected "
            "line), stats.json (lines == steps_kept + sum of dropped) and report.json (scales, "
            "scroll-sign decisions, image checks, truncated trajectories, dropped cross-file "
            "copies)."
        ),
        epilog=INGEST_EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("--root", required=True, help="corpus folder holding meta.json")
    p.add_argument("--out", required=True, type=_out_dir, help="output folder")
    p.add_argument(
        "--platforms",
        nargs="+",
        choices=PLATFORMS,
        help="only these platforms (default: all)",
    )
    p.add_argument(
        "--shard",
        type=_shard,
        default=(0, 1),
        metavar="i/N",
        help="process shard i of N (by source folder); output in OUT/shard-i-of-N/",
    )
    p.add_argument(
        "--verify-images",
        choices=("none", "header", "full"),
        default="header",
        help="header: signature, size, end marker (fast, default); full: decode",
    )
    p.add_argument(
        "--hswipe",
        choices=("finger", "reference"),
        default="finger",
        help="horizontal swipe sign: finger rule, or the reference release's sign",
    )


def _add_split(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``split`` subcommand."""
    p = sub.add_parser(
        "split",
        parents=[common],
        help="assign whole episodes to train/val/test",
        description=_wrap(
            "Split trajectories.jsonl by episode key: every copy and instruction variant "
            "of an episode lands in the same split; the assignment depends only on the seed and "
            "the set of episode keys."
        ),
        epilog=SPLIT_EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("--in", dest="inp", required=True, help="trajectories.jsonl from ingest")
    p.add_argument(
        "--out", required=True, type=_out_dir, help="output folder for train/val/test.jsonl"
    )
    p.add_argument("--val", type=float, default=0.05, help="share of episodes in val")
    p.add_argument("--test", type=float, default=0.05, help="share of episodes in test")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode assignment")


def _add_make_sample(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``make-sample`` subcommand."""
    p = sub.add_parser(
        "make-sample",
        parents=[common],
        help="write a synthetic ScaleCUA-format corpus",
        description=_wrap(
            "Synthetic screens and coherent tasks in the published layout; "
            "the same seed gives a byte-identical corpus. An existing output folder must be empty "
            "or a corpus written by make-sample, whose generated files are then replaced (no stale "
            "screenshot or annotation file survives)."
        ),
        epilog=SAMPLE_EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("--out", required=True, type=_out_dir, help="corpus folder to write")
    p.add_argument("--trajectories", type=int, default=60, help="number of episodes")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    p.add_argument(
        "--platforms",
        nargs="+",
        choices=PLATFORMS,
        help="platforms to cycle through (default: all five)",
    )
    p.add_argument(
        "--desktop-size",
        type=_size,
        default="1280x720",
        metavar="WxH",
        help="screenshot size in pixels of windows/mac/ubuntu episodes",
    )
    p.add_argument(
        "--web-size",
        type=_size,
        default="1280x800",
        metavar="WxH",
        help="screenshot size in pixels of web episodes (browser window)",
    )
    p.add_argument(
        "--phone-size",
        type=_size,
        default="540x1200",
        metavar="WxH",
        help="screenshot size in pixels of android episodes (portrait)",
    )
    p.add_argument(
        "--boost-variants",
        type=int,
        default=3,
        help="instruction variants per episode in boost-instruction files (capped by what the "
        "scenario offers); each variant is one more trajectory of the same episode",
    )
    p.add_argument(
        "--copies",
        type=_share,
        default=0.15,
        metavar="SHARE",
        help="share of navigation/planning episodes also written to the other family's file (a "
        "cross-file copy, as the real data has; ingest keeps one)",
    )


def _add_audit(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``audit`` subcommand."""
    p = sub.add_parser(
        "audit",
        parents=[common],
        help="shortcut audit of a finished run's records",
        description=_wrap(
            "Text-only probes (TF-IDF n-grams, logistic regression, cross-validation grouped "
            "by episode) try to tell Bad from the Good samples of the same steps without the "
            "screenshot; prints the AUC per dimension family and probe, and exits 1 when a "
            "gated family is above the threshold."
        ),
        formatter_class=_Formatter,
    )
    p.add_argument("--data", required=True, help="a data_gen run's output folder (its `out`)")
    p.add_argument("--max-auc", type=float, default=0.7, help="threshold of the gated families")
    p.add_argument(
        "--gated",
        nargs="+",
        default=["text_blind"],
        help="families, text_blind or dimension keys whose AUC is gated",
    )


def _audit(args: argparse.Namespace) -> int:
    from data_gen.audit import GATE_NAMES, AuditSettings, audit_rows, shortcut_audit
    from hivig.records import RecordError, read_records, records_dir

    root = records_dir(args.data)
    try:
        records = [
            r
            for split in ("train", "val", "test")
            if (root / split).is_dir()
            for r in read_records(root / split)
        ]
    except RecordError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    if not records:
        print(f"audit: no records under {root} (give the `out` of a finished run)", file=sys.stderr)
        return 2
    unknown = sorted(set(args.gated) - GATE_NAMES)
    if unknown:
        print(f"audit: unknown --gated names {unknown}; use {sorted(GATE_NAMES)}", file=sys.stderr)
        return 2
    audit = shortcut_audit(records, AuditSettings(args.max_auc, tuple(args.gated)))
    rows = [
        (f"{family}/{probe}", f"AUC {auc} (Bad {bad}, Good {good}) {top}")
        for family, probe, auc, bad, good, top in audit_rows(audit)
    ]
    rows.append(("failed", ", ".join(audit["failed"]) or "none"))
    print(_table("shortcut audit", rows))
    return 1 if audit["failed"] else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of all subcommands except ``run`` (which parses its own)."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen",
        description=DESCRIPTION,
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", action="store_true", help="no progress bars (stderr)")

    _add_ingest(sub, common)
    _add_split(sub, common)
    _add_make_sample(sub, common)
    _add_audit(sub, common)
    sub.add_parser("run", help="the synthesis pipeline (own options: run --help)", add_help=False)
    sub.add_parser(
        "ingest-runs",
        help="agent result folders or gateway traces -> a ScaleCUA-layout corpus "
        "(own options: ingest-runs --help)",
        add_help=False,
    )
    return parser


def _table(title: str, rows: list[tuple[str, Any]]) -> str:
    width = max([len(k) for k, _ in rows] + [10])
    body = "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
    return f"{title}\n{body}"


def _ingest(args: argparse.Namespace) -> int:
    from data_gen.ingest import IngestConfig, IngestError, ingest

    try:
        cfg = IngestConfig(
            tuple(args.platforms) if args.platforms else None,
            args.shard,
            args.verify_images,
            args.hswipe,
        )
        res = ingest(args.root, args.out, cfg, progress=not args.quiet)
    except IngestError as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        return 2
    s, r = res.stats, res.report
    rows: list[tuple[str, Any]] = [
        ("lines", s["lines"]),
        ("steps kept", s["steps_kept"]),
        ("trajectories", s["trajectories"]),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()) or "-"),
    ]
    rows += [(f"dropped {k}", v) for k, v in s["dropped"].items()]
    rows.append(("truncated", r["truncated"]["count"]))
    rows.append(("cross-file copies dropped", len(r["duplicate_copies"])))
    # Aggregated so the summary fits one screen for the 201 files of the real corpus; the
    # per-file detail is in report.json.
    scales = Counter(str(v["scale"]) for v in r["files"].values())
    rows.append(("file scales", ", ".join(f"{k} {v}" for k, v in sorted(scales.items())) or "-"))
    mixed = [f for f, v in r["files"].items() if v["mixed_scale"]]
    rows.append(("mixed-scale files", ", ".join(mixed) or "none"))
    rows += [
        (f"scroll {g}", f"{v['decision']} ({v['pyautogui_agree']}/{v['classified']} agree)")
        for g, v in r["scroll_sign"].items()
        if v["decision"] != "no_evidence"
    ]
    skipped = Counter(r["skipped_entries"].values())
    rows += [(f"skipped entries ({k})", v) for k, v in sorted(skipped.items())]
    rows += [(f"images {k}", v) for k, v in r["images"].items()]
    rows.append(("output", str(res.out_dir)))
    print(_table("ingest summary", rows))
    return 0


def _unwritable_out(command: str, out: str) -> int | None:
    """Exit 2 with one line when ``--out`` cannot be written (checked before any work)."""
    problem = unwritable(out)
    if problem is None:
        return None
    print(f"{command}: --out {out}: {problem}; pass a folder you can write to", file=sys.stderr)
    return 2


def _split(args: argparse.Namespace) -> int:
    from data_gen.split import SplitConfig, SplitError, split

    refused = _unwritable_out("split", args.out)
    if refused is not None:
        return refused
    try:
        cfg = SplitConfig(args.val, args.test, args.seed)
        stats = split(args.inp, args.out, cfg, progress=not args.quiet)
    except SplitError as exc:
        print(f"split: {exc}", file=sys.stderr)
        return 2
    rows: list[tuple[str, Any]] = [("lines", stats["lines"])]
    rows += [(f"dropped {k}", v) for k, v in stats["dropped"].items()]
    rows += [
        (name, f"{v['trajectories']} trajectories, {v['episodes']} episodes")
        for name, v in stats["splits"].items()
    ]
    rows.append(("output", args.out))
    print(_table("split summary", rows))
    return 0


def _make_sample(args: argparse.Namespace) -> int:
    from data_gen.sample_corpus import SampleConfig, make_sample

    refused = _unwritable_out("make-sample", args.out)
    if refused is not None:
        return refused
    try:
        cfg = SampleConfig(
            trajectories=args.trajectories,
            seed=args.seed,
            platforms=tuple(args.platforms) if args.platforms else SampleConfig.platforms,
            desktop_size=args.desktop_size,
            web_size=args.web_size,
            phone_size=args.phone_size,
            boost_variants=args.boost_variants,
            copies=args.copies,
        )
        corpus = make_sample(args.out, cfg, progress=not args.quiet)
    except ValueError as exc:
        print(f"make-sample: {exc}", file=sys.stderr)
        return 2
    by_platform: dict[str, int] = {}
    for ep in corpus.episodes:
        by_platform[ep.platform] = by_platform.get(ep.platform, 0) + 1
    failed = sum(ep.outcome != "success" for ep in corpus.episodes)
    print(
        _table(
            "make-sample summary",
            [
                ("episodes", len(corpus.episodes)),
                ("trajectories", f"{corpus.trajectories} (with instruction variants)"),
                ("cross-file copies", corpus.copies),
                ("failed episodes", failed),
                ("lines", corpus.lines),
                ("screenshots", corpus.images),
                *[(f"platform {k}", v) for k, v in sorted(by_platform.items())],
                ("output", args.out),
            ],
        )
    )
    return 0


class _Lenient(argparse.ArgumentParser):
    """Reads ``--format``/``--root`` ahead of ``ingest-runs``; its own parser reports mistakes."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def _has_runs(fmt: str, root: Path) -> bool:
    """Whether ``root`` holds a run of ``fmt`` with at least one step (stops at the first)."""
    from data_gen.runs import discover

    return any(run.steps for run in discover(fmt, root))


def _no_runs(argv: list[str]) -> str | None:
    """Why ``ingest-runs`` would find nothing to ingest, naming the formats that would match."""
    from data_gen.runs import FORMATS

    p = _Lenient(add_help=False)
    p.add_argument("--format")
    p.add_argument("--root")
    try:
        known, _ = p.parse_known_args(argv)
    except ValueError:
        return None
    if known.format not in FORMATS or known.root is None or not Path(known.root).exists():
        return None
    root = Path(known.root)
    if _has_runs(known.format, root):
        return None
    matching = [f for f in FORMATS if f != known.format and _has_runs(f, root)]
    if matching:
        return (
            f"no {known.format} runs under {root}, but {', '.join(matching)} runs are there: "
            f"pass --format {matching[0]}"
        )
    return (
        f"no runs under {root} in any format ({', '.join(FORMATS)}); pass the runner's "
        "results folder"
    )


def _ingest_runs(argv: list[str]) -> int:
    """``ingest-runs``: refused in one line when ``--root`` holds nothing of ``--format``
    (it would write an empty corpus and exit 0)."""
    from data_gen.runs import main as ingest_runs_main

    problem = _no_runs(argv)
    if problem is not None:
        print(f"ingest-runs: {problem}", file=sys.stderr)
        return 2
    return ingest_runs_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m data_gen`` and ``hivig-gen``; returns the exit status.

    Without the ``data`` extra (a runner's venv) the command says which extra to install.
    """
    args = None if argv is None else list(argv)
    return run_entry(
        prog_name("python -m data_gen"), _main, args, extras_of((DATA_IMPORTS, "data"))
    )


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    if argv and argv[0] == "run":
        # The pipeline owns its options; hand them over untouched.
        from data_gen.run import main as run_main

        return run_main(argv[1:])
    if argv and argv[0] == "ingest-runs":
        return _ingest_runs(argv[1:])
    args = build_parser().parse_args(argv)
    handlers = {"ingest": _ingest, "split": _split, "make-sample": _make_sample, "audit": _audit}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
