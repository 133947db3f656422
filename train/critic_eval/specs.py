"""Backend specs (``oracle``, ``transformers:CKPT_DIR``, ``openai:URL[@MODEL]``) and the
predictors they build, with the canonical frame and sampling of the run's config."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hivig.backends import Sampling
from hivig.checkpoint_files import CheckpointError, read_frame
from hivig.config import BackendConfig, ConfigError, FrameConfig
from hivig.profiles import Profile, ProfileError, check_served_profile, default_profile
from hivig.records import PROFILE_DIR, read_profile, records_dir
from train.critic_eval.config import CriticEvalConfig, CriticEvalError
from train.critic_eval.predictors import BackendPredictor, OraclePredictor, Predictor


@dataclass(frozen=True)
class BackendSpec:
    """A parsed ``--backend`` value."""

    kind: str
    target: str = ""
    model: str = ""

    @property
    def label(self) -> str:
        """Short name for tables and file names."""
        if self.kind == "oracle":
            return "oracle"
        if self.kind == "transformers":
            return f"transformers:{Path(self.target).name or self.target}"
        return f"openai:{self.model or self.target}"


_OPENAI_SPEC = re.compile(r"^(?P<url>https?://[^/@\s]+(?:/[^@\s]*)?)(?:@(?P<model>\S+))?$")


def parse_backend_spec(spec: str) -> BackendSpec:
    """Parse ``oracle``, ``transformers:CKPT_DIR`` or ``openai:URL[@MODEL]``.

    Raises:
        CriticEvalError: Unknown kind, a checkpoint folder without ``config.json``, or a URL
            that is not ``http(s)://HOST...``.
    """
    kind, _, rest = spec.partition(":")
    if kind == "oracle" and not rest:
        return BackendSpec("oracle")
    if kind == "transformers" and rest:
        ckpt = Path(rest)
        if not (ckpt / "config.json").is_file():
            raise CriticEvalError(
                f"--backend {spec}: {ckpt} is not a checkpoint folder (no config.json)"
            )
        return BackendSpec("transformers", str(ckpt))
    if kind == "openai" and rest:
        # No credentials in the URL (the key comes from the environment), so the first "@"
        # after the host separates the model, whose name may hold "/" (Qwen/Qwen3-VL-8B).
        match = _OPENAI_SPEC.match(rest)
        if match is None:
            raise CriticEvalError(
                f"--backend {spec}: expected openai:http(s)://HOST[:PORT][/PATH][@MODEL]"
            )
        return BackendSpec("openai", match["url"].rstrip("/"), match["model"] or "")
    raise CriticEvalError(
        f"--backend {spec!r}: expected oracle, transformers:CKPT_DIR or openai:URL[@MODEL]"
    )


def _checkpoint_frame(ckpt: str) -> FrameConfig:
    """The pixel budget a checkpoint's processor was saved with (training's frame)."""
    try:
        lo, hi = read_frame(ckpt)
        return FrameConfig(min_pixels=lo, max_pixels=hi)
    except (CheckpointError, ConfigError) as e:
        raise CriticEvalError(f"--backend transformers:{ckpt}: {e}") from e


def _frame(cfg: CriticEvalConfig, spec: BackendSpec) -> FrameConfig:
    explicit = bool(cfg.min_pixels and cfg.max_pixels)
    local = spec.kind == "transformers" and not explicit
    base = _checkpoint_frame(spec.target) if local else FrameConfig()
    try:
        return FrameConfig(
            min_pixels=cfg.min_pixels or base.min_pixels,
            max_pixels=cfg.max_pixels or base.max_pixels,
        )
    except ConfigError as e:
        raise CriticEvalError(f"--min-pixels/--max-pixels: {e}") from e


def _served_model(url: str, timeout_s: float) -> str:
    """The first model an OpenAI-compatible server lists (``GET URL/models``)."""
    import httpx

    key = os.environ.get(BackendConfig.api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(f"{url}/models", headers=headers, timeout=min(timeout_s, 30.0))
        resp.raise_for_status()
        models = [m["id"] for m in resp.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise CriticEvalError(
            f"cannot list the models at {url}/models ({e}); name one with openai:URL@MODEL"
        ) from e
    if not models:
        raise CriticEvalError(f"{url}/models lists no model; name one with openai:URL@MODEL")
    return str(models[0])


def resolve_model(spec: BackendSpec, timeout_s: float) -> BackendSpec:
    """``spec`` with the served model filled in for ``openai:URL`` without ``@MODEL``.

    Raises:
        CriticEvalError: The server cannot be reached or lists no model.
    """
    if spec.kind != "openai" or spec.model:
        return spec
    return BackendSpec(spec.kind, spec.target, _served_model(spec.target, timeout_s))


def data_profile(data: str) -> Profile:
    """The critic profile the evaluation records were written in (hivig's own if none).

    Raises:
        CriticEvalError: The recorded profile is invalid.
    """
    candidates = [records_dir(data), Path(data), Path(data).parent]
    try:
        for folder in candidates:
            if (folder / PROFILE_DIR).is_dir():
                return read_profile(folder)
    except ProfileError as e:
        raise CriticEvalError(f"--data: {e}") from None
    return default_profile()


def build_predictor(
    spec: BackendSpec, cfg: CriticEvalConfig, image_root: Path, name: str
) -> Predictor:
    """The predictor a spec describes (loads the checkpoint for ``transformers``).

    Raises:
        CriticEvalError: The checkpoint cannot be loaded or the server lists no model.
    """
    if spec.kind == "oracle":
        return OraclePredictor(name)
    from hivig.backends import build_backend

    frame = _frame(cfg, spec)
    profile = data_profile(cfg.data)
    sampling = Sampling(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed)
    if spec.kind == "transformers":
        try:  # a checkpoint is scored in the interface it learnt, as it is served
            check_served_profile(spec.target, profile)
        except ProfileError as e:
            raise CriticEvalError(f"--backend {spec.label}: {e}") from None
        backend_cfg = BackendConfig(kind="transformers", model=spec.target)
        try:
            template = None if profile.is_default else profile.chat_template
            backend = build_backend(
                backend_cfg, frame=frame, device=cfg.device or None, chat_template=template
            )
        except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: e.g. an absent --device
            raise CriticEvalError(f"--backend {spec.label}: cannot load {spec.target}: {e}") from e
    else:
        backend_cfg = BackendConfig(
            kind="openai",
            base_url=spec.target,
            model=spec.model or _served_model(spec.target, cfg.timeout_s),
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
        )
        backend = build_backend(backend_cfg)
    return BackendPredictor(backend, sampling, frame, image_root, name, profile.frame)


def unique_names(specs: Sequence[BackendSpec]) -> list[str]:
    """Labels for the tables; checkpoints of the same folder name (``RUN_A/final``,
    ``RUN_B/final``) are told apart by their parent folder, anything else left by a number."""
    short = [s.label for s in specs]
    labels = list(short)
    for i, spec in enumerate(specs):
        if spec.kind == "transformers" and short.count(spec.label) > 1:
            labels[i] = "transformers:" + "/".join(Path(spec.target).parts[-2:])
    return [
        label if labels.count(label) == 1 else f"{label}#{labels[:i].count(label) + 1}"
        for i, label in enumerate(labels)
    ]
