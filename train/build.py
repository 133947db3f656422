"""Building blocks of the SFT recipe: accelerator, model, LoRA, optimizer, engine settings.

``train.sft.setup`` calls these in order; each is small and testable on its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from hivig.config import ConfigError
from hivig.distributed import rank_and_world
from hivig.logging import get_logger
from hivig.models.qwen_vl import (
    AttentionBackendError,
    ModelPathError,
    enable_activation_checkpointing,
    resolve_attention,
    resolve_model_path,
)
from hivig.profiles import Profile, ProfileError
from hivig.records import read_image_root, read_profile, records_dir
from train.config import TrainConfig
from train.data import Sample, TokenCounts, load_samples, mix_kinds, token_counts
from train.encode import RecordEncoder
from train.flops import FlopShape, shape_from_config
from train.init_from import (
    InitCheckpoint,
    check_architecture,
    load_adapter,
    load_state,
    resolve_init,
)

log = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_accelerator(cfg: TrainConfig) -> Accelerator:
    """The run's ``Accelerator`` (launcher settings from the environment), global seed set."""
    accelerator = Accelerator()
    set_seed(cfg.loop.seed)
    return accelerator


def is_deepspeed(accelerator: Accelerator) -> bool:
    """Whether the launch config chose DeepSpeed."""
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def zero_stage(accelerator: Accelerator) -> int:
    """DeepSpeed ZeRO stage, 0 without DeepSpeed."""
    if not is_deepspeed(accelerator):
        return 0
    return int(accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"]["stage"])


def check_precision(cfg: TrainConfig, accelerator: Accelerator) -> None:
    """Refuse a full fine-tune whose optimizer would update 16-bit weights in place.

    DeepSpeed keeps fp32 master weights for its bf16 mode and LoRA adapters are fp32, but a
    plain DDP/single-process run with ``model.dtype`` bfloat16 applies AdamW to bf16 weights:
    an update below half a bf16 ulp (lr 5e-6 against weights ~1e-2) rounds away.
    """
    if cfg.lora.enabled or is_deepspeed(accelerator) or cfg.model.dtype == "float32":
        return
    raise ConfigError(
        f"`model.dtype` is {cfg.model.dtype} for a full fine-tune without DeepSpeed (accelerate "
        f"mixed_precision={accelerator.mixed_precision!r}): AdamW would update 16-bit weights "
        "and lose small updates. Launch with a DeepSpeed config (configs/accelerate/zero2.yaml), "
        "use LoRA (lora.enabled=true), or set model.dtype=float32 (with accelerate "
        "mixed_precision bf16 for bf16 compute)"
    )


def resolve_inputs(cfg: TrainConfig) -> tuple[Path | None, str]:
    """The checkpoint directory (``None`` for the tiny model) and the attention backend.

    Runs before the Accelerator exists and before any GPU memory is touched: a misspelt model
    id or a missing flash-attn fails here, not minutes into a job that holds 8 GPUs.

    Raises:
        ConfigError: The model cannot be found or the backend cannot run here.
    """
    try:
        backend = resolve_attention(cfg.model.attn_implementation)
        path = None if cfg.model.tiny else resolve_model_path(cfg.model.path)
    except (AttentionBackendError, ModelPathError) as e:
        raise ConfigError(str(e)) from e
    log.info(
        "model %s, attention backend %s (model.attn_implementation=%s)",
        path or "tiny random Qwen3-VL",
        backend,
        cfg.model.attn_implementation,
    )
    return path, backend


def build_model(
    cfg: TrainConfig, path: Path | None = None, backend: str | None = None
) -> tuple[torch.nn.Module, Any]:
    """Processor and model (HF weights or the tiny random model), cache off, freezing or LoRA.

    Args:
        cfg: The run's config.
        path: Checkpoint directory from ``resolve_inputs``; ``None`` with ``model.tiny``.
        backend: Resolved attention backend; ``None`` resolves ``model.attn_implementation``.
    """
    from hivig.models import qwen_vl

    m, frame = cfg.model, cfg.dataset.frame
    dtype = _DTYPES[m.dtype]
    if backend is None:
        path, backend = resolve_inputs(cfg)
    init = resolve_init(cfg)
    if m.tiny:
        # The tiny random model and its offline (real Qwen) tokenizer are test fixtures: only an
        # explicit model.tiny=true reaches them.
        from hivig.tiny import tiny_config, tiny_model, tiny_processor

        processor = tiny_processor(min_pixels=frame.min_pixels, max_pixels=frame.max_pixels)
        if init is not None and init.kind == "full":
            check_architecture(init, tiny_config(processor).to_dict())
            model = _load_full(init, dtype, backend)
        else:
            model = tiny_model(processor, seed=m.tiny_seed).to(dtype)
            qwen_vl.set_attention(model, backend)
    else:
        processor = qwen_vl.build_processor(
            path, min_pixels=frame.min_pixels, max_pixels=frame.max_pixels
        )
        if init is not None and init.kind == "full":
            check_architecture(init, _json(path / "config.json"))
            # Loaded by from_pretrained itself, so ZeRO-3 partitions it while loading as it
            # would the base.
            model = _load_full(init, dtype, backend)
        else:
            model = qwen_vl.load_model(path, dtype=dtype, attn_implementation=backend)
    profile = data_profile(cfg)
    if not profile.is_default:
        # A profile's chat template is part of its interface (LlamaFactory's layout, say).
        processor.chat_template = profile.chat_template
    # Packed rows need the cache off (a cache object disables the packed-position path).
    qwen_vl.set_use_cache(model, False)
    if init is not None and init.kind == "adapter" and not cfg.lora.enabled:
        model = load_adapter(model, init, lora=False)
    if cfg.lora.enabled:
        model = _apply_lora(cfg, model)
    if init is not None and init.kind == "adapter" and cfg.lora.enabled:
        model = load_adapter(model, init, lora=True)
    if init is not None and init.kind == "state":
        load_state(model, init)
    if not cfg.lora.enabled:
        qwen_vl.apply_freezing(
            model,
            train_vit=m.train_vit,
            train_merger=m.train_merger,
            train_deepstack=m.train_deepstack,
            train_llm=m.train_llm,
        )
    if m.gradient_checkpointing:
        layers = enable_activation_checkpointing(model, m.checkpoint_layers)
        log.info("activation checkpointing on %d LLM layers", len(layers))
    return model, processor


def _json(path: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"`model.path`: unreadable {path} ({e})") from e


def _load_full(init: InitCheckpoint, dtype: torch.dtype, backend: str) -> torch.nn.Module:
    """A full checkpoint's model (weights and all), in training mode like a freshly built one."""
    from hivig.models import qwen_vl

    try:
        model = qwen_vl.load_model(init.path, dtype=dtype, attn_implementation=backend)
    except (OSError, ValueError) as e:
        raise ConfigError(f"`model.init_from`: {init.path} does not load ({e})") from e
    # from_pretrained returns eval mode; the base path trains with dropout where configured.
    return model.train()


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


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW over the parameter groups (or all adapter weights under LoRA), ``initial_lr`` set."""
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
    # foreach (multi-tensor) kernels on GPU; the per-parameter loop on CPU, where it is the
    # default anyway and keeps the fp32 invariance tests bit-stable.
    foreach = torch.cuda.is_available()
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, foreach=foreach)


def configure_deepspeed(accelerator: Accelerator, cfg: TrainConfig, grad_accum: int) -> None:
    """Fill the DeepSpeed batch keys ourselves: accelerate would use its own (wrong on CPU) world.

    One packed row per micro-step, ``grad_accum`` micro-steps per optimizer step.
    """
    _, world = rank_and_world()
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = 1
    ds["gradient_accumulation_steps"] = grad_accum
    ds["train_batch_size"] = grad_accum * world
    ds["gradient_clipping"] = cfg.optim.max_grad_norm
    if cfg.optim.fp32_grad_accum:
        # bf16 sums of many micro-step gradients lose low bits; fp32 buffers keep them.
        ds.setdefault("data_types", {})["grad_accum_dtype"] = "fp32"
    accelerator.gradient_accumulation_steps = grad_accum


def flop_shape(cfg: TrainConfig, model: torch.nn.Module) -> FlopShape:
    """FLOP-count shape of ``model`` with the multipliers of what this run trains."""
    m = cfg.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return shape_from_config(
        base.config,
        llm_trained=m.train_llm and not cfg.lora.enabled,
        vit_trained=m.train_vit and not cfg.lora.enabled,
        merger_trained=m.train_merger and not cfg.lora.enabled,
        deepstack_trained=m.train_deepstack and not cfg.lora.enabled,
    )


def check_inputs(cfg: TrainConfig) -> None:
    """Fail on missing inputs or an unwritable output before any weights load.

    Raises:
        ConfigError: One line naming the setting to fix.
    """
    if not cfg.data:
        raise ConfigError("`data` is empty: pass data=DIR (a data_gen output directory)")
    if not Path(cfg.data).is_dir():
        raise ConfigError(f"`data`: {cfg.data} is not a directory (a data_gen output?)")
    split = records_dir(cfg.data) / cfg.dataset.train_split
    if not split.is_dir():
        raise ConfigError(
            f"`data`: no training split at {split}; pass the folder data_gen wrote (data_gen "
            "run out=DIR) or set dataset.train_split"
        )
    _check_writable(Path(cfg.out))


def _check_writable(out: Path) -> None:
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"`out`: cannot write to {out} (check the path and its permissions)")


def image_root(cfg: TrainConfig) -> Path:
    """Where record image paths resolve: ``dataset.image_root``, the data's manifest, or data."""
    if cfg.dataset.image_root:
        return Path(cfg.dataset.image_root)
    return read_image_root(records_dir(cfg.data)) or Path(cfg.data)


def data_profile(cfg: TrainConfig) -> Profile:
    """The critic profile the training data was written in (recorded by data_gen's export).

    Raises:
        ConfigError: The recorded profile is incomplete or invalid.
    """
    try:
        return read_profile(records_dir(cfg.data))
    except ProfileError as e:
        raise ConfigError(f"`data`: {e}") from None


def build_data(
    cfg: TrainConfig, processor: Any
) -> tuple[RecordEncoder, list[Sample], list[Sample], TokenCounts]:
    """Encoder, training samples (mixed), held-out samples and their token counts (cached)."""
    d = cfg.dataset
    # The data's profile decides the pixels (its frame policy) as it decided the prompts.
    profile = data_profile(cfg)
    encoder = RecordEncoder(processor, d.frame, root=image_root(cfg), policy=profile.frame)
    samples = load_samples(cfg.data, d.train_split, d.max_samples)
    samples = mix_kinds(samples, d.history_fraction, cfg.loop.seed)
    if not samples:
        split = records_dir(cfg.data) / d.train_split
        raise ConfigError(f"`data`: no training records under {split}")
    eval_samples = load_samples(cfg.data, d.eval_split, d.max_samples)
    counts = token_counts(
        samples,
        eval_samples,
        encoder,
        cache=Path(cfg.out) / "token_counts.json",
        # The image root is part of the key: a corrected root must not reuse not-found results.
        key_context=(d.frame, processor.chat_template, str(encoder.root.resolve()), profile.digest),
        workers=d.num_workers,
    )
    return encoder, samples, eval_samples, counts
