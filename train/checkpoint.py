"""Resumable checkpoints, preemption signals and the final Hugging Face export.

Layout under ``out/``::

    checkpoints/step_000040/   model + optimizer (DeepSpeed engine files or state.pt),
                               scheduler.pt, rng_<rank>.pt, trainer_state.json, config.yaml
    final/                     HF checkpoint (weights, processor, chat template, generation config)

A checkpoint is written into ``step_N.tmp`` and renamed by rank 0 after a barrier, so a job killed
mid-save never leaves a directory that ``resume=auto`` would pick up. ``manifest.json`` records
the size of every file; a checkpoint whose files do not match it (truncated by a full disk or a
killed copy) is skipped in favour of the previous one. A saved checkpoint is never rewritten.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hivig.checkpoint_files import write_reader_compat
from hivig.config import ConfigError, config_to_dict, write_run_description
from hivig.distributed import rank_and_world
from hivig.logging import get_logger
from hivig.profiles import CHECKPOINT_PROFILE_DIR
from hivig.records import read_profile, records_dir
from train.build import zero_stage
from train.metrics import all_reduce_sum
from train.signals import PreemptionFlag  # noqa: F401  (re-exported for the recipe)

log = get_logger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    """Where the loop is: enough to continue at the exact next micro-batch."""

    step: int = 0
    """Optimizer steps completed."""
    epoch: int = 0
    """Current epoch (0-based)."""
    step_in_epoch: int = 0
    """Optimizer steps completed within ``epoch``: the data position."""
    samples_seen: int = 0
    """Training samples consumed so far, all ranks."""
    tokens_seen: int = 0
    """Packed tokens consumed so far, all ranks."""
    world_size: int = 0
    """Ranks of the run that wrote the state; ``step_in_epoch`` counts steps of this many ranks."""
    grad_accum: int = 0
    """Packs per rank per optimizer step when the state was written."""
    plan_hash: str = ""
    """Fingerprint of the epoch-0 pack plan (``train.data.plan_fingerprint``)."""


def check_resumable(saved: TrainerState, current: TrainerState, path: str | Path) -> None:
    """Refuse to resume when the data position means something else in this run.

    ``step_in_epoch`` counts optimizer steps of a plan that depends on the samples, their
    token lengths, the packing settings, the seed, the world size and the accumulation. If any
    of them changed, skipping ``step_in_epoch`` steps would repeat or skip samples silently, so
    this raises instead of guessing.

    Raises:
        ConfigError: Naming every field that differs, with the saved and the current value.
    """
    fields = ("world_size", "grad_accum", "plan_hash")
    diff = [
        f"{f}: checkpoint {getattr(saved, f)!r}, this run {getattr(current, f)!r}"
        for f in fields
        if getattr(saved, f) != getattr(current, f)
    ]
    if diff:
        raise ConfigError(
            f"cannot resume from {path}: the data plan changed ({'; '.join(diff)}). Resume with "
            "the same data, packing settings, seed, number of processes and optim.grad_accum, "
            "or start a new run (loop.resume=never or another out=)"
        )


def barrier() -> None:
    """Synchronise ranks when running distributed; a no-op otherwise."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def checkpoint_dir(out: str | Path, step: int) -> Path:
    """``out/checkpoints/step_000123``."""
    return Path(out) / "checkpoints" / f"step_{step:06d}"


def resume_candidates(resume: str, out: str | Path) -> Iterator[Path]:
    """Complete checkpoints to try, newest first (one for an explicit path, none for never).

    Raises:
        ConfigError: An explicit ``loop.resume`` path that is not a complete checkpoint.
    """
    if resume == "never":
        return
    if resume != "auto":
        path = Path(resume)
        if not (path / "trainer_state.json").is_file():
            raise ConfigError(f"`loop.resume`: {path} is not a checkpoint directory")
        problem = incomplete_reason(path)
        if problem:
            raise ConfigError(f"`loop.resume`: {path} is incomplete ({problem})")
        yield path
        return
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return
    found = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))),
        reverse=True,
    )
    for _, path in found:
        problem = incomplete_reason(path)
        if problem is None:
            yield path
        else:
            log.warning("skipping checkpoint %s: %s; trying the previous one", path, problem)


_MANIFEST = "manifest.json"


def _write_manifest(directory: Path) -> None:
    files = {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    (directory / _MANIFEST).write_text(json.dumps(files, indent=1) + "\n")


def incomplete_reason(path: str | Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (a missing or truncated file), or ``None``."""
    path = Path(path)
    manifest = path / _MANIFEST
    if not manifest.is_file():
        return "no manifest.json"
    try:
        files = json.loads(manifest.read_text())
    except json.JSONDecodeError:
        return "unreadable manifest.json"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, {size} were written"
    return None


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out |= _flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: tree}


def check_resume_config(
    path: str | Path,
    cfg: Any,
    *,
    ignored: tuple[str, ...],
    safe: tuple[str, ...],
    allow_safe: bool,
) -> list[str]:
    """Refuse to resume a checkpoint whose run-defining config differs from this run's.

    Args:
        path: Checkpoint directory (holds the ``config.yaml`` it was trained with).
        cfg: This run's config dataclass.
        ignored: Keys that never matter (paths, workers, sinks).
        safe: Keys that may change when ``allow_safe`` (run length, cadence).
        allow_safe: ``loop.resume_allow_changes``.

    Returns:
        The changed safe keys that were allowed.

    Raises:
        ConfigError: Naming the changed keys with both values, and the way out.
    """
    import yaml

    saved_file = Path(path) / "config.yaml"
    if not saved_file.is_file():
        raise ConfigError(f"cannot resume from {path}: it has no config.yaml")
    from omegaconf import OmegaConf

    saved = yaml.safe_load(saved_file.read_text(encoding="utf-8")) or {}
    current = config_to_dict(cfg)
    flat_saved, flat_now = _flatten(saved), _flatten(current)
    # A key the checkpoint's version did not have yet counts as its default there.
    defaults = _flatten(OmegaConf.to_container(OmegaConf.structured(type(cfg))))
    for key in flat_now.keys() - flat_saved.keys():
        if key in defaults:
            flat_saved[key] = defaults[key]
    changed = [
        k
        for k in sorted(flat_saved.keys() | flat_now.keys())
        if k not in ignored and flat_saved.get(k, object()) != flat_now.get(k, object())
    ]
    unsafe = [k for k in changed if k not in safe]
    allowed = [k for k in changed if k in safe]

    def show(keys: list[str]) -> str:
        return "; ".join(f"{k}: {flat_saved.get(k)!r} -> {flat_now.get(k)!r}" for k in keys)

    if unsafe:
        raise ConfigError(
            f"cannot resume from {path}: the run-defining config changed ({show(unsafe)}). "
            "Resume with the checkpoint's config, or start a new run (another out= or "
            "loop.resume=never)"
        )
    if allowed and not allow_safe:
        raise ConfigError(
            f"cannot resume from {path}: config changed ({show(allowed)}); these keys may change "
            "on resume with loop.resume_allow_changes=true"
        )
    return allowed


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _engine(accelerator: Any) -> Any:
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return wrapped.engine if wrapped is not None else None


def save_checkpoint(
    out: str | Path,
    accelerator: Any,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    state: TrainerState,
    cfg: Any,
    keep_last: int,
) -> Path:
    """Write a resumable checkpoint of every rank's state; returns its final directory."""
    rank, _ = rank_and_world()
    final = checkpoint_dir(out, state.step)
    tmp = final.with_name(final.name + ".tmp")
    if incomplete_reason(final) is None:
        # Written by an earlier run (a resume that stops at the step it resumed from): its
        # weights and config.yaml describe that run and stay as they are.
        log.info("checkpoint %s exists; not rewriting it", final)
        return final
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    engine = _engine(accelerator)
    if engine is not None:
        # Every rank writes its own optimizer partition (ZeRO); the engine names the files.
        engine.save_checkpoint(str(tmp), tag="engine")
    elif rank == 0:
        unwrapped = accelerator.unwrap_model(model)
        payload = {"model": unwrapped.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(payload, tmp / "state.pt")
    torch.save(_rng_state(), tmp / f"rng_{rank}.pt")
    if rank == 0:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(asdict(state), indent=2) + "\n")
        write_run_description(tmp, cfg)
    barrier()
    if rank == 0:
        _write_manifest(tmp)
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of the same step
        tmp.rename(final)
        _prune(Path(out), keep_last)
        log.info("saved checkpoint %s", final)
    barrier()
    return final


def truncate_log(path: str | Path, step: int) -> int:
    """Drop rows with ``"step" > step`` from a JSONL log (replayed steps after a resume).

    Returns:
        Rows dropped (0 when the file does not exist).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row_step = json.loads(line).get("step", 0)
        except (json.JSONDecodeError, AttributeError):
            continue  # a half-written last line of a killed run
        if row_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) != len(lines):
        # In place, not by rename: a logger may already hold the file open in append mode,
        # and its next row must land in this file, after the kept ones.
        with path.open("r+", encoding="utf-8") as fh:
            fh.write("".join(kept))
            fh.truncate()
    return len(lines) - len(kept)


def _prune(out: Path, keep_last: int) -> None:
    root = out / "checkpoints"
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    complete = [(step, p) for step, p in found if incomplete_reason(p) is None]
    # Only complete checkpoints count towards keep_last: a truncated newest one must not push
    # out the last good one.
    for _, path in complete[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(
    path: str | Path,
    accelerator: Any,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    current: TrainerState | None = None,
) -> TrainerState:
    """Restore model, optimizer, scheduler, this rank's RNG and the loop position.

    Args:
        path: Checkpoint directory (``out/checkpoints/step_N``).
        accelerator: The run's ``Accelerator``.
        model: The prepared module.
        optimizer: The prepared optimizer.
        scheduler: The LR schedule.
        current: This run's plan identity (``world_size``, ``grad_accum``, ``plan_hash``);
            when given, a checkpoint written under a different plan is refused before any
            weights load (``check_resumable``).

    Raises:
        ValueError: The data plan differs from the checkpoint's.
        FileNotFoundError: DeepSpeed found no engine state in ``path``.
    """
    path = Path(path)
    rank, _ = rank_and_world()
    state = TrainerState(**json.loads((path / "trainer_state.json").read_text()))
    if current is not None:
        check_resumable(state, current, path)
    engine = _engine(accelerator)
    if engine is not None:
        loaded, _ = engine.load_checkpoint(str(path), tag="engine", load_lr_scheduler_states=False)
        if loaded is None:
            # DeepSpeed only logs a warning and returns (None, None) when the files are missing;
            # continuing would train fresh weights from the checkpoint's data position.
            raise FileNotFoundError(f"no DeepSpeed engine state under {path / 'engine'}")
    else:
        payload = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        accelerator.unwrap_model(model).load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = path / f"rng_{rank}.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    else:
        log.warning("no RNG state for rank %d in %s (world size changed?)", rank, path)
    log.info("resumed from %s at step %d", path, state.step)
    return state


def requeue_slurm_job(enabled: bool) -> None:
    """Ask SLURM to requeue this job (rank 0, only inside a SLURM job and when enabled)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not enabled or job is None or rank_and_world()[0] != 0:
        return
    try:
        # Every rank waits at the barrier behind this call: bound it.
        result = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("scontrol requeue %s failed: %s", job, e)
        return
    if result.returncode != 0:
        log.warning("scontrol requeue %s failed: %s", job, result.stderr.strip())
    else:
        log.info("requeued SLURM job %s", job)


def export_final(
    out: Path, accelerator: Any, model: torch.nn.Module, processor: Any, cfg: Any, lora: bool
) -> Path:
    """Save a standard Hugging Face checkpoint directory (what transformers and vLLM load).

    ``model`` is the prepared ``CriticLoss``; its ``.model`` is saved. Under ZeRO-3 the state dict
    is gathered to 16 bit first. LoRA runs save the adapter (merge with ``train merge-lora``).
    Training runs without the KV cache; the saved config and generation config turn it back on,
    since that is what inference needs.
    """

    rank0 = rank_and_world()[0] == 0
    # A collective under ZeRO-3 and FSDP (every rank gathers). With plain replicas only rank 0
    # reads it: each rank would copy the whole model to host memory (8 x 17.5 GB per node at 8B).
    collective = _state_dict_is_collective(accelerator)
    error: BaseException | None = None
    try:
        state_dict = accelerator.get_state_dict(model) if rank0 or collective else {}
        if rank0:
            _write_final(out, accelerator, model, processor, cfg, lora, state_dict)
    except Exception as e:  # noqa: BLE001 (re-raised below, after the other ranks know)
        error = e
    # The other ranks learn of a failure here instead of waiting in a barrier until the
    # process-group timeout.
    if not _all_ok(error is None, accelerator.device):
        raise error or RuntimeError("rank 0 could not write the final checkpoint (see its log)")
    return out


def _state_dict_is_collective(accelerator: Any) -> bool:
    """Whether ``get_state_dict`` must run on every rank (sharded or tensor-parallel weights)."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED:
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        tp = (ds.get("tensor_parallel") or {}).get("autotp_size", 0) or 0
        return zero_stage(accelerator) == 3 or int(tp) > 1
    sharded = {"FSDP", "MEGATRON_LM", "TP"}  # names differ across accelerate releases
    return kind.name in sharded


def _all_ok(ok: bool, device: Any) -> bool:
    """``ok`` on every rank (a sum of failures over the ranks; also their synchronisation point)."""
    return all_reduce_sum([0.0 if ok else 1.0], device)[0] == 0


def _write_final(
    out: Path,
    accelerator: Any,
    model: torch.nn.Module,
    processor: Any,
    cfg: Any,
    lora: bool,
    state_dict: dict[str, Any],
) -> None:
    from hivig.models.qwen_vl import set_use_cache

    inner = accelerator.unwrap_model(model).model
    _enable_cache(inner, set_use_cache)
    prefix = "model."
    weights = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    # The gathered weights in both cases: under ZeRO-3 the live parameters are partitions
    # (shape (0,) for every one above the persistence threshold), so a PEFT model saved from
    # them writes an empty adapter. PEFT picks the adapter keys out of the full dict.
    inner.save_pretrained(out, state_dict=weights, safe_serialization=True)
    if lora:
        _check_adapter(out)
    # Processor after the model, so the tokenizer files cannot overwrite the processor's.
    processor.save_pretrained(out)
    # The transformers-4.57 forms too: every vLLM before 0.19.1 reads only those.
    write_reader_compat(out)
    # The interface it learnt: serving it with another is refused (check_served_profile).
    read_profile(records_dir(cfg.data)).write(out / CHECKPOINT_PROFILE_DIR)
    write_run_description(out, cfg)
    log.info("final checkpoint in %s", out)


def _check_adapter(out: Path) -> None:
    """Refuse an adapter file holding an empty tensor (a partitioned, ungathered save)."""
    from safetensors import safe_open

    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as fh:
        empty = [k for k in fh.keys() if 0 in fh.get_slice(k).get_shape()]  # noqa: SIM118
    if empty:
        raise RuntimeError(
            f"{out}: {len(empty)} adapter tensors are empty (e.g. {empty[0]}): the LoRA weights "
            "were saved ungathered; set stage3_gather_16bit_weights_on_model_save in the "
            "DeepSpeed config"
        )


def _enable_cache(model: Any, set_use_cache: Any) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    set_use_cache(base, True)
    # The generation config was derived from the training config (cache off) when it was built.
    generation = getattr(base, "generation_config", None)
    if generation is not None:
        generation.use_cache = True
