"""Typed configuration of the SFT recipe, built from the shared parts in ``hivig.config``.

YAML files under ``configs/train/`` hold values only; the command line adds dotlist overrides.
Two override names are stable for scripts: ``data=DIR`` (a data_gen output directory) and
``out=DIR`` (checkpoints and logs; the final checkpoint lands in ``DIR/final``)::

    python -m train --config configs/train/tiny_cpu.yaml data=runs/gen out=runs/tiny
    python -m train --config configs/train/qwen3vl_8b_full.yaml optim.lr=1e-5 --dry-run
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivig.config import ATTENTION_BACKENDS, ConfigError, FrameConfig

SCHEDULERS = ("cosine", "linear", "constant")
PACK_STRATEGIES = ("best_fit", "first_fit")
METRIC_SINKS = ("jsonl", "stdout", "tensorboard", "wandb", "null")
DTYPES = ("float32", "bfloat16", "float16")

RESUME_IGNORED_KEYS = (
    "data",
    "out",
    "loop.resume",
    "loop.resume_allow_changes",
    "loop.progress_bar",
    "loop.requeue_on_signal",
    "loop.peak_tflops_override",
    "dataset.num_workers",
    "dataset.prefetch_factor",
    "dataset.image_root",
    "metrics.sinks",
    "metrics.wandb_project",
)
"""Keys that never change what a run computes (paths may move between clusters, workers and
sinks are plumbing); a resume ignores their differences."""

RESUME_SAFE_KEYS = (
    "loop.max_steps",
    "loop.log_every_n_steps",
    "loop.eval_every_n_steps",
    "loop.eval_max_packs",
    "loop.eval_generate_samples",
    "loop.eval_max_new_tokens",
    "loop.save_every_n_steps",
    "loop.keep_last_checkpoints",
)
"""Keys a resume may change with ``loop.resume_allow_changes=true``: run length and cadence,
not the data, model or optimisation."""


@dataclass
class ModelConfig:
    """Which weights to start from and which parts of the model train."""

    path: str = ""
    """Checkpoint directory or Hugging Face model id (``Qwen/Qwen3-VL-8B-Thinking``, the HiViG
    paper's base; ``Qwen/Qwen3-VL-8B-Instruct`` also works). An id is read from the local HF
    cache, downloaded when missing and online. Must be set unless ``tiny`` is true."""
    tiny: bool = False
    """Train the tiny random-weight Qwen3-VL with the offline Qwen tokenizer instead of a
    checkpoint (CPU tests and the demo); ``path`` must then be empty."""
    tiny_seed: int = 0
    """Weight seed of the tiny random model (``tiny`` only)."""
    init_from: str = ""
    """Start this (new) run from an earlier run's weights: ``RUN/final`` (full weights or a LoRA
    adapter) or ``RUN/checkpoints/step_N`` (``state.pt``). The architecture still comes from
    ``path``/``tiny``; optimizer, schedule, step count and data plan start fresh. Not a resume
    (``loop.resume`` continues the same run); empty = the base weights."""
    dtype: str = "bfloat16"
    """Parameter dtype: float32, bfloat16 or float16. fp32 is for exact CPU tests."""
    attn_implementation: str = "auto"
    """Attention backend: ``auto`` (flash_attention_2 when flash-attn is installed on CUDA, else
    ``flex`` on CUDA, ``sdpa`` on CPU), ``flash_attention_2`` (extra ``hivig[flash-attn]``),
    ``flex`` (PyTorch flex attention with a per-sample block mask; no extra package), ``sdpa``
    or ``eager`` (dense L×L mask per packed row). Checked before any weights load."""
    gradient_checkpointing: bool = True
    """Recompute LLM layer activations in backward (non-reentrant); the frozen ViT never is."""
    checkpoint_layers: float = 1.0
    """Which LLM layers recompute when ``gradient_checkpointing`` is on: a fraction in (0, 1]
    (1.0 = all) or a layer count when > 1, spread evenly over the depth."""
    train_vit: bool = False
    """Train the vision blocks (patch_embed, pos_embed, blocks). HiViG: frozen."""
    train_merger: bool = True
    """Train the main 2x2 patch merger (the official 8B script trains it)."""
    train_deepstack: bool = False
    """Train the three DeepStack mergers (conservative default: frozen)."""
    train_llm: bool = True
    """Train the language model and ``lm_head``. Under LoRA the adapters on
    ``lora.target_modules`` train instead and this flag is not used; the other ``train_*`` flags
    must be false there (validation refuses them)."""


@dataclass
class LoraConfig:
    """Low-rank adapters through peft; when enabled, every base weight is frozen."""

    enabled: bool = False
    """Train LoRA adapters instead of a full fine-tune."""
    r: int = 64
    """Adapter rank (official Qwen recipe: 64)."""
    alpha: int = 128
    """Adapter scaling numerator; the effective scale is alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """Module name suffixes that get adapters (LLM attention only; the ViT uses qkv/proj)."""


@dataclass
class DatasetConfig:
    """Which samples are read and how they become packs."""

    train_split: str = "train"
    """Split read for training."""
    eval_split: str = "val"
    """Split read for held-out evaluation; missing means no evaluation."""
    history_fraction: float = -1.0
    """Fraction of history samples in the training mix, in [0, 1]; -1 keeps the natural mix."""
    token_budget: int = 16384
    """Packed row length per device, in LLM tokens (text + visual). Longer samples are dropped."""
    max_samples_per_pack: int = 0
    """Cap on samples per pack; 0 means no cap (the budget alone decides)."""
    pack_strategy: str = "best_fit"
    """``best_fit`` (best-fit-decreasing within a window) or ``first_fit`` (streaming, in order)."""
    pack_window: int = 1024
    """Samples considered together by best-fit; keeps the order mostly shuffled."""
    shuffle: bool = True
    """Shuffle samples each epoch with a seed derived from ``seed`` and the epoch."""
    num_workers: int = 4
    """Dataloader worker processes per device (image decoding and encoding run there)."""
    prefetch_factor: int = 2
    """Packs each worker prepares ahead."""
    image_root: str = ""
    """Directory that relative image paths resolve against; empty = the data's manifest (data_gen
    writes the corpus root there), else ``data``."""
    frame: FrameConfig = field(default_factory=FrameConfig)
    """Canonical frame for every screenshot (same values as data_gen and serve)."""
    max_samples: int = 0
    """Read at most this many records per split (0 = all); for smoke tests."""


@dataclass
class OptimConfig:
    """AdamW, cosine schedule and the optimizer-step size (HiViG paper defaults)."""

    lr: float = 5e-6
    """Peak LR of the LLM group. HiViG: 5e-6."""
    merger_lr: float = 0.0
    """Peak LR of the merger groups; 0 means ``lr``."""
    vit_lr: float = 2e-6
    """Peak LR of the ViT when trained (public anchors: 1e-6 to 2e-6)."""
    weight_decay: float = 0.0
    """Decoupled weight decay; never applied to biases and norm weights."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Global gradient clipping threshold; 0 disables clipping."""
    scheduler: str = "cosine"
    """``cosine``, ``linear`` (decay to zero) or ``constant`` after warmup."""
    warmup_ratio: float = 0.03
    """Fraction of optimizer steps spent in linear warmup, in [0, 1)."""
    min_lr_ratio: float = 0.0
    """Final LR as a fraction of the peak, for cosine/linear."""
    global_batch_samples: int = 256
    """Samples per optimizer step across ranks and micro-steps. HiViG: 256."""
    grad_accum: int = 0
    """Packs per rank per optimizer step; 0 derives it from ``global_batch_samples``."""
    fp32_grad_accum: bool = False
    """Accumulate gradients across micro-steps in fp32 under DeepSpeed bf16 (``data_types.
    grad_accum_dtype``): exact sums over many micro-steps, at 2x the gradient memory."""


@dataclass
class TrainLoopConfig:
    """Length of the run, cadence of logging, evaluation and checkpoints."""

    epochs: int = 1
    """Passes over the training split. HiViG: 1."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0 = run all epochs)."""
    seed: int = 1234
    """Seed for the data order and any sampling in the loop."""
    loss_chunk_tokens: int = 2048
    """Supervised positions per chunk of the chunked cross-entropy (bounds fp32 logits memory)."""
    log_every_n_steps: int = 1
    """Optimizer steps between metric records."""
    eval_every_n_steps: int = 0
    """Optimizer steps between held-out evaluations (0 = only at the end, if a split exists)."""
    eval_max_packs: int = 64
    """Held-out packs per evaluation, per rank."""
    eval_generate_samples: int = 0
    """Held-out critique samples scored by generation (verdict accuracy); 0 disables."""
    eval_max_new_tokens: int = 0
    """Generation budget per evaluated critique sample, in tokens; 0 = the longest held-out
    target plus 16 (the data decides, so no target is cut short)."""
    eval_generate_time_s: float = 300.0
    """Wall-clock cap of the final generation eval on each rank, in seconds (it runs after the
    final checkpoint is saved; a rank past the cap stops generating and reports what it scored).
    Keep it well under the process-group timeout (10 min for NCCL under DDP): the ranks that
    finish first wait that long in the final sum."""
    save_every_n_steps: int = 500
    """Optimizer steps between resumable checkpoints (0 = only on signal and at the end)."""
    keep_last_checkpoints: int = 2
    """Resumable checkpoints kept on disk; older ones are deleted."""
    resume: str = "auto"
    """``auto`` (latest checkpoint in ``out``, if any), ``never``, or a checkpoint directory.
    A checkpoint resumes only under the same data plan (samples, packing, seed, number of
    processes, accumulation) and the same run-defining config; otherwise the run stops with the
    differing keys named. Falls back to the previous checkpoint when the newest is incomplete."""
    resume_allow_changes: bool = False
    """Allow resuming with changed run-length and cadence keys (``RESUME_SAFE_KEYS``: max_steps,
    logging, evaluation and checkpoint cadence); other changes are always refused."""
    requeue_on_signal: bool = True
    """After a SIGUSR1 checkpoint inside SLURM, run ``scontrol requeue`` for this job."""
    peak_tflops_override: float = 0.0
    """Dense bf16 peak per device for MFU, in TFLOP/s; 0 looks it up from the GPU's name
    (``train.flops.PEAK_BF16_TFLOPS``: H100 SXM / H200 989, H100 NVL 835, H100 PCIe 756,
    A100 / A800 312). MFU is logged as null on CPU or an unlisted GPU unless this is set."""
    progress_bar: bool = True
    """Show a tqdm bar on rank 0."""
    ledger: bool = True
    """Append the sample ids of every step to ``out/ledger/rank_<r>.jsonl`` (audits data order)."""


@dataclass
class MetricsConfig:
    """Where per-step metrics go (rank 0 only)."""

    sinks: list[str] = field(default_factory=lambda: ["jsonl", "stdout"])
    """Any of jsonl, stdout, tensorboard, wandb, null. JSONL is always written."""
    wandb_project: str = "hivig"
    """W&B project name when ``wandb`` is a sink."""


@dataclass
class TrainConfig:
    """The whole SFT recipe; every field has a YAML value in ``configs/train/``."""

    data: str = ""
    """data_gen output directory (``dataset/records/<split>/*.parquet``); override ``data=``."""
    out: str = "outputs/train"
    """Output directory: checkpoints, logs, final HF checkpoint in ``out/final`` (``out=``)."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Splits, mixing and packing."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Weights and freezing."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Optional LoRA adapters."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    loop: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    """Run length and cadence."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Metric sinks."""

    def __post_init__(self) -> None:
        _validate(self)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate(cfg: TrainConfig) -> None:
    d, m, o, lp, lo = cfg.dataset, cfg.model, cfg.optim, cfg.loop, cfg.lora
    _check(bool(cfg.out), "`out` must name an output directory")
    _check(d.token_budget > 0, "`dataset.token_budget` must be positive (tokens per device)")
    _check(d.max_samples_per_pack >= 0, "`dataset.max_samples_per_pack` must be >= 0")
    _check(
        d.pack_strategy in PACK_STRATEGIES, f"`dataset.pack_strategy` must be in {PACK_STRATEGIES}"
    )
    _check(d.pack_window > 0, "`dataset.pack_window` must be positive")
    _check(d.num_workers >= 0, "`dataset.num_workers` must be >= 0")
    _check(d.prefetch_factor > 0, "`dataset.prefetch_factor` must be positive")
    _check(d.max_samples >= 0, "`dataset.max_samples` must be >= 0")
    hf = d.history_fraction
    _check(hf == -1.0 or 0.0 <= hf <= 1.0, "`dataset.history_fraction` must be -1 or in [0, 1]")
    _check(m.dtype in DTYPES, f"`model.dtype` must be one of {DTYPES}")
    _check(
        m.attn_implementation in ATTENTION_BACKENDS,
        f"`model.attn_implementation` must be one of {ATTENTION_BACKENDS}",
    )
    _check(m.checkpoint_layers > 0, "`model.checkpoint_layers` must be > 0 (fraction or count)")
    _check(
        not (m.tiny and m.path),
        "`model.tiny` is true and `model.path` is set: choose one (model.tiny=false to train "
        f"{m.path})",
    )
    _check(
        m.tiny or bool(m.path),
        "`model.path` is empty: pass model.path=DIR or a Hugging Face id such as "
        "Qwen/Qwen3-VL-8B-Thinking (or model.tiny=true for the tiny random test model)",
    )
    _check(o.lr > 0, "`optim.lr` must be positive")
    _check(o.merger_lr >= 0 and o.vit_lr >= 0, "`optim.merger_lr`/`optim.vit_lr` must be >= 0")
    _check(o.weight_decay >= 0, "`optim.weight_decay` must be >= 0")
    _check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "`optim.betas` needs 2 in [0,1)")
    _check(o.max_grad_norm >= 0, "`optim.max_grad_norm` must be >= 0")
    _check(o.scheduler in SCHEDULERS, f"`optim.scheduler` must be one of {SCHEDULERS}")
    _check(0 <= o.warmup_ratio < 1, "`optim.warmup_ratio` must be in [0, 1)")
    _check(0 <= o.min_lr_ratio <= 1, "`optim.min_lr_ratio` must be in [0, 1]")
    _check(o.global_batch_samples > 0, "`optim.global_batch_samples` must be positive")
    _check(o.grad_accum >= 0, "`optim.grad_accum` must be >= 0 (0 = derived)")
    _check(lp.epochs > 0, "`loop.epochs` must be positive")
    _check(lp.max_steps >= 0, "`loop.max_steps` must be >= 0")
    _check(lp.loss_chunk_tokens > 0, "`loop.loss_chunk_tokens` must be positive")
    _check(lp.log_every_n_steps > 0, "`loop.log_every_n_steps` must be positive")
    names = ("eval_every_n_steps", "save_every_n_steps", "eval_generate_samples")
    for name in (*names, "eval_max_new_tokens"):
        _check(getattr(lp, name) >= 0, f"`loop.{name}` must be >= 0")
    _check(lp.eval_max_packs > 0, "`loop.eval_max_packs` must be positive")
    _check(lp.eval_generate_time_s > 0, "`loop.eval_generate_time_s` must be positive")
    _check(lp.keep_last_checkpoints > 0, "`loop.keep_last_checkpoints` must be positive")
    _check(bool(lp.resume), "`loop.resume` must be auto, never or a checkpoint directory")
    _check(lp.peak_tflops_override >= 0, "`loop.peak_tflops_override` must be >= 0 (0 = lookup)")
    bad = [s for s in cfg.metrics.sinks if s not in METRIC_SINKS]
    _check(not bad, f"`metrics.sinks` has unknown entries {bad}; choose from {METRIC_SINKS}")
    if lo.enabled:
        # Under LoRA every base weight is frozen and only adapters train; a module-group flag
        # asking for more would be silently ignored, so it is an error instead.
        for name in ("train_vit", "train_merger", "train_deepstack"):
            _check(
                not getattr(m, name),
                f"`model.{name}` is true but LoRA trains adapters only: set model.{name}=false "
                "or run a full fine-tune (lora.enabled=false)",
            )
        _check(lo.r > 0 and lo.alpha > 0, "`lora.r` and `lora.alpha` must be positive")
        _check(0 <= lo.dropout < 1, "`lora.dropout` must be in [0, 1)")
        _check(bool(lo.target_modules), "`lora.target_modules` must not be empty")
    elif not (m.train_vit or m.train_merger or m.train_deepstack or m.train_llm):
        raise ConfigError("`model.train_*` freezes every group and LoRA is off: nothing to train")
