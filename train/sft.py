"""Supervised fine-tuning of the Qwen3-VL critic: build → train → save, on accelerate + DeepSpeed.

CPU (tiny random model with the real Qwen tokenizer, a few seconds per step)::

    python -m train --config configs/train/tiny_cpu.yaml data=runs/gen out=runs/tiny
    python -m train.sft --config configs/train/tiny_cpu.yaml data=runs/gen out=runs/tiny

Single node, 8 GPUs, DeepSpeed ZeRO-2::

    accelerate launch --config_file configs/accelerate/zero2.yaml -m train.sft \\
        --config configs/train/qwen3vl_8b_full.yaml data=$HIVIG_DATA_ROOT/gen out=$HIVIG_RUNS/8b

SLURM, several nodes (requeued on preemption, resumes with ``loop.resume=auto``)::

    sbatch --nodes 2 slurm/train.sbatch configs/train/qwen3vl_8b_full.yaml data=... out=...

The step: padding-free packs with 4-row position ids, loss
on supervised tokens only, summed and scaled by ``W / N`` with ``N`` the global supervised-token
count of the optimizer step, chunked cross-entropy.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LambdaLR

from hivig.config import (
    ConfigError,
    add_config_arguments,
    config_to_dict,
    config_to_yaml,
    load_config,
    write_run_description,
)
from hivig.distributed import rank_and_world
from hivig.logging import configure_logging, get_logger
from train import build
from train import checkpoint as ckpt
from train.collate import PackedBatch
from train.config import RESUME_IGNORED_KEYS, RESUME_SAFE_KEYS, TrainConfig
from train.data import (
    EpochPlan,
    Sample,
    build_loader,
    derive_grad_accum,
    plan_epoch,
    plan_fingerprint,
    quarantine_too_long,
    rank_packs,
    step_supervised,
)
from train.encode import RecordEncoder
from train.evaluate import evaluate_loss, verdict_accuracy
from train.flops import FlopShape, device_peak_tflops
from train.init_from import resolve_init
from train.loss import CriticLoss, normalise
from train.metrics import MetricLogger, build_metric_logger, step_metrics
from train.schedule import build_scheduler
from train.signals import EXIT_PREEMPTED, PreemptionFlag

log = get_logger(__name__)


@dataclass
class Components:
    """Everything ``train()`` needs, built by the ``_setup_*`` functions."""

    cfg: TrainConfig
    accelerator: Accelerator
    model: Any
    """``CriticLoss`` as prepared by accelerate (DDP/DeepSpeed engine or the module)."""
    processor: Any
    optimizer: Any
    scheduler: LambdaLR
    samples: list[Sample]
    eval_samples: list[Sample]
    encoder: RecordEncoder
    lengths: list[int]
    supervised: list[int]
    """Supervised labels per training sample; gives each step's normaliser ``N`` from the plan."""
    eval_lengths: list[int]
    grad_accum: int
    plan0: EpochPlan
    total_steps: int
    """Optimizer steps of the whole run (epochs × steps per epoch, capped by ``max_steps``)."""
    flop_shape: FlopShape
    peak_tflops: float | None
    """Per-device bf16 peak for MFU; ``None`` (MFU logged as null) when unknown."""
    metrics: MetricLogger
    state: ckpt.TrainerState = field(default_factory=ckpt.TrainerState)
    saved_step: int = -1
    """Step of the last resumable checkpoint written by this process."""


@dataclass
class TrainResult:
    """What a finished (or preempted) run returns."""

    state: ckpt.TrainerState
    losses: list[float]
    """Logged loss of every optimizer step run in this process."""
    preempted: bool = False
    final_dir: Path | None = None


# ------------------------------------------------------------------------------------------------
# Set-up


def setup(cfg: TrainConfig) -> Components:
    """Build accelerator, model, data, optimizer, scheduler; restore a checkpoint if asked."""
    build.check_inputs(cfg)
    # Before the Accelerator and any weights: a wrong model id, a missing attention package or
    # a resume into a changed config fails here with one line.
    path, backend = build.resolve_inputs(cfg)
    resolve_init(cfg)  # a wrong model.init_from fails here too, not after the weights load
    candidates = list(ckpt.resume_candidates(cfg.loop.resume, cfg.out))
    if candidates:
        ckpt.check_resume_config(
            candidates[0],
            cfg,
            ignored=RESUME_IGNORED_KEYS,
            safe=RESUME_SAFE_KEYS,
            allow_safe=cfg.loop.resume_allow_changes,
        )
    if not cfg.model.tiny:
        accelerator = build.build_accelerator(cfg)
        build.check_precision(cfg, accelerator)
        # Under ZeRO-3: partitioned while loading.
        model, processor = build.build_model(cfg, path, backend)
    else:
        # The tiny random model is built before the Accelerator: under ZeRO-3 accelerate makes
        # transformers partition modules at construction, which the random init cannot handle.
        model, processor = build.build_model(cfg, path, backend)
        accelerator = build.build_accelerator(cfg)
        build.check_precision(cfg, accelerator)
    rank, world = rank_and_world()
    encoder, samples, eval_samples, counts = build.build_data(cfg, processor)
    lengths, quarantine = counts.lengths, counts.quarantine
    plan0, grad_accum, total = _plan_run(cfg, lengths, world)
    quarantine_too_long(quarantine, samples, lengths, plan0, cfg.dataset.token_budget)
    optimizer = build.build_optimizer(cfg, model)
    is_main = rank == 0
    if is_main:
        # A resumed run keeps the description of the run that wrote the checkpoints (its config
        # was just checked against this one); a fresh run writes its own.
        if not candidates:
            write_run_description(cfg.out, cfg)
        quarantine.write(Path(cfg.out) / "quarantine.jsonl")
    log.info(
        "data: %d samples, plan %s, %d micro-steps/rank/step, %d steps",
        len(samples),
        quarantine.counts() | plan0.counts,
        grad_accum,
        total,
    )
    flop_shape = build.flop_shape(cfg, model)
    # ZeRO-3 gathers the head's weight per call: the ranks agree on the chunk count each step.
    zero3 = build.zero_stage(accelerator) == 3
    loss_module = CriticLoss(model, chunk_tokens=cfg.loop.loss_chunk_tokens, sync_chunks=zero3)
    if build.is_deepspeed(accelerator):
        build.configure_deepspeed(accelerator, cfg, grad_accum)
    else:
        # Accumulation is by hand: the loss is already scaled by W / N.
        accelerator.gradient_accumulation_steps = grad_accum
    loss_module, optimizer = accelerator.prepare(loss_module, optimizer)
    # After prepare, so the schedule wraps the optimizer whose ``step`` the loop calls.
    scheduler = build_scheduler(optimizer, cfg.optim, total)
    metrics = build_metric_logger(
        cfg.metrics.sinks,
        cfg.out,
        is_main=is_main,
        project=cfg.metrics.wandb_project,
        config=config_to_dict(cfg),
    )
    comps = Components(
        cfg=cfg,
        accelerator=accelerator,
        model=loss_module,
        processor=processor,
        optimizer=optimizer,
        scheduler=scheduler,
        samples=samples,
        eval_samples=eval_samples,
        encoder=encoder,
        lengths=lengths,
        supervised=counts.supervised,
        eval_lengths=counts.eval_lengths,
        grad_accum=grad_accum,
        plan0=plan0,
        total_steps=total,
        flop_shape=flop_shape,
        peak_tflops=_peak(cfg),
        metrics=metrics,
        # What the data position refers to; a checkpoint of another plan is refused.
        state=ckpt.TrainerState(
            world_size=world, grad_accum=grad_accum, plan_hash=plan_fingerprint(plan0)
        ),
    )
    if candidates:
        _resume(comps, candidates)
    return comps


def _resume(c: Components, candidates: list[Path]) -> None:
    """Restore the newest checkpoint that loads, and drop log rows of steps that will replay."""
    for k, path in enumerate(candidates):
        try:
            c.state = ckpt.load_checkpoint(
                path, c.accelerator, c.model, c.optimizer, c.scheduler, current=c.state
            )
            break
        except (OSError, EOFError, RuntimeError) as e:
            # A file that passed the size check but does not deserialise: try the previous one.
            if k + 1 == len(candidates):
                raise
            log.warning("cannot load %s (%s); trying %s", path, e, candidates[k + 1])
    # The checkpoint of this step exists: stopping right away must not rewrite it.
    c.saved_step = c.state.step
    rank, _ = rank_and_world()
    out = Path(c.cfg.out)
    dropped = ckpt.truncate_log(out / "ledger" / f"rank_{rank}.jsonl", c.state.step)
    if rank == 0:
        dropped += ckpt.truncate_log(out / "metrics.jsonl", c.state.step)
    if dropped:
        log.info("dropped %d log rows after step %d (they replay now)", dropped, c.state.step)


def _peak(cfg: TrainConfig) -> float | None:
    peak = device_peak_tflops(cfg.loop.peak_tflops_override)
    if peak is None:
        log.warning("MFU not reported: unknown peak FLOP/s; set loop.peak_tflops_override")
    return peak


def _plan_run(cfg: TrainConfig, lengths: list[int], world: int) -> tuple[EpochPlan, int, int]:
    """Epoch-0 plan, micro-steps per rank per step and the run's total optimizer steps."""
    plan0 = _plan(cfg, lengths, epoch=0, grad_accum=1)
    if not plan0.counts["packs"]:
        raise ConfigError(
            f"every one of the {len(lengths)} training samples is longer than "
            f"`dataset.token_budget`={cfg.dataset.token_budget} tokens (dropped as too_long); "
            "raise the budget"
        )
    mean_per_pack = plan0.counts["samples"] / max(1, plan0.counts["packs"])
    grad_accum = derive_grad_accum(
        mean_per_pack, world, cfg.optim.global_batch_samples, cfg.optim.grad_accum
    )
    plan0 = _plan(cfg, lengths, epoch=0, grad_accum=grad_accum)
    if not plan0.steps:
        raise ConfigError(
            f"no full optimizer step: {plan0.counts['packs']} packs < {world} ranks × "
            f"{grad_accum} micro-steps (token_budget {cfg.dataset.token_budget})"
        )
    total = len(plan0.steps) * cfg.loop.epochs
    total = min(total, cfg.loop.max_steps) if cfg.loop.max_steps else total
    return plan0, grad_accum, total


def _plan(cfg: TrainConfig, lengths: list[int], *, epoch: int, grad_accum: int) -> EpochPlan:
    d = cfg.dataset
    return plan_epoch(
        lengths,
        budget=d.token_budget,
        seed=cfg.loop.seed,
        epoch=epoch,
        world=rank_and_world()[1],
        grad_accum=grad_accum,
        shuffle=d.shuffle,
        strategy=d.pack_strategy,
        max_per_pack=d.max_samples_per_pack,
        window=d.pack_window,
    )


# ------------------------------------------------------------------------------------------------
# The loop


def _check_plan(micro: list[PackedBatch], planned: int, step: int) -> None:
    # The normaliser came from cached counts; a different encoding now would silently bias it.
    seen = sum(b.meta.supervised for b in micro)
    if seen != planned:
        ids = [i for b in micro for i in b.meta.sample_ids]
        raise RuntimeError(
            f"step {step + 1}: {seen} supervised tokens, the plan expected {planned} "
            f"(samples {ids}); delete out/token_counts.json if the data or processor changed"
        )


def _check_finite(value: torch.Tensor, what: str, step: int, batch: PackedBatch) -> None:
    if not torch.isfinite(value).all():
        raise FloatingPointError(
            f"non-finite {what} at step {step + 1}; samples {batch.meta.sample_ids}"
        )


StepHook = Callable[[ckpt.TrainerState], None]


def train(
    c: Components,
    *,
    signals: ckpt.PreemptionFlag | None = None,
    on_step: StepHook | None = None,
) -> TrainResult:
    """Run optimizer steps until the plan, ``loop.max_steps`` or a preemption signal ends it.

    Args:
        c: What ``setup`` built.
        signals: Preemption flag installed by the caller (the entry point installs it at process
            start, so an early SIGUSR1 is not fatal). ``None`` (library use, tests): no handler
            is installed, so the caller's own SIGTERM handling (a test runner's cancel) stays.
        on_step: Called after every optimizer step, before the preemption check.
    """
    signals = signals or ckpt.PreemptionFlag(signals=())
    try:
        return _train(c, signals, on_step)
    finally:
        # On every way out, errors included: a library caller gets its own handlers back.
        signals.restore()


def _train(c: Components, signals: ckpt.PreemptionFlag, on_step: StepHook | None) -> TrainResult:
    cfg, acc, model, state = c.cfg, c.accelerator, c.model, c.state
    rank, _ = rank_and_world()
    # accelerate keeps accumulation in a process-wide singleton: pin it to this run's G.
    acc.gradient_accumulation_steps = c.grad_accum
    losses: list[float] = []
    total = c.total_steps
    bar = _progress(cfg, total, state.step, rank)
    ledger = _open_ledger(cfg, rank)
    # A signal during set-up (minutes for 8B) is honoured before the first step.
    preempted = signals.should_stop()
    model.train()
    while not preempted and state.step < total and state.epoch < cfg.loop.epochs:
        plan = c.plan0
        if state.epoch > 0:
            plan = _plan(cfg, c.lengths, epoch=state.epoch, grad_accum=c.grad_accum)
        packs = rank_packs(plan, rank, state.step_in_epoch)
        loader = _loader(c, packs)
        batches = iter(loader)
        while state.step_in_epoch < len(plan.steps) and state.step < total:
            row, micro = _optimizer_step(c, plan, batches)
            state.step += 1
            state.step_in_epoch += 1
            state.samples_seen += int(row["samples"])
            state.tokens_seen += int(row["tokens"])
            losses.append(row["loss"])
            if ledger is not None:
                ids = [i for b in micro for i in b.meta.sample_ids]
                ledger.write(json.dumps({"step": state.step, "samples": ids}) + "\n")
                ledger.flush()
            if state.step % cfg.loop.log_every_n_steps == 0:
                c.metrics.log(row, state.step)
                if rank == 0:
                    _print_progress(row, state.step, total, bar)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.4f}")
            every = cfg.loop.eval_every_n_steps
            if every and state.step % every == 0:
                _run_eval(c)
            if on_step is not None:
                on_step(state)
            if signals.should_stop():
                preempted = True
                break
            if cfg.loop.save_every_n_steps and state.step % cfg.loop.save_every_n_steps == 0:
                _save(c)
        if preempted:
            break
        if state.step_in_epoch >= len(plan.steps):
            state.epoch += 1
            state.step_in_epoch = 0
    if bar is not None:
        bar.close()
    if ledger is not None:
        ledger.close()
    if preempted:
        # The handlers stay installed through the save: a second SIGTERM (SLURM repeats it)
        # is only recorded, never kills the checkpoint half-written.
        if state.step > 0:
            _save(c)
        # Rank 0 asks for the requeue before the barrier: no rank can exit (and make srun's
        # --kill-on-bad-exit end the job step) before the request is in. SLURM requeues a
        # preempted (SIGTERM) job itself; a time-limit warning needs asking.
        ckpt.requeue_slurm_job(cfg.loop.requeue_on_signal and signals.signum != signal.SIGTERM)
        ckpt.barrier()
        c.metrics.close()
        return TrainResult(state=state, losses=losses, preempted=True)
    # The final checkpoint first: a final eval that fails or lags cannot cost it.
    _save(c)
    final_dir = ckpt.export_final(
        Path(cfg.out) / "final", acc, model, c.processor, cfg, cfg.lora.enabled
    )
    # A signal now (SLURM's time-limit warning) ends the generation early on the rank it reaches.
    _run_eval(c, final=True, stop=lambda: signals.signum is not None)
    c.metrics.close()
    return TrainResult(state=state, losses=losses, final_dir=final_dir)


def _optimizer_step(
    c: Components, plan: EpochPlan, batches: Iterator[PackedBatch]
) -> tuple[dict[str, float | None], list[PackedBatch]]:
    """Run the ``grad_accum`` micro-steps of one optimizer step; returns its row and batches."""
    acc, model, state, G = c.accelerator, c.model, c.state, c.grad_accum
    rank, world = rank_and_world()
    device, ds = acc.device, build.is_deepspeed(acc)
    # DeepSpeed divides by its GA unless told not to; accelerate's DDP path divides by G, which
    # the × G below cancels. Either way each micro-step contributes Σ CE × W / N.
    backward_kwargs = {"scale_wrt_gas": False} if ds else {}
    undo_ga = 1.0 if ds else float(G)
    t0 = time.perf_counter()
    # N: supervised tokens of the whole step on all ranks, known from the plan, so the
    # micro-batches stream (no collective, no holding G packs in host memory).
    n_global, n_rank = step_supervised(plan, state.step_in_epoch, c.supervised)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    micro, wait = [], 0.0
    for _ in range(G):
        t_wait = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - t_wait
        micro.append(batch)
        batch = batch.to(device)
        with acc.accumulate(model):
            step_loss, _ = model(batch.inputs)
            _check_finite(step_loss, "loss", state.step, batch)
            scaled = normalise(step_loss, n_global, world) * undo_ga
            acc.backward(scaled, **backward_kwargs)
        loss_sum += step_loss.detach().double()
    _check_plan(micro, n_rank[rank], state.step)
    grad_norm = _clip(acc, model, c.cfg.optim.max_grad_norm)
    if grad_norm is not None and not math.isfinite(grad_norm):
        raise FloatingPointError(
            f"non-finite grad norm at step {state.step + 1}; "
            f"samples {[i for b in micro for i in b.meta.sample_ids]}"
        )
    c.optimizer.step()
    lr = c.scheduler.get_last_lr()[0]  # the LR this step used; step() moves to the next
    c.scheduler.step()
    c.optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - t0
    row = step_metrics(
        micro,
        loss_sum,
        n_global,
        world=world,
        device=device,
        flop_shape=c.flop_shape,
        peak_tflops=c.peak_tflops,
        lr=lr,
        grad_norm=grad_norm,
        wait=wait,
        elapsed=elapsed,
    )
    return row, micro


def progress_line(row: dict[str, float | None], step: int, total: int) -> str:
    """One human-readable line per logged step: loss, lr, grad norm, throughput, MFU, memory."""
    parts = [f"step {step}/{total}", f"loss {row['loss']:.4f}", f"lr {row['lr']:.3g}"]
    if row.get("grad_norm") is not None and math.isfinite(row["grad_norm"]):
        parts.append(f"grad_norm {row['grad_norm']:.3g}")
    parts.append(f"{row['tokens_per_s_per_device']:.0f} tok/s/device")
    parts.append(f"{row['step_time_s']:.2f} s/step")
    if row.get("mfu") is not None:
        parts.append(f"MFU {100 * row['mfu']:.1f}%")
    if row.get("peak_mem_gib") is not None:
        parts.append(f"peak {row['peak_mem_gib']:.1f} GiB")
    return " | ".join(parts)


def _print_progress(row: dict[str, float | None], step: int, total: int, bar: Any) -> None:
    line = progress_line(row, step, total)
    if bar is not None:
        bar.write(line)  # above the bar, which keeps its own line
    else:
        _emit(line)


def _open_ledger(cfg: TrainConfig, rank: int) -> TextIO | None:
    if not cfg.loop.ledger:
        return None
    path = Path(cfg.out) / "ledger" / f"rank_{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a", encoding="utf-8")


def _loader(c: Components, packs: list[list[int]]) -> Any:
    d = c.cfg.dataset
    return build_loader(
        c.samples,
        packs,
        c.encoder,
        num_workers=d.num_workers,
        prefetch_factor=d.prefetch_factor,
        pin_memory=torch.cuda.is_available(),
        seed=c.cfg.loop.seed * 1_000_003 + c.state.epoch,
        # The ViT casts pixels to its own dtype: bf16 from the workers on is the same numbers
        # at half the shared memory (about 100 MB instead of 200 MB per 8B pack).
        pixel_dtype=_vision_dtype(c),
    )


def _vision_dtype(c: Components) -> torch.dtype:
    inner = c.accelerator.unwrap_model(c.model).model
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return next(base.model.visual.parameters()).dtype


def _clip(acc: Accelerator, model: Any, max_norm: float) -> float | None:
    # Under DeepSpeed the engine clips (``gradient_clipping``) and this returns its norm.
    norm = acc.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    return None if norm is None else float(norm)


def _progress(cfg: TrainConfig, total: int, start: int, rank: int) -> Any:
    if not cfg.loop.progress_bar or rank != 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)


def _run_eval(c: Components, final: bool = False, stop: Callable[[], bool] | None = None) -> None:
    """Held-out loss and, at the end, verdict accuracy by generation (``loop.eval_*``)."""
    if not c.eval_samples:
        return
    lp = c.cfg.loop
    row = evaluate_loss(
        c.model,
        c.eval_samples,
        c.eval_lengths,
        c.encoder,
        budget=c.cfg.dataset.token_budget,
        max_packs=lp.eval_max_packs,
        device=c.accelerator.device,
    )
    generate = lp.eval_generate_samples if final else 0
    if generate and build.zero_stage(c.accelerator) == 3:
        # Rank-0-only generation would wait forever for the other ranks' parameter shards.
        log.warning("generation eval skipped under ZeRO-3; evaluate out/final instead")
    elif generate:
        row |= verdict_accuracy(
            c.accelerator.unwrap_model(c.model).model,
            c.processor,
            c.eval_samples,
            c.encoder,
            limit=generate,
            max_new_tokens=lp.eval_max_new_tokens,
            time_limit_s=lp.eval_generate_time_s,
            stop=stop,
        )
    c.metrics.log(row, c.state.step)


def _save(c: Components) -> None:
    if c.saved_step == c.state.step:
        return
    c.saved_step = c.state.step
    ckpt.save_checkpoint(
        c.cfg.out,
        c.accelerator,
        c.model,
        c.optimizer,
        c.scheduler,
        c.state,
        c.cfg,
        c.cfg.loop.keep_last_checkpoints,
    )


def run(cfg: TrainConfig, signals: PreemptionFlag | None = None) -> TrainResult:
    """Build everything and train: the whole recipe for one config.

    Args:
        cfg: The resolved config.
        signals: The preemption flag the entry point installed at process start (before the
            set-up: a SIGUSR1/SIGTERM during its minutes then stops the run at its first step
            boundary instead of killing the process); ``None`` installs no handler.
    """
    signals = signals or PreemptionFlag(signals=())
    try:
        components = setup(cfg)
    except BaseException:
        signals.restore()
        raise
    return train(components, signals=signals)


def _emit(text: str, err: bool = False) -> None:
    # The entry point talks to the person at the terminal (library code logs instead).
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def main(argv: list[str] | None = None, signals: PreemptionFlag | None = None) -> int:
    """``python -m train.sft --config FILE [key=value ...]``: 0 done, 2 user error, 75 preempted."""
    signals = signals or PreemptionFlag()
    try:
        return _main(argv, signals)
    finally:
        # Whatever the outcome (a user error returns early): an in-process caller gets its own
        # handlers back.
        signals.restore()


def _main(argv: list[str] | None, signals: PreemptionFlag) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m train",
        description="Supervised fine-tuning of the Qwen3-VL critic.",
        epilog="Other commands: `python -m train merge-lora --adapter DIR --out DIR` merges "
        "LoRA adapters; `python -m train evaluate ...` runs the offline critic benchmark.",
    )
    add_config_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging()
    if args.config is None:
        _emit(
            "error: pass --config FILE.yaml (configs/train/tiny_cpu.yaml on CPU, "
            "configs/train/qwen3vl_8b_full.yaml for the 8B recipe; -h for help)",
            err=True,
        )
        return 2
    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
        if args.dry_run:
            sys.stdout.write(config_to_yaml(cfg))
            return 0
        result = run(cfg, signals)
    except ConfigError as e:
        _emit(f"error: {e}", err=True)
        return 2
    if result.preempted:
        _emit(
            f"preempted at step {result.state.step}: checkpoint in {cfg.out}/checkpoints; "
            f"rerun the same command to resume (exit {EXIT_PREEMPTED})"
        )
        return EXIT_PREEMPTED
    _emit(f"finished at step {result.state.step}: {result.final_dir}")
    _emit(f"metrics: {Path(cfg.out) / 'metrics.jsonl'} (one JSON row per logged step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
