"""The merge: once every shard has finished, one process exports the dataset.

    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --merge --shard 0/8

The last shard to finish merges (any shard may try: the ones that find a shard unfinished or
another process merging return ``None``), and a merge whose inputs did not change since the
last export does nothing (``data_gen.resume.inputs_digest``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_gen.annotator import Annotator
from data_gen.config import DataGenConfig
from data_gen.executor import Executor, Shard, merge_counts, summary_table
from data_gen.export import export_dataset
from data_gen.perturb.plan import target_shares
from data_gen.resume import inputs_digest
from data_gen.steps.work import Work
from hivig.files import write_atomic
from hivig.locks import file_lock
from hivig.logging import get_logger

log = get_logger(__name__)


def merge(
    cfg: DataGenConfig,
    executor: Executor[Work],
    count: int,
    annotator: Annotator,
    input_quarantined: int = 0,
) -> dict[str, Any] | None:
    """Export the dataset once every shard of ``count`` is complete; ``None`` if not yet."""
    shards = [Shard(i, count) for i in range(count)]
    if not all(executor.is_done(s) for s in shards):
        missing = [s.name for s in shards if not executor.is_done(s)]
        log.info("not merging yet: %d shards unfinished (%s ...)", len(missing), missing[0])
        return None
    with file_lock(Path(cfg.out) / "merge.lock") as held:
        if not held:
            log.info("another process is merging")
            return None
        digest = inputs_digest(cfg, executor, shards)
        marker, dataset = Path(cfg.out) / "completions" / "export.json", Path(cfg.out) / "dataset"
        done = marker.exists() and (dataset / "stats.json").exists()
        if done and json.loads(marker.read_text(encoding="utf-8")).get("inputs") == digest:
            log.info("export is up to date with every shard's output; nothing to do")
            return json.loads((dataset / "stats.json").read_text(encoding="utf-8"))
        works = sorted((w for s in shards for w in executor.load_output(s)), key=lambda w: w.id)
        per_shard = [executor.load_counters(s) for s in shards]
        counters = {
            step.name: merge_counts(c.get(step.name, {}) for c in per_shard)
            for step in executor.steps
        }
        run = {
            "annotator": annotator.describe(),
            "input_trajectories_quarantined": input_quarantined,
            "configured": {
                "critique_intent_mask_rate": cfg.rationale.intent_mask_rate,
                "history_intent_mask_rate": cfg.history.intent_mask_rate,
                "min_dimension_share": cfg.perturb.min_share,
                "dimension_target_shares": target_shares(
                    cfg.perturb.weights_by_name(), cfg.perturb.min_share
                ),
            },
        }
        stats = export_dataset(cfg, works, counters, executor.merged_exclusions(shards), run)
        write_atomic(marker, json.dumps({"inputs": digest}) + "\n")
        log.info(
            "dataset written to %s\n%s", Path(cfg.out) / "dataset", summary_table(stats["stages"])
        )
        return stats
