"""Split trajectories into train/val/test by episode, deterministically for a seed.

    python -m data_gen split --in OUT/trajectories.jsonl --out SPLITS --seed 0

Whole episodes move together: every instruction variant and every file copy of an episode (same
``episode_key``) lands in the same split, so nothing of an episode leaks across splits. The
assignment depends only on the seed and the set of episode keys, never on input order: episodes
are ranked by a keyed hash and the first ``round(test·E)`` go to test, the next ``round(val·E)``
to val. ``data_gen run`` assigns its episodes by the same rule over the same keys, so with the
same shares and seed (``export.val_share``, ``export.test_share``, ``seed``) every episode lands in
the same split in both. Outputs ``SPLITS/{train,val,test}.jsonl`` (lines sorted by episode,
then trajectory), ``SPLITS/split_stats.json`` and ``SPLITS/quarantine.jsonl`` for unusable
input lines.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data_gen.quarantine import Ledger
from hivig.files import dumps_jsonl, split_lines, write_atomic

SPLITS = ("train", "val", "test")


class SplitError(ValueError):
    """Bad split options (fractions out of range) or an unreadable input file."""


@dataclass(frozen=True)
class SplitConfig:
    """Fractions of *episodes* held out, and the seed of the assignment."""

    val: float = 0.05
    """Share of episodes in val, in [0, 1)."""
    test: float = 0.05
    """Share of episodes in test, in [0, 1)."""
    seed: int = 0
    """Keys the episode ranking; same seed and episodes ⇒ same assignment."""

    def __post_init__(self) -> None:
        for name in ("val", "test"):
            if not 0 <= getattr(self, name) < 1:
                raise SplitError(f"`{name}` must be in [0, 1)")
        if self.val + self.test >= 1:
            raise SplitError("`val` + `test` must be < 1 so train is not empty")


def _rank(seed: int, key: str) -> bytes:
    return hashlib.blake2b(f"{seed}\n{key}".encode(), digest_size=16).digest()


def assign_episodes(keys: set[str], cfg: SplitConfig) -> dict[str, str]:
    """Episode key -> split name; a function of the seed and the key set only."""
    ranked = sorted(keys, key=lambda k: (_rank(cfg.seed, k), k))
    n_test, n_val = round(cfg.test * len(ranked)), round(cfg.val * len(ranked))
    out = {}
    for pos, key in enumerate(ranked):
        out[key] = "test" if pos < n_test else "val" if pos < n_test + n_val else "train"
    return out


def episode_keys(path: str | Path) -> set[str]:
    """The episode keys of a trajectories file, read as ``split`` reads them: every JSON line
    with a string ``episode_key`` (``data_gen run`` ranks the same set, so both assign every
    episode alike)."""
    keys: set[str] = set()
    for text in split_lines(Path(path).read_text(encoding="utf-8")):
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("episode_key"), str):
            keys.add(obj["episode_key"])
    return keys


def _sort_key(obj: dict, text: str) -> tuple:
    source = obj.get("source") if isinstance(obj.get("source"), dict) else {}
    return (obj["episode_key"], str(obj.get("id", "")), str(source.get("dataset", "")), text)


def split(
    inp: str | Path, out: str | Path, cfg: SplitConfig, progress: bool = False
) -> dict[str, Any]:
    """Split the trajectories of ``inp`` into ``out/{train,val,test}.jsonl``.

    Args:
        inp: A ``trajectories.jsonl`` written by ingest.
        out: Output folder.
        cfg: Fractions and seed.
        progress: Show a tqdm bar (stderr) while the lines are read.

    Returns:
        The stats written to ``split_stats.json``.

    Raises:
        SplitError: The input file cannot be read, or none of its lines is a trajectory.
    """
    try:
        lines = split_lines(Path(inp).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SplitError(f"cannot read {inp}: {exc}") from exc
    ledger = Ledger()
    rows: list[tuple[dict, str]] = []
    bar = tqdm(lines, desc="split", unit="line", unit_scale=True, disable=not progress)
    for n, text in enumerate(bar, 1):
        ledger.lines += 1
        try:
            obj = json.loads(text)
        except ValueError as exc:
            ledger.drop(str(inp), n, "bad_json", f"not JSON: {exc}")
            continue
        except RecursionError:
            ledger.drop(str(inp), n, "bad_json", "nesting deeper than the JSON recursion limit")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("episode_key"), str):
            ledger.drop(str(inp), n, "missing_episode_key", "line has no string episode_key")
            continue
        ledger.kept += 1
        rows.append((obj, text))
    ledger.check()
    if not rows:
        # Empty splits from a file that is not trajectories.jsonl would pass for a result.
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(ledger.dropped.items())) or "empty"
        raise SplitError(
            f"nothing usable in {inp}: {ledger.lines} of {ledger.lines} lines dropped "
            f"({reasons}); pass the trajectories.jsonl that `data_gen ingest` wrote"
        )
    where = assign_episodes({o["episode_key"] for o, _ in rows}, cfg)
    buckets: dict[str, list[tuple[dict, str]]] = defaultdict(list)
    for obj, text in rows:
        buckets[where[obj["episode_key"]]].append((obj, text))
    stats: dict[str, Any] = {
        "lines": ledger.lines,
        "dropped": dict(sorted(ledger.dropped.items())),
        "seed": cfg.seed,
        "val": cfg.val,
        "test": cfg.test,
        "splits": {},
    }
    for name in SPLITS:
        items = sorted(buckets[name], key=lambda r: _sort_key(*r))
        write_atomic(Path(out) / f"{name}.jsonl", "".join(t + "\n" for _, t in items))
        stats["splits"][name] = {
            "trajectories": len(items),
            "episodes": len({o["episode_key"] for o, _ in items}),
            "platforms": dict(sorted(Counter(str(o.get("platform")) for o, _ in items).items())),
        }
    write_atomic(
        Path(out) / "quarantine.jsonl", dumps_jsonl(e.to_json() for e in ledger.sorted_entries())
    )
    write_atomic(Path(out) / "split_stats.json", json.dumps(stats, indent=2) + "\n")
    return stats
