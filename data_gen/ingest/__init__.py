"""Ingest ScaleCUA-Data: ``meta.json`` + annotation JSONL + image roots -> trajectories.

    python -m data_gen ingest --root CORPUS --out OUT
    python -m data_gen ingest --root CORPUS --out OUT --platforms web android --shard 0/4
    python -m data_gen ingest --root CORPUS --out OUT --verify-images full

Writes ``OUT/trajectories.jsonl`` (one trajectory per line), ``OUT/quarantine.jsonl`` (one line
per rejected input line, with a stable reason code), ``OUT/stats.json`` (``lines == steps_kept +
Σ dropped``) and ``OUT/report.json`` (per-file scale decisions, scroll-sign decisions, skipped
meta entries, image checks). With ``--shard i/N`` the same files go to ``OUT/shard-i-of-N/``;
lines are assigned to shards by source folder, so every episode (and all its copies and
instruction variants) lands in exactly one shard.

Reconstruction: a record whose history is ``None`` opens a
trajectory; a record attaches to the open trajectory with the same source folder and task whose
step count equals its history length. Boost-instruction variants differ by task text, so they
become parallel trajectories sharing one episode key. A bad step ends its trajectory: the good
prefix is kept, the later steps are quarantined as ``after_bad_step``, and the trajectory is
listed under ``truncated`` in report.json with the reason that cut it. The same trajectory in
several files (a navigation and a planning_cot copy share their id) is kept once: the copy with
``<think>``, then the longer one; the other copies' lines count as ``duplicate``. The
episode key is platform + image root + source folder, so all copies share it.

meta.json entries whose ``root`` or ``annotation`` is absolute or leaves the corpus (``..``, a
symlink pointing outside) are skipped as ``entry_path_escapes_corpus``: ingest reads nothing
outside ``--root``.

Per file the coordinate scale is tallied over all records first (two passes); per platform
and family the wheel-scroll sign is decided from the ``<operation>``/``<think>`` texts.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data_gen.ingest._build import Built, FileIngest, FileReport, drop_copies
from data_gen.ingest._images import ImageResolver, decode_check, sniff_image
from data_gen.ingest._parse import (
    MIXED_SCALE_SHARE,
    PLATFORMS,
    REASONS,
    VERIFY_MODES,
    Entry,
    IngestConfig,
    IngestError,
    Record,
    bad_encoding_record,
    classify_entry,
    parse_line,
    parse_prompt,
    read_lines,
    read_meta,
    scroll_decision,
    scroll_direction,
)
from data_gen.quarantine import Ledger
from hivig.config import run_info
from hivig.files import clean_stale_temps, dumps_jsonl, write_atomic

__all__ = [
    "PLATFORMS",
    "REASONS",
    "VERIFY_MODES",
    "Entry",
    "IngestConfig",
    "IngestError",
    "IngestResult",
    "Record",
    "classify_entry",
    "decode_check",
    "ingest",
    "ingest_complete",
    "parse_line",
    "parse_prompt",
    "scroll_direction",
    "sniff_image",
]


@dataclass
class IngestResult:
    """Counts and the report of one run (also written to ``stats.json``/``report.json``)."""

    out_dir: Path
    stats: dict[str, Any]
    report: dict[str, Any]


def _select(meta: dict[str, Any], root: Path, cfg: IngestConfig) -> tuple[list[Entry], dict]:
    """The entries to read, and the reason for every entry that is not read."""
    entries, skipped = [], {}
    base = root.resolve()
    listed: dict[str, str] = {}
    for key in sorted(meta):
        got = classify_entry(key, meta[key])
        if isinstance(got, str):
            skipped[key] = got
        elif got.annotation in listed:
            # One file under two keys would be read twice: every line a duplicate of itself.
            skipped[key] = "duplicate_annotation_entry"
        elif not all(
            (base / p).resolve().is_relative_to(base) for p in (got.annotation, got.root or ".")
        ):
            skipped[key] = "entry_path_escapes_corpus"  # a symlink out of the corpus
        elif cfg.platforms is not None and got.platform not in cfg.platforms:
            skipped[key] = "platform_not_selected"
        elif not (root / got.annotation).is_file():
            skipped[key] = "missing_annotation_file"
        else:
            listed[got.annotation] = key
            entries.append(got)
    return entries, skipped


def _parse_file(path: Path) -> list[Record]:
    lines, bad = read_lines(path)
    return [
        bad_encoding_record(raw, k, bad[k]) if k in bad else parse_line(raw, k)
        for k, raw in enumerate(lines, 1)
    ]


def _truncated(kept: list[Built]) -> dict[str, Any]:
    """Trajectories a bad step or a gap cut short: they end early, not with their last step."""
    rows = [
        {"id": b.id, "file": b.file, "line": b.cut[1], "reason": b.cut[0]}
        for b in kept
        if b.cut is not None
    ]
    return {
        "count": len(rows),
        "by_reason": dict(sorted(Counter(r["reason"] for r in rows).items())),
        "trajectories": rows,
    }


def ingest(
    root: str | Path, out: str | Path, cfg: IngestConfig | None = None, progress: bool = True
) -> IngestResult:
    """Read a ScaleCUA-format corpus and write trajectories, quarantine, stats and report.

    Args:
        root: Corpus folder holding ``meta.json``.
        out: Output folder (the shard's subfolder is used when ``cfg.shard`` has N > 1).
        cfg: Run options.
        progress: Show tqdm bars (stderr) for the parsing and the checking pass.

    Returns:
        The stats and report that were written.

    Raises:
        IngestError: ``meta.json`` is missing or unreadable.
        AccountingError: The counts identity fails (a bug; nothing is written).
    """
    cfg = cfg or IngestConfig()
    root, out_dir = Path(root), Path(out)
    i, n = cfg.shard
    if n > 1:
        out_dir = out_dir / f"shard-{i}-of-{n}"
    if not root.is_dir():
        raise IngestError(f"no meta.json in {root}: the corpus folder does not exist")
    entries, skipped = _select(read_meta(root), root, cfg)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise IngestError(f"cannot create the output folder {out_dir}: {exc.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise IngestError(f"output folder {out_dir} is not writable")
    clean_stale_temps(out_dir)
    ledger, images = Ledger(), ImageResolver(root, cfg.verify_images)
    files: dict[str, FileReport] = {}
    scroll: dict[str, dict] = {}
    built: list[Built] = []
    # Scroll-sign decisions are per (platform, family), so each group is parsed before any of
    # its files is normalised.
    groups: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        groups[(e.platform, e.family)].append(e)
    parse_bar = tqdm(desc="parse", unit="line", unit_scale=True, disable=not progress)
    check_bar = tqdm(
        desc="normalise+images", unit="line", unit_scale=True, disable=not progress, position=1
    )
    for (platform, family), group in sorted(groups.items()):
        parsed: list[tuple[Entry, list[Record]]] = []
        for e in group:
            parsed.append((e, _parse_file(root / e.annotation)))
            parse_bar.update(len(parsed[-1][1]))
        decision = scroll_decision([r for _, recs in parsed for r in recs if r.error is None])
        scroll[f"{platform}/{family}"] = decision
        sign = -1 if decision["decision"] == "inverted" else 1
        for e, recs in parsed:
            rep = files[e.annotation] = FileReport()
            built += FileIngest(e, recs, ledger, images, cfg, sign, rep).run(check_bar.update)
            rep.mixed_scale = rep.scale_conflicts > MIXED_SCALE_SHARE * max(1, len(recs))
    parse_bar.close()
    check_bar.close()
    kept, copies = drop_copies(built, ledger)
    ledger.check()
    trajectories = [b.traj for b in kept]
    stats = {
        "lines": ledger.lines,
        "steps_kept": ledger.kept,
        "trajectories": len(trajectories),
        "dropped": dict(sorted(ledger.dropped.items())),
    }
    report = {
        "shard": f"{i}/{n}",
        "verify_images": cfg.verify_images,
        "hswipe": cfg.hswipe,
        "platforms": list(cfg.platforms) if cfg.platforms is not None else None,
        "files": {k: _file_json(v) for k, v in sorted(files.items())},
        "scroll_sign": scroll,
        "skipped_entries": dict(sorted(skipped.items())),
        "images": dict(sorted(images.stats.items())),
        "outcomes": dict(sorted(Counter(t["outcome"] for t in trajectories).items())),
        "truncated": _truncated(kept),
        "duplicate_copies": copies,
        "run": _provenance(),
    }
    texts = {
        "trajectories.jsonl": dumps_jsonl(trajectories),
        "quarantine.jsonl": dumps_jsonl(e.to_json() for e in ledger.sorted_entries()),
        "report.json": json.dumps(report, indent=2) + "\n",
        "stats.json": json.dumps(stats, indent=2) + "\n",
    }
    # The marker goes first and last: a kill between the writes leaves no marker, so a rerun
    # (and `run`, which waits for it) never takes a half-written folder as complete.
    (out_dir / DONE_MARKER).unlink(missing_ok=True)
    for name, text in texts.items():
        write_atomic(out_dir / name, text)
    sizes = {name: len(text.encode("utf-8")) for name, text in texts.items()}
    write_atomic(out_dir / DONE_MARKER, json.dumps({"files": sizes}, indent=2) + "\n")
    return IngestResult(out_dir, stats, report)


DONE_MARKER = "ingest_done.json"
"""Written after every other output file of an ingest (names and byte sizes)."""


def ingest_complete(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` holds the complete output of one ingest (marker and every file)."""
    folder = Path(out_dir)
    try:
        files = json.loads((folder / DONE_MARKER).read_text(encoding="utf-8"))["files"]
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _provenance() -> dict[str, Any]:
    # Only what identifies the code: times and hosts would make reruns differ byte-wise.
    info = run_info()
    return {"hivig": info["packages"].get("hivig"), "git": info["git"]}


def _file_json(r: FileReport) -> dict[str, Any]:
    return {
        "lines": r.lines,
        "trajectories": r.trajectories,
        "scale": r.scale,
        "scale_tally": r.scale_tally,
        "scale_conflicts": r.scale_conflicts,
        "mixed_scale": r.mixed_scale,
        "flags": dict(sorted(r.flags.items())),
    }
