"""Resuming a run in its output folder: the folder's format, the config fingerprint, the
export's input digest.

A rerun with the same ``out`` resumes (``data_gen.executor``): it must write what the first
run would have written, so ``check_resume`` refuses a config whose output-changing fields
differ, and ``check_out`` a folder an older layout wrote. The export is redone only when its
inputs changed (``inputs_digest``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from data_gen.config import DataGenConfig
from data_gen.executor import Executor, Shard
from data_gen.steps.work import Work
from hivig.config import ConfigError, config_to_dict, config_to_yaml, load_config
from hivig.files import write_atomic
from hivig.profiles import resolve_profile

OPERATIONAL_FIELDS = (
    "out",
    "annotator.cache_dir",
    "annotator.cache_offline",
    "annotator.frame_cache_mb",
    "annotator.prefetch",
    "annotator.outage_wait_s",
    "annotator.prepare_threads",
    "annotator.backend.base_url",
    "annotator.backend.api_key_env",
    "annotator.backend.concurrency",
    "annotator.backend.timeout_s",
    "annotator.backend.max_retries",
    "annotator.backend.backoff_s",
)
"""Config fields that change how a run goes, never what it writes; a resume may change them."""

MERGE_ONLY_FIELDS = ("export.report_cards", "export.sharegpt", "export.max_tokens")
"""Fields read only by the merge; changing them on a resume just re-runs the export (the
export's input digest covers the whole config). ``export.val_share`` and ``test_share`` are not
among them: the split of every work item is fixed when the stages run."""


def resume_fingerprint(cfg: DataGenConfig) -> dict[str, Any]:
    """The config fields that determine the stage outputs, flattened to dotted keys."""
    skip = set(OPERATIONAL_FIELDS) | set(MERGE_ONLY_FIELDS)
    out = {k: v for k, v in _flatten(config_to_dict(cfg)).items() if k not in skip}
    if cfg.profile:
        # The folder's content decides the samples, not its path.
        out["profile"] = resolve_profile(cfg.profile).digest
    return out


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and not name.endswith("_weights"):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


OUTPUT_FORMAT = 2
"""Version of the layout of an output folder (work files, plan, markers). Version 1 folders
(no ``format.json``) were written before successful-only sampling and paired masking; their
work files do not resume under this code."""


def check_out(cfg: DataGenConfig) -> None:
    """Refuse an ``out`` that cannot be written, or that an older version wrote.

    Raises:
        ConfigError: Naming the folder and the fix.
    """
    out = Path(cfg.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create `out` folder {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"`out` folder {out} is not writable")
    marker = out / "format.json"
    if (out / "config.yaml").exists():
        try:
            found = json.loads(marker.read_text(encoding="utf-8")).get("format")
        except (OSError, ValueError, AttributeError):
            found = 1
        if found != OUTPUT_FORMAT:
            raise ConfigError(
                f"{out} was written by an older hivig (output format {found}, this one writes "
                f"{OUTPUT_FORMAT}); write to a new `out` (paid answers stay usable with "
                f"annotator.cache_dir={cfg.annotator.cache_dir or out / 'cache'})"
            )
    write_atomic(marker, json.dumps({"format": OUTPUT_FORMAT}) + "\n")


def check_resume(cfg: DataGenConfig) -> None:
    """Record the config in ``out/config.yaml``, refusing a resume that would change outputs.

    Only the fields of ``resume_fingerprint`` must match the recorded run: concurrency,
    timeouts, retries, the endpoint address and the cache location may change between reruns,
    and export options only re-run the merge. Shards of one array job write the same text
    atomically, so concurrent starts agree.

    Raises:
        ConfigError: An output-changing field differs; the message names the fields.
    """
    path, text = Path(cfg.out) / "config.yaml", config_to_yaml(cfg)
    if path.exists():
        before = resume_fingerprint(load_config(DataGenConfig, path))
        now = resume_fingerprint(cfg)
        changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        if changed:
            cache = Path(cfg.annotator.cache_dir or Path(cfg.out) / "cache")
            raise ConfigError(
                f"{cfg.out} holds a run with a different config ({', '.join(changed)} "
                "changed); write to a new `out`, keeping the paid annotator answers with "
                f"annotator.cache_dir={cache}"
            )
    write_atomic(path, text)


def inputs_digest(cfg: DataGenConfig, executor: Executor[Work], shards: list[Shard]) -> str:
    """Digest of everything the export reads: config, every stage's output and exclusions."""
    h = hashlib.sha256(config_to_yaml(cfg).encode("utf-8"))
    for shard in shards:
        for step in executor.steps:
            for path in (
                executor.marker_path(shard, step.name),
                executor.output_path(shard, step.name),
                executor.exclusion_path(shard, step.name),
            ):
                h.update(path.read_bytes())
    return h.hexdigest()
