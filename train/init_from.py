"""Start a new run from the weights of an earlier one (``model.init_from=DIR``).

A continued run is a *new* run: fresh optimizer, schedule, step counter and data plan (the next
round of flywheel data, say), only the weights come from ``DIR``. ``loop.resume`` is the other
thing: the *same* run picked up where it stopped. The architecture (and processor) still come
from ``model.path`` or ``model.tiny``; ``DIR`` must hold weights of that architecture.

What ``DIR`` may be, in the layouts ``train`` writes::

    RUN/final                 full fine-tune: config.json + model*.safetensors   -> "full"
    RUN/final                 LoRA run: adapter_config.json + adapter_model.*    -> "adapter"
    RUN/checkpoints/step_N    state.pt (single process or DDP)                   -> "state"

A LoRA adapter continues training as an adapter under ``lora.enabled=true`` (same rank, alpha
and target modules) and is merged into the base weights for a full fine-tune. DeepSpeed step
checkpoints hold sharded engine files; their run's ``RUN/final`` is the thing to continue from.
Every mismatch is a ``ConfigError`` raised before the optimizer exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hivig.config import ConfigError
from hivig.logging import get_logger
from train.config import TrainConfig

log = get_logger(__name__)

KINDS = ("full", "adapter", "state")

_STATE_PREFIX = "model."
"""``state.pt`` holds the ``CriticLoss`` wrapper's state dict: the model's keys under ``model.``."""

# The numbers that fix every weight's shape; two checkpoints that agree on them load into each
# other. Dtype, attention backend and cache flags are deliberately absent.
_ARCH_KEYS = (
    "model_type",
    "text_config.hidden_size",
    "text_config.num_hidden_layers",
    "text_config.num_attention_heads",
    "text_config.num_key_value_heads",
    "text_config.intermediate_size",
    "text_config.vocab_size",
    "vision_config.hidden_size",
    "vision_config.depth",
    "vision_config.out_hidden_size",
)


@dataclass(frozen=True)
class InitCheckpoint:
    """The checkpoint a run starts from, and what it holds."""

    path: Path
    kind: str
    """One of ``KINDS``."""


def _fail(path: str | Path, why: str) -> ConfigError:
    return ConfigError(f"`model.init_from`: {path} {why}")


def resolve_init(cfg: TrainConfig) -> InitCheckpoint | None:
    """What ``model.init_from`` names, checked before any weights load (``None`` when unset).

    Raises:
        ConfigError: The folder is missing, is not a checkpoint ``train`` wrote, or its LoRA
            settings differ from this run's.
    """
    raw = cfg.model.init_from
    if not raw:
        return None
    path = Path(raw)
    if not path.is_dir():
        raise _fail(path, "is not a directory; pass RUN/final or RUN/checkpoints/step_N")
    kind = _kind(path)
    if kind == "adapter" and cfg.lora.enabled:
        _check_lora_settings(path, cfg)
    if kind == "state" and _state_is_lora(path) and not cfg.lora.enabled:
        raise _fail(
            path,
            "is a LoRA run's step checkpoint: set lora.enabled=true with its lora settings, "
            "or start from that run's RUN/final (merged into the base for a full fine-tune)",
        )
    log.info("initialising the weights from %s (%s checkpoint)", path, kind)
    return InitCheckpoint(path, kind)


def _kind(path: Path) -> str:
    if (path / "adapter_config.json").is_file():
        return "adapter"
    if (path / "state.pt").is_file():
        return "state"
    if (path / "engine").is_dir():
        raise _fail(
            path,
            "is a DeepSpeed step checkpoint (sharded engine files); start from that run's "
            "RUN/final instead",
        )
    weights = (
        any(path.glob("model*.safetensors")) or (path / "model.safetensors.index.json").is_file()
    )
    if (path / "config.json").is_file() and weights:
        return "full"
    raise _fail(
        path,
        "holds no checkpoint train wrote (no adapter_config.json, state.pt or config.json with "
        "model*.safetensors); pass RUN/final or RUN/checkpoints/step_N",
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _fail(path.parent, f"has an unreadable {path.name} ({e})") from e
    if not isinstance(obj, dict):
        raise _fail(path.parent, f"has a {path.name} that is not a JSON object")
    return obj


def _check_lora_settings(path: Path, cfg: TrainConfig) -> None:
    saved = _read_json(path / "adapter_config.json")
    lo = cfg.lora
    targets = sorted(saved.get("target_modules") or [])
    pairs = {
        "lora.r": (saved.get("r"), lo.r),
        "lora.alpha": (saved.get("lora_alpha"), lo.alpha),
        "lora.target_modules": (targets, sorted(lo.target_modules)),
    }
    diff = [f"{k}: checkpoint {a!r}, this run {b!r}" for k, (a, b) in pairs.items() if a != b]
    if diff:
        raise _fail(path, f"is an adapter with other LoRA settings ({'; '.join(diff)}); match them")


def _state_keys(path: Path) -> dict[str, torch.Tensor]:
    try:
        payload = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 (any unreadable pickle is the same user-facing problem)
        raise _fail(path, f"has an unreadable state.pt ({type(e).__name__}: {e})") from e
    weights = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(weights, dict):
        raise _fail(path, "has a state.pt without model weights")
    return {k.removeprefix(_STATE_PREFIX): v for k, v in weights.items()}


def _state_is_lora(path: Path) -> bool:
    # Read the trainer's own record of the run rather than loading gigabytes of weights twice.
    saved = path / "config.yaml"
    if not saved.is_file():
        return False
    import yaml

    try:
        doc = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return False
    return bool((doc.get("lora") or {}).get("enabled"))


def _flat(obj: dict[str, Any], dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def check_architecture(init: InitCheckpoint, base: dict[str, Any]) -> None:
    """Refuse a full checkpoint whose shapes differ from the base model's config.

    Args:
        init: A ``full`` checkpoint.
        base: The base model's config as a dict (``config.to_dict()`` or its config.json).

    Raises:
        ConfigError: Naming each differing key with both values.
    """
    saved = _read_json(init.path / "config.json")
    diff = [
        f"{k}: checkpoint {_flat(saved, k)!r}, model {_flat(base, k)!r}"
        for k in _ARCH_KEYS
        if _flat(saved, k) != _flat(base, k)
    ]
    if diff:
        raise _fail(
            init.path,
            f"is another architecture than the model ({'; '.join(diff)}); set model.path (or "
            "model.tiny) to the base it was trained from",
        )


def load_state(model: torch.nn.Module, init: InitCheckpoint) -> None:
    """Copy a ``state.pt``'s weights into ``model`` (after LoRA is applied, when it is).

    Raises:
        ConfigError: Keys or shapes differ (another model size or other LoRA settings).
    """
    weights = _state_keys(init.path)
    own = model.state_dict()
    missing = sorted(own.keys() - weights.keys())
    extra = sorted(weights.keys() - own.keys())
    shapes = sorted(k for k in own.keys() & weights.keys() if own[k].shape != weights[k].shape)
    if missing or extra or shapes:
        parts = [
            f"{len(keys)} {what} (e.g. {keys[0]})"
            for what, keys in (("missing", missing), ("unexpected", extra), ("reshaped", shapes))
            if keys
        ]
        raise _fail(
            init.path,
            f"does not fit this model: {', '.join(parts)} weights; use a checkpoint of the same "
            "model and lora settings",
        )
    if any(getattr(p, "ds_id", None) is not None for p in model.parameters()):
        raise _fail(init.path, "is a state.pt, which cannot load into ZeRO-3 shards; use RUN/final")
    with torch.no_grad():
        model.load_state_dict(weights, strict=True)


def load_adapter(model: torch.nn.Module, init: InitCheckpoint, lora: bool) -> torch.nn.Module:
    """Continue a LoRA adapter (``lora`` true, ``model`` already a PEFT model) or merge it.

    Returns:
        The model to train: ``model`` with the adapter's weights, or the merged base model.

    Raises:
        ConfigError: The adapter's weights do not fit the model.
    """
    try:
        if lora:
            return _load_adapter_weights(model, init.path)
        from peft import PeftModel

        merged = PeftModel.from_pretrained(model, str(init.path)).merge_and_unload()
    except ConfigError:
        raise
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        raise _fail(init.path, f"does not fit this model ({_first_line(e)})") from e
    log.info("merged the adapter of %s into the base weights", init.path)
    return merged


def _load_adapter_weights(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = path / "adapter_model.safetensors"
    if not file.is_file():
        raise _fail(path, "has adapter_config.json but no adapter_model.safetensors")
    result = set_peft_model_state_dict(model, load_file(str(file)))
    # peft reports the adapter's keys the model has no slot for; silently skipping them would
    # continue from partly random adapters.
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise _fail(
            path, f"has {len(unexpected)} adapter weights this model lacks (e.g. {unexpected[0]})"
        )
    return model


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
