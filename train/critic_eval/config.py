"""The typed settings of one critic-evaluation run, and the error type for user mistakes.

The command line builds a ``CriticEvalConfig`` from its flags; the same values load from YAML
with ``hivig.config.load_config(CriticEvalConfig, path, overrides)``, and every run saves the
resolved config as ``config.yaml`` next to its outputs, so a run's settings reload from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivig.config import ConfigError

BACKEND_KINDS = "oracle|transformers:CKPT|openai:URL[@M]"
"""The backend spec forms, as the error messages spell them."""

FLAGS = {"timeout_s": "--timeout"}
"""Command-line flags whose name differs from their field (the rest: ``--field-name``)."""


class CriticEvalError(ValueError):
    """A user mistake (bad data path, backend spec, output folder); the message names the fix."""


@dataclass
class CriticEvalConfig:
    """The resolved evaluation settings (written to ``config.yaml`` next to the outputs)."""

    data: str = ""
    """A data_gen output folder, its ``dataset/records`` folder, a split folder or one shard."""
    split: str = ""
    """Split to score; empty: ``test`` for dataset folders, every record of a split folder."""
    backends: list[str] = field(default_factory=list)
    """Backend specs: ``oracle``, ``transformers:CKPT_DIR``, ``openai:URL[@MODEL]``."""
    out: str = ""
    """Output folder."""
    limit: int = 0
    """Score at most this many records (0: all), critique and history interleaved."""
    max_tokens: int = 2048
    """Maximum new tokens per answer."""
    temperature: float = 0.0
    """Sampling temperature (0: greedy)."""
    seed: int | None = None
    """Sampling seed, where the backend honours one."""
    concurrency: int = 8
    """Requests in flight per backend."""
    timeout_s: float = 300.0
    """Per-request timeout of HTTP backends, in seconds."""
    min_pixels: int = 0
    """Canonical-frame lower bound, in pixels; 0: the checkpoint's processor budget, else the
    default frame."""
    max_pixels: int = 0
    """Canonical-frame upper bound, in pixels; 0: the checkpoint's processor budget, else the
    default frame."""
    image_root: str = ""
    """Where relative image paths resolve; empty: the records' manifest."""
    device: str = ""
    """Device of in-process models; empty: CUDA when available, else CPU."""

    def __post_init__(self) -> None:
        _check(bool(self.data), "data", "must name a data_gen output folder or shard")
        _check(bool(self.out), "out", "must name an output folder")
        if not self.backends:
            raise ConfigError(f"name a backend: --backend {BACKEND_KINDS} (`backends` is empty)")
        _check(self.limit >= 0, "limit", f"must be >= 0, got {self.limit}")
        _check(self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")
        _check(self.concurrency >= 1, "concurrency", f"must be >= 1, got {self.concurrency}")
        _check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(self.timeout_s > 0, "timeout_s", f"must be > 0 seconds, got {self.timeout_s}")
        _check(self.min_pixels >= 0, "min_pixels", f"must be >= 0, got {self.min_pixels}")
        _check(self.max_pixels >= 0, "max_pixels", f"must be >= 0, got {self.max_pixels}")


def _check(ok: bool, name: str, rule: str) -> None:
    # Both spellings: the field for YAML and ``load_config`` users, the flag for the CLI.
    if not ok:
        flag = FLAGS.get(name, "--" + name.replace("_", "-"))
        raise ConfigError(f"`{name}` ({flag}) {rule}")
