"""Freezing and optimizer parameter groups of Qwen3-VL (re-exported by ``qwen_vl``).

The groups follow the model's module tree: the vision tower, its
main merger, the DeepStack projectors, the language model and the output head.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hivig.logging import get_logger

logger = get_logger(__name__)

MODULE_GROUPS = ("vit", "merger", "deepstack", "llm", "lm_head")
"""Parameter groups for freezing and optimizer settings."""


def _group_modules(model: nn.Module) -> dict[str, list[nn.Module]]:
    core = model.model
    visual = core.visual
    vit = [
        m for name, m in visual.named_children() if name not in ("merger", "deepstack_merger_list")
    ]
    return {
        "vit": vit,
        "merger": [visual.merger],
        "deepstack": [visual.deepstack_merger_list],
        "llm": [core.language_model],
        "lm_head": [model.lm_head],
    }


def module_groups(model: nn.Module) -> dict[str, list[str]]:
    """Parameter names per group of ``MODULE_GROUPS``.

    ``vit`` is the vision tower without its mergers, ``merger`` the main 2x2 merger, ``deepstack``
    the DeepStack projectors, ``llm`` the language model (embeddings, layers, norm) and
    ``lm_head`` the output head. A head tied to the embeddings counts under ``llm`` only.

    Args:
        model: A ``Qwen3VLForConditionalGeneration`` (or MoE variant).

    Returns:
        Group name → parameter names as in ``model.named_parameters()``.

    Raises:
        ValueError: A parameter falls in no group (an unknown module), so nothing goes untracked.
    """
    name_of = {id(p): n for n, p in model.named_parameters()}
    groups: dict[str, list[str]] = {}
    seen: set[str] = set()
    for group, modules in _group_modules(model).items():
        names = [name_of[id(p)] for m in modules for p in m.parameters() if id(p) in name_of]
        names = [n for n in names if n not in seen]
        seen.update(names)
        groups[group] = names
    stray = sorted(set(name_of.values()) - seen)
    if stray:
        raise ValueError(f"parameters outside every group: {stray[:5]}")
    return groups


def apply_freezing(
    model: nn.Module,
    train_vit: bool = False,
    train_merger: bool = True,
    train_deepstack: bool = False,
    train_llm: bool = True,
    train_lm_head: bool | None = None,
) -> dict[str, int]:
    """Set ``requires_grad`` on every parameter by group.

    Flags go on parameters, not module attributes: setting ``module.requires_grad`` is a silent
    no-op that leaves the weights trainable.

    Args:
        model: A Qwen3-VL model (modified in place).
        train_vit: Train the vision tower (HiViG: frozen).
        train_merger: Train the main merger.
        train_deepstack: Train the DeepStack projectors (frozen by default, a conservative choice).
        train_llm: Train the language model.
        train_lm_head: Train the output head; ``None`` follows ``train_llm``.

    Returns:
        Trainable parameter count per group.
    """
    flags = {
        "vit": train_vit,
        "merger": train_merger,
        "deepstack": train_deepstack,
        "llm": train_llm,
        "lm_head": train_llm if train_lm_head is None else train_lm_head,
    }
    params = dict(model.named_parameters())
    counts = {}
    for group, names in module_groups(model).items():
        for name in names:
            params[name].requires_grad_(flags[group])
        counts[group] = sum(full_numel(params[n]) for n in names) if flags[group] else 0
    logger.info("trainable parameters per group: %s", counts)
    return counts


def full_shape(param: nn.Parameter) -> tuple[int, ...]:
    """A parameter's shape before ZeRO-3 partitioning (``ds_shape``), else its own.

    A partitioned parameter (``from_pretrained`` under ZeRO-3 init) is an empty 1-D tensor;
    its real shape is only in ``ds_shape``.
    """
    return tuple(getattr(param, "ds_shape", param.shape))


def full_numel(param: nn.Parameter) -> int:
    """A parameter's element count before ZeRO-3 partitioning (``ds_numel``), else its own."""
    return int(getattr(param, "ds_numel", param.numel()))


def _no_decay(name: str, param: nn.Parameter) -> bool:
    # Biases and norm scales are 1-D; decaying them only pulls them towards zero.
    return len(full_shape(param)) < 2 or name.endswith(".bias")


def parameter_groups(
    model: nn.Module,
    lr_llm: float,
    lr_merger: float,
    lr_vit: float,
    weight_decay: float,
) -> list[dict[str, Any]]:
    """AdamW parameter groups: one per module group and decay setting, trainable params only.

    The LLM and ``lm_head`` use ``lr_llm``; the merger and DeepStack projectors ``lr_merger``; the
    vision tower ``lr_vit``. Biases and norm weights get no weight decay.

    Args:
        model: A Qwen3-VL model after ``apply_freezing``.
        lr_llm: Peak learning rate of the language model and head.
        lr_merger: Peak learning rate of the mergers.
        lr_vit: Peak learning rate of the vision tower.
        weight_decay: Decoupled weight decay of matrices.

    Returns:
        Dicts with ``params``, ``lr``, ``weight_decay`` and a ``name`` for logging.

    Raises:
        ValueError: No parameter is trainable.
    """
    lrs = {"vit": lr_vit, "merger": lr_merger, "deepstack": lr_merger, "llm": lr_llm}
    lrs["lm_head"] = lr_llm
    params = dict(model.named_parameters())
    out = []
    for group, names in module_groups(model).items():
        trainable = [n for n in names if params[n].requires_grad]
        for suffix, wd in (("", weight_decay), ("_no_decay", 0.0)):
            chosen = [params[n] for n in trainable if _no_decay(n, params[n]) == bool(suffix)]
            if chosen:
                out.append(
                    {"name": group + suffix, "params": chosen, "lr": lrs[group], "weight_decay": wd}
                )
    if not out:
        raise ValueError("no trainable parameters; check the freezing flags")
    return out


def checkpointed_layers(num_layers: int, amount: float = 1.0) -> list[int]:
    """Indices of the LLM layers to recompute, spread evenly over the depth.

    Args:
        num_layers: Decoder layers of the LLM.
        amount: A fraction of the layers in (0, 1] (1.0 = all), or a layer count when > 1
            (rounded, at most ``num_layers``).

    Returns:
        Sorted layer indices.

    Raises:
        ValueError: ``amount`` is not positive.
    """
    if amount <= 0:
        raise ValueError(f"the checkpointed-layer amount must be positive, got {amount}")
    count = round(amount * num_layers) if amount <= 1 else round(amount)
    count = max(1, min(num_layers, count))
    # Evenly spaced: layer k * num_layers / count for k < count (all layers when count = n).
    return sorted({int(k * num_layers / count) for k in range(count)})


def enable_activation_checkpointing(model: nn.Module, layers: float = 1.0) -> list[int]:
    """Recompute activations in the backward pass, non-reentrant (works with frozen inputs).

    Selective checkpointing trades memory for speed: recomputing every layer costs about a
    third more compute per step, and an H200 (or a short pack) often fits the activations of
    half the layers. Newer transformers 5.x call this activation checkpointing and deprecate
    the gradient-checkpointing name; both names are handled.

    Args:
        model: A Qwen3-VL model (or peft wrapper).
        layers: ``checkpointed_layers`` amount: fraction in (0, 1] or a layer count.

    Returns:
        The LLM layer indices that recompute.
    """
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.model.language_model.layers
    chosen = checkpointed_layers(len(decoder), layers)
    for index, layer in enumerate(decoder):
        if index not in chosen:
            # GradientCheckpointingLayer reads this flag per call.
            layer.gradient_checkpointing = False
    return chosen
