"""The records to score: where they are, which split, where their images resolve, how many."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from hivig.records import RecordError, SFTRecord, read_image_root, read_records, records_dir
from train.critic_eval.config import CriticEvalError


def load_eval_records(
    data: str | os.PathLike[str], split: str = "", image_root: str | os.PathLike[str] = ""
) -> tuple[list[SFTRecord], Path, str]:
    """Read the records to score and where their image paths resolve.

    Args:
        data: A data_gen output folder, its records folder (one sub-folder per split), a folder
            of ``part-*.parquet`` shards or a single shard.
        split: Split to keep. Empty: ``test`` for folders with split sub-folders, and every
            record of a shard folder or file. Given with a shard folder: records whose ``split``
            field matches.
        image_root: Override of the image root; empty: the manifest next to the records (in
            the folder or up to two levels above), else the folder itself.

    Returns:
        ``(records, image_root, split)``, ``split`` as resolved (``""``: every record).

    Raises:
        CriticEvalError: The path is missing, holds no shards, or the split has no records.
    """
    src = Path(data)
    if not src.exists():
        raise CriticEvalError(f"--data {src}: no such file or folder (pass a data_gen output)")
    if src.is_dir() and not any(src.glob("part-*.parquet")):
        root = _records_root(src)
        chosen = split or "test"
        shard_dir = root / chosen
        if not shard_dir.is_dir():
            have = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            raise CriticEvalError(
                f"--data {src}: no '{chosen}' split folder under {root} (found: "
                f"{', '.join(have) or 'none'}); pass a data_gen output folder or --split"
            )
        records = _read(shard_dir)
        manifest_dirs = [root]
    else:
        chosen = split
        records = _read(src)
        if split:
            records = [r for r in records if r.split == split]
        base = src if src.is_dir() else src.parent
        manifest_dirs = [base, base.parent, base.parent.parent]
    if not records:
        where = f"split '{chosen}' of {src}" if chosen else str(src)
        raise CriticEvalError(f"--data: no records in {where}; pick another --split")
    return records, _image_root(image_root, manifest_dirs), chosen


def _records_root(path: Path) -> Path:
    """The folder holding the split sub-folders (and the manifest) for a data path."""
    nested = records_dir(path)
    return nested if nested.is_dir() else path


def _read(path: Path) -> list[SFTRecord]:
    try:
        return read_records(path)
    except RecordError as e:
        raise CriticEvalError(f"--data: {e}") from e


def _image_root(override: str | os.PathLike[str], candidates: Sequence[Path]) -> Path:
    if override:
        return Path(override)
    for folder in candidates:
        try:
            root = read_image_root(folder)
        except RecordError as e:
            raise CriticEvalError(f"--data: {e}") from e
        if root is not None:
            return root
    return candidates[0]


def select_records(records: Sequence[SFTRecord], limit: int) -> list[SFTRecord]:
    """At most ``limit`` records (0: all), taking critique and history samples in turn.

    Alternating keeps both tasks represented when a small limit meets records grouped by
    trajectory; within a kind the stored order is kept, so the choice is deterministic.
    """
    if limit <= 0 or limit >= len(records):
        return list(records)
    queues = {kind: deque(r for r in records if r.kind == kind) for kind in ("critique", "history")}
    chosen: list[SFTRecord] = []
    while len(chosen) < limit and any(queues.values()):
        for kind in ("critique", "history"):
            if queues[kind] and len(chosen) < limit:
                chosen.append(queues[kind].popleft())
    return chosen
