"""Supervised fine-tuning of the Qwen3-VL critic: build → train → save, on accelerate + DeepSpeed.

CPU (tiny random model, about a minute)::

    python -m train --config configs/train/tiny_cpu.yaml data=runs/gen out=runs/tiny
    python -m train.sft --config configs/train/tiny_cpu.yaml data=runs/gen out=runs/tiny

Single node, 8 GPUs, DeepSpeed ZeRO-2::

    accelerate launch --config_file configs/accelerate/zero2.yaml -m train.sft \\
        --config configs/train/qwen3vl_8b_full.yaml data=$HIVIG_DATA_ROOT/gen out=$HIVIG_RUNS/8b

SLURM, several nodes (requeued on preemption, resumes with ``loop.resume=auto``)::

    sbatch --nodes 2 slurm/train.sbatch configs/train/qwen3vl_8b_full.yaml data=... out=...

The step follows ``qwen3vl_training.md``: padding-free packs with 4-row position ids (§8), loss
on supervised tokens only, summed and scaled by ``W / N`` with ``N`` the global supervised-token
count of the optimizer step (§10.2), chunked cross-entropy (§14).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.optim.lr_scheduler import LambdaLR

from hivig.config import config_to_dict, write_run_description
from hivig.distributed import rank_and_world
from hivig.logging import get_logger
from train import checkpoint as ckpt
from train.collate import PackedBatch
from train.config import TrainConfig
from train.data import (
    EpochPlan,
    Sample,
    TokenCounts,
    build_loader,
    derive_grad_accum,
    load_samples,
    mix_kinds,
    plan_epoch,
    rank_packs,
    step_supervised,
    token_counts,
)
from train.encode import RecordEncoder
from train.evaluate import evaluate_loss, verdict_accuracy
from train.flops import FlopShape, mfu, shape_from_config, step_flops
from train.loss import CriticLoss, normalise
from train.metrics import MetricLogger, build_metric_logger
from train.schedule import build_scheduler

log = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def _setup_accelerator(cfg: TrainConfig) -> Accelerator:
    accelerator = Accelerator()
    set_seed(cfg.loop.seed)
    return accelerator


def _is_deepspeed(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _setup_model(cfg: TrainConfig) -> tuple[torch.nn.Module, Any]:
    from hivig.models import qwen_vl

    m, frame = cfg.model, cfg.dataset.frame
    dtype = _DTYPES[m.dtype]
    processor = qwen_vl.build_processor(
        m.path or None, min_pixels=frame.min_pixels, max_pixels=frame.max_pixels
    )
    if m.path:
        model = qwen_vl.load_model(m.path, dtype=dtype, attn_implementation=m.attn_implementation)
    else:
        from hivig.testing import tiny_model

        model = tiny_model(processor, seed=m.tiny_seed).to(dtype)
        model.config.use_cache = False
    if cfg.lora.enabled:
        model = _apply_lora(cfg, model)
    else:
        qwen_vl.apply_freezing(
            model,
            train_vit=m.train_vit,
            train_merger=m.train_merger,
            train_deepstack=m.train_deepstack,
            train_llm=m.train_llm,
        )
    if m.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA) and is the 5.x default anyway.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, processor


def _apply_lora(cfg: TrainConfig, model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    lc = cfg.lora
    for p in model.parameters():
        p.requires_grad_(False)
    peft_cfg = LoraConfig(
        r=lc.r,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=list(lc.target_modules),
        bias="none",
    )
    return get_peft_model(model, peft_cfg)


def _check_inputs(cfg: TrainConfig) -> None:
    """Fail on missing inputs before any weights load."""
    if not cfg.data:
        raise ValueError("`data` is empty: pass data=DIR (a data_gen output directory)")
    split = Path(cfg.data) / "sft" / cfg.dataset.train_split
    if not split.is_dir():
        raise FileNotFoundError(f"`data`: no training split at {split}")
    if cfg.model.path and not Path(cfg.model.path).exists():
        raise FileNotFoundError(f"`model.path`: {cfg.model.path} does not exist")


def _setup_data(
    cfg: TrainConfig, processor: Any
) -> tuple[RecordEncoder, list[Sample], list[Sample], TokenCounts]:
    d = cfg.dataset
    encoder = RecordEncoder(processor, d.frame, root=d.image_root or cfg.data)
    samples = load_samples(cfg.data, d.train_split, d.max_samples)
    samples = mix_kinds(samples, d.history_fraction, cfg.loop.seed)
    if not samples:
        raise ValueError(f"no training records under {cfg.data}/sft/{d.train_split}")
    eval_samples = load_samples(cfg.data, d.eval_split, d.max_samples)
    counts = token_counts(
        samples,
        eval_samples,
        encoder,
        cache=Path(cfg.out) / "token_counts.json",
        key_context=(d.frame, processor.chat_template),
        workers=d.num_workers,
    )
    return encoder, samples, eval_samples, counts


def _setup_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    if cfg.lora.enabled:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": o.lr}]
    else:
        from hivig.models.qwen_vl import parameter_groups

        groups = parameter_groups(
            model,
            lr_llm=o.lr,
            lr_merger=o.merger_lr or o.lr,
            lr_vit=o.vit_lr,
            weight_decay=o.weight_decay,
        )
    for g in groups:
        g["initial_lr"] = g["lr"]
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, foreach=False)


def _configure_deepspeed(accelerator: Accelerator, cfg: TrainConfig, grad_accum: int) -> None:
    """Fill the DeepSpeed batch keys ourselves: accelerate would use its own (wrong on CPU) world.

    One packed row per micro-step, ``grad_accum`` micro-steps per optimizer step.
    """
    _, world = rank_and_world()
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = 1
    ds["gradient_accumulation_steps"] = grad_accum
    ds["train_batch_size"] = grad_accum * world
    ds["gradient_clipping"] = cfg.optim.max_grad_norm
    accelerator.gradient_accumulation_steps = grad_accum


def setup(cfg: TrainConfig) -> Components:
    """Build accelerator, model, data, optimizer, scheduler; restore a checkpoint if asked."""
    _check_inputs(cfg)
    if cfg.model.path:
        accelerator = _setup_accelerator(cfg)
        model, processor = _setup_model(cfg)  # under ZeRO-3: partitioned while loading
    else:
        # The tiny random model is built before the Accelerator: under ZeRO-3 accelerate makes
        # transformers partition modules at construction, which the random init cannot handle.
        model, processor = _setup_model(cfg)
        accelerator = _setup_accelerator(cfg)
    rank, world = rank_and_world()
    encoder, samples, eval_samples, counts = _setup_data(cfg, processor)
    lengths, quarantine = counts.lengths, counts.quarantine
    d = cfg.dataset
    plan0 = _plan(cfg, lengths, epoch=0, grad_accum=1)
    mean_per_pack = plan0.counts["samples"] / max(1, plan0.counts["packs"])
    grad_accum = derive_grad_accum(
        mean_per_pack, world, cfg.optim.global_batch_samples, cfg.optim.grad_accum
    )
    plan0 = _plan(cfg, lengths, epoch=0, grad_accum=grad_accum)
    if not plan0.steps:
        raise ValueError(
            f"no full optimizer step: {plan0.counts['packs']} packs < {world} ranks × "
            f"{grad_accum} micro-steps (token_budget {d.token_budget})"
        )
    total = len(plan0.steps) * cfg.loop.epochs
    total = min(total, cfg.loop.max_steps) if cfg.loop.max_steps else total
    optimizer = _setup_optimizer(cfg, model)
    is_main = rank == 0
    if is_main:
        write_run_description(cfg.out, cfg)
        quarantine.write(Path(cfg.out) / "quarantine.jsonl")
    log.info(
        "data: %d samples, plan %s, %d micro-steps/rank/step, %d steps",
        len(samples),
        plan0.counts | quarantine.counts(),
        grad_accum,
        total,
    )
    flop_shape = _flop_shape(cfg, model)
    # Under ZeRO-3 the head runs once per micro-step (see chunked_cross_entropy).
    chunk = 0 if _zero_stage(accelerator) == 3 else cfg.loop.loss_chunk_tokens
    loss_module = CriticLoss(model, chunk_tokens=chunk)
    if _is_deepspeed(accelerator):
        _configure_deepspeed(accelerator, cfg, grad_accum)
    else:
        # Accumulation is by hand: the loss is already scaled by W / N (§10.2).
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
        metrics=metrics,
    )
    resume_from = ckpt.resolve_resume(cfg.loop.resume, cfg.out)
    if resume_from is not None:
        comps.state = ckpt.load_checkpoint(
            resume_from, accelerator, loss_module, optimizer, scheduler
        )
    return comps


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


def _flop_shape(cfg: TrainConfig, model: torch.nn.Module) -> FlopShape:
    m = cfg.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return shape_from_config(
        base.config,
        llm_trained=m.train_llm and not cfg.lora.enabled,
        vit_trained=m.train_vit and not cfg.lora.enabled,
        merger_trained=m.train_merger and not cfg.lora.enabled,
        deepstack_trained=m.train_deepstack and not cfg.lora.enabled,
    )


# ------------------------------------------------------------------------------------------------
# The loop


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


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


def train(c: Components) -> TrainResult:
    """Run optimizer steps until the plan, ``loop.max_steps`` or a preemption signal ends it."""
    cfg, acc, model, state = c.cfg, c.accelerator, c.model, c.state
    rank, world = rank_and_world()
    G, device, ds = c.grad_accum, acc.device, _is_deepspeed(acc)
    # DeepSpeed divides by its GA unless told not to; accelerate's DDP path divides by G, which
    # the × G below cancels. Either way each micro-step contributes Σ CE × W / N (§10.2).
    backward_kwargs = {"scale_wrt_gas": False} if ds else {}
    undo_ga = 1.0 if ds else float(G)
    # accelerate keeps accumulation in a process-wide singleton: pin it to this run's G.
    acc.gradient_accumulation_steps = G
    signals = ckpt.PreemptionFlag()
    losses: list[float] = []
    total = c.total_steps
    bar = _progress(cfg, total, state.step, rank)
    ledger = _open_ledger(cfg, rank)
    preempted = False
    model.train()
    while state.step < total and state.epoch < cfg.loop.epochs:
        plan = c.plan0
        if state.epoch > 0:
            plan = _plan(cfg, c.lengths, epoch=state.epoch, grad_accum=G)
        packs = rank_packs(plan, rank, state.step_in_epoch)
        loader = _loader(c, packs)
        batches = iter(loader)
        while state.step_in_epoch < len(plan.steps) and state.step < total:
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
            grad_norm = _clip(acc, model, cfg.optim.max_grad_norm)
            if grad_norm is not None and not math.isfinite(grad_norm):
                raise FloatingPointError(
                    f"non-finite grad norm at step {state.step + 1}; "
                    f"samples {[i for b in micro for i in b.meta.sample_ids]}"
                )
            c.optimizer.step()
            c.scheduler.step()
            c.optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - t0
            row = _step_metrics(c, micro, loss_sum, n_global, grad_norm, wait, elapsed)
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
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.4f}")
            every = cfg.loop.eval_every_n_steps
            if every and state.step % every == 0:
                _run_eval(c)
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
    signals.restore()
    if bar is not None:
        bar.close()
    if ledger is not None:
        ledger.close()
    if preempted:
        _save(c)
        ckpt.requeue_slurm_job(cfg.loop.requeue_on_signal and signals.signum != 15)
        c.metrics.close()
        return TrainResult(state=state, losses=losses, preempted=True)
    _run_eval(c, final=True)
    _save(c)
    final_dir = save_final(c)
    c.metrics.close()
    return TrainResult(state=state, losses=losses, final_dir=final_dir)


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
    )


def _clip(acc: Accelerator, model: Any, max_norm: float) -> float | None:
    # Under DeepSpeed the engine clips (``gradient_clipping``) and this returns its norm.
    norm = acc.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    return None if norm is None else float(norm)


def _step_metrics(
    c: Components,
    micro: list[PackedBatch],
    loss_sum: torch.Tensor,
    n_global: int,
    grad_norm: float | None,
    wait: float,
    elapsed: float,
) -> dict[str, float]:
    _, world = rank_and_world()
    seq_lens = [n for b in micro for n in b.meta.seq_lens]
    patches = [p for b in micro for p in b.meta.image_patches]
    local = [
        float(loss_sum),
        float(sum(seq_lens)),
        float(len(seq_lens)),
        step_flops(c.flop_shape, seq_lens, patches, causal=True),
        step_flops(c.flop_shape, seq_lens, patches, causal=False),
        wait,
    ]
    loss, tokens, samples, fl_c, fl_nc, waits = _all_reduce_sum(local, c.accelerator.device)
    peak = c.cfg.loop.peak_tflops
    row = {
        "loss": loss / max(n_global, 1),
        "lr": c.scheduler.get_last_lr()[0],
        "grad_norm": float("nan") if grad_norm is None else grad_norm,
        "tokens": tokens,
        "samples": samples,
        "supervised_tokens": float(n_global),
        "tokens_per_s_per_device": tokens / elapsed / world,
        "samples_per_s": samples / elapsed,
        "mfu": mfu(fl_c, elapsed, world, peak),
        "mfu_non_causal": mfu(fl_nc, elapsed, world, peak),
        "dataloader_wait_frac": waits / world / elapsed,
        "step_time_s": elapsed,
    }
    if torch.cuda.is_available():
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def _progress(cfg: TrainConfig, total: int, start: int, rank: int) -> Any:
    if not cfg.loop.progress_bar or rank != 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)


def _run_eval(c: Components, final: bool = False) -> None:
    if not c.eval_samples:
        return
    cfg = c.cfg
    row: dict[str, float] = evaluate_loss(
        c.model,
        c.eval_samples,
        c.eval_lengths,
        c.encoder,
        budget=cfg.dataset.token_budget,
        max_packs=cfg.loop.eval_max_packs,
        device=c.accelerator.device,
    )
    if final and cfg.loop.eval_generate_samples and _zero_stage(c.accelerator) == 3:
        # Rank-0-only generation would wait forever for the other ranks' parameter shards.
        log.warning("generation eval skipped under ZeRO-3; evaluate out/final instead")
    elif final and cfg.loop.eval_generate_samples:
        row |= verdict_accuracy(
            c.accelerator.unwrap_model(c.model).model,
            c.processor,
            c.eval_samples,
            c.encoder,
            limit=cfg.loop.eval_generate_samples,
            max_new_tokens=cfg.loop.eval_max_new_tokens,
        )
    c.model.train()
    if row:
        c.metrics.log(row, c.state.step)


def _zero_stage(accelerator: Accelerator) -> int:
    if not _is_deepspeed(accelerator):
        return 0
    return int(accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"]["stage"])


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


def save_final(c: Components) -> Path:
    """Write ``out/final``: HF weights (or the LoRA adapter), processor and chat template."""
    return ckpt.export_final(
        Path(c.cfg.out) / "final", c.accelerator, c.model, c.processor, c.cfg, c.cfg.lora.enabled
    )


def run(cfg: TrainConfig) -> TrainResult:
    """Build everything and train: the whole recipe for one config."""
    components = setup(cfg)
    return train(components)


if __name__ == "__main__":
    from train._cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
