"""Typed dataclass configs with YAML values and dotlist overrides, plus run descriptions.

Each stage's config is a nested dataclass in that stage (``train/config.py`` ...) assembled from
the shared parts here. YAML files hold values only; the command line adds ``key.sub=value``
overrides, merged with type checking by OmegaConf. Cross-field rules live in ``__post_init__``
and name the offending field.

Typical entry point::

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args()
    cfg = load_config(TrainConfig, args.config, args.overrides)

and, with ``--dry-run``, the entry point shows ``config_to_yaml(cfg)`` and stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Packages whose versions every run records next to its outputs.
RECORDED_PACKAGES = (
    "hivig",
    "torch",
    "torchvision",
    "transformers",
    "accelerate",
    "deepspeed",
    "peft",
    "datasets",
    "vllm",
)


ATTENTION_BACKENDS = ("auto", "flash_attention_2", "flex", "sdpa", "eager")
"""Values of an attention setting (``hivig.models.qwen_vl.resolve_attention``); here so configs
validate them without importing torch."""


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


# --------------------------------------------------------------------------------------------
# Shared config parts


@dataclass
class FrameConfig:
    """The canonical frame every screenshot is resized to."""

    max_pixels: int = 1_048_576
    """Upper bound on frame area, in pixels (not edge length); 1,048,576 px ≈ 1,024 tokens."""
    min_pixels: int = 65_536
    """Lower bound on frame area, in pixels; 65,536 px = 64 visual tokens."""
    factor: int = 32
    """Both sides become multiples of this, in pixels: ViT patch 16 × spatial merge 2."""

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ConfigError("`frame.factor` must be positive")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ConfigError("`frame.min_pixels` must be in (0, frame.max_pixels]")


@dataclass
class SamplingConfig:
    """Sampling parameters sent with every generation request (recorded with outputs)."""

    temperature: float = 0.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    max_tokens: int = 2048
    """Maximum new tokens per request."""
    seed: int | None = None
    """Backend sampling seed, when the backend honours one."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError("`sampling.temperature` must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError("`sampling.top_p` must be in (0, 1]")
        if self.max_tokens <= 0:
            raise ConfigError("`sampling.max_tokens` must be positive")


@dataclass
class BackendConfig:
    """An inference backend: an OpenAI-compatible endpoint or an in-process model."""

    kind: str = "openai"
    """One of ``openai`` (HTTP, vLLM/SGLang), ``transformers`` (in-process), ``offline``."""
    base_url: str = ""
    """Endpoint root such as ``http://host:8000/v1`` (``openai`` kind only)."""
    model: str = ""
    """Served model name, or a checkpoint directory for the ``transformers`` kind."""
    api_key_env: str = "HIVIG_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never stored)."""
    concurrency: int = 32
    """Maximum requests in flight."""
    timeout_s: float = 120.0
    """Per-request timeout, in seconds."""
    max_retries: int = 4
    """Retries on transport errors, 429 and 5xx, with exponential backoff and jitter."""
    backoff_s: float = 0.5
    """Base backoff before the first retry, in seconds; doubles per retry."""
    max_response_bytes: int = 0
    """Largest answer body read (``openai`` kind); longer is a ``bad_response``, not retried.
    0 sizes it from each request's token cap (4 MiB + 256 bytes per token)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling parameters."""

    def __post_init__(self) -> None:
        if self.kind not in ("openai", "transformers", "offline"):
            raise ConfigError("`backend.kind` must be one of openai, transformers, offline")
        if self.concurrency <= 0:
            raise ConfigError("`backend.concurrency` must be positive")
        if self.timeout_s <= 0:
            raise ConfigError("`backend.timeout_s` must be positive")
        if self.max_retries < 0:
            raise ConfigError("`backend.max_retries` must be >= 0")
        if self.max_response_bytes < 0:
            raise ConfigError("`backend.max_response_bytes` must be >= 0 (0: from the token cap)")


# --------------------------------------------------------------------------------------------
# Loading


def _omegaconf() -> tuple[Any, type[Exception]]:
    # Imported on first use: the runner side (serve.client, serve.guard) imports this module
    # for its error and size types and installs no OmegaConf.
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    return OmegaConf, OmegaConfBaseException


def load_config(schema: type[T], path: str | os.PathLike | None, overrides: list[str] = ()) -> T:
    """Build a ``schema`` instance from defaults, then a YAML file, then dotlist overrides.

    Args:
        schema: The stage's top-level dataclass.
        path: YAML file holding values only; ``None`` uses the dataclass defaults.
        overrides: ``key.sub=value`` strings, applied last.

    Returns:
        The validated dataclass instance (``__post_init__`` has run on every level).

    Raises:
        ConfigError: Unknown key, wrong type, or a failed cross-field rule.
    """
    OmegaConf, OmegaConfBaseException = _omegaconf()
    try:
        merged = OmegaConf.structured(schema)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config defaults of {schema.__name__}: {e}") from e
    if path is not None:
        merged = _merge_file(merged, Path(path))
    for override in overrides:
        merged = _merge_override(merged, override)
    try:
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        where = f"{path} with overrides {list(overrides)}" if overrides else str(path or "defaults")
        raise ConfigError(f"invalid config ({where}): {_one_line(e)}") from e


def _one_line(e: BaseException) -> str:
    # OmegaConf messages carry "full_key: ... object_type=..." detail lines; the first line
    # names the problem.
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _merge_file(base: Any, path: Path) -> Any:
    OmegaConf, OmegaConfBaseException = _omegaconf()
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {type(e).__name__}") from e
    try:
        # OmegaConf's own YAML loader (it reads 5e-6 as a float, which PyYAML does not).
        loaded = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise ConfigError(f"YAML syntax error in {path}{at}: {problem}") from e
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config ({path}): {_one_line(e)}") from e
    if not OmegaConf.is_dict(loaded):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not a list")
    try:
        return OmegaConf.merge(base, loaded)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid config ({path}): {_one_line(e)}") from e


def _merge_override(base: Any, override: str) -> Any:
    OmegaConf, OmegaConfBaseException = _omegaconf()
    if "=" not in override or not override.split("=", 1)[0].strip():
        raise ConfigError(
            f"override {override!r} is not KEY=VALUE (a dotted key as --dry-run prints it)"
        )
    try:
        return OmegaConf.merge(base, OmegaConf.from_dotlist([override]))
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid override {override!r}: {_one_line(e)}") from e
    except Exception as e:  # noqa: BLE001  (yaml parse errors of the value)
        raise ConfigError(f"invalid override {override!r}: {type(e).__name__}") from e


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass."""
    return dataclasses.asdict(cfg)


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (what ``--dry-run`` prints and every run saves)."""
    OmegaConf, OmegaConfBaseException = _omegaconf()
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def add_config_arguments(
    parser: argparse.ArgumentParser,
    default_config: str | None = None,
    *,
    example: str = "optim.lr=5e-6",
) -> None:
    """Add ``--config``, ``--dry-run`` and positional ``key=value`` overrides to a parser.

    ``example`` is the override the help shows: a key of this tool's own config (the default
    is training's), since a key from another stage's config is refused by this one.
    """
    parser.add_argument(
        "--config",
        default=default_config,
        help="YAML file with values for this stage (see configs/)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and exit without doing any work",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help=f"dotlist overrides applied after the YAML, e.g. {example}",
    )


def screen_size(min_side: int = 32) -> Callable[[str], tuple[int, int]]:
    """An argparse ``type`` for ``WIDTHxHEIGHT`` (``1280x800``), both sides >= ``min_side``.

    A malformed value becomes argparse's one usage line and exit status 2.
    """

    def parse(text: str) -> tuple[int, int]:
        w, sep, h = text.strip().lower().partition("x")
        if not (sep and w.isdigit() and h.isdigit()):
            raise argparse.ArgumentTypeError(
                f"expected WIDTHxHEIGHT such as 1280x800, got {text!r}"
            )
        if int(w) < min_side or int(h) < min_side:
            raise argparse.ArgumentTypeError(f"both sides must be at least {min_side} px: {text!r}")
        return int(w), int(h)

    return parse


# --------------------------------------------------------------------------------------------
# Run descriptions


def package_versions(names: tuple[str, ...] = RECORDED_PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (``None`` when absent)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_revision(cwd: str | os.PathLike | None = None) -> dict[str, Any]:
    """``{"sha": ..., "dirty": ...}`` of the repository holding ``cwd`` (nulls outside git)."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return {"sha": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"sha": None, "dirty": None}


def run_info() -> dict[str, Any]:
    """Git revision, package versions, host, SLURM job id and time of this run."""
    return {
        "git": git_revision(),
        "packages": package_versions(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_run_description(out_dir: str | os.PathLike, cfg: Any) -> None:
    """Write ``config.yaml`` and ``run_info.json`` into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(config_to_yaml(cfg), encoding="utf-8")
    (out / "run_info.json").write_text(json.dumps(run_info(), indent=2) + "\n", encoding="utf-8")
