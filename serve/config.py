"""Typed config of the critic gateway (``configs/serve/*.yaml`` hold the values).

Top-level ``model=DIR host=H port=N`` overrides are the stable interface for scripts::

    python -m serve --config configs/serve/local.yaml model=runs/demo/train/final port=8080
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivig.config import BackendConfig, ConfigError, FrameConfig, SamplingConfig

COORD_SPACES = ("screen_px", "norm1000", "norm999", "norm01", "resized_px")
"""Coordinate spaces an action may be stated in (see ``serve.actions``)."""

ACTION_FORMATS = ("auto", "qwen", "scalecua", "osworld", "androidworld", "webarena_code")
"""Text formats of ``raw`` actions; ``auto`` picks by the text's shape."""


@dataclass
class LimitsConfig:
    """Request limits: every route, every body."""

    max_body_bytes: int = 40 * 1024 * 1024
    """Largest request body, in bytes (413 ``image_too_large`` above it)."""
    max_image_bytes: int = 24 * 1024 * 1024
    """Largest decoded screenshot file, in bytes (413 ``image_too_large``)."""
    max_image_pixels: int = 16_777_216
    """Largest screenshot area, in pixels (400 ``bad_image``): 4096×4096, above a 5K screen. A
    decompression-bomb guard and a bound on one request's image work (about a second of CPU)."""
    large_image_pixels: int = 8_294_400
    """Screenshots above this area (3840×2160) are decoded in a lane of their own, a few at a
    time, so large ones cannot hold every image thread while ordinary screens wait."""
    large_image_lanes: int = 1
    """Large screenshots decoded at once, gateway-wide; more wait up to the observe deadline,
    then get 429 ``overloaded``."""
    max_candidates: int = 8
    """Most candidates one critique may rank."""
    max_queue: int = 64
    """Model calls in flight or waiting, gateway-wide; over it a request gets 429."""
    retry_after_s: int = 1
    """``Retry-After`` sent with 429, in seconds."""
    header_timeout_s: float = 10.0
    """Seconds a client has to send a request line and headers, from the connection opening (or
    the first byte of the next request on a kept-alive one); a late connection is closed."""
    body_timeout_s: float = 10.0
    """Seconds a client has to send a request body once its headers are in (408, closed)."""
    max_header_bytes: int = 65536
    """Largest request line plus headers, in bytes (431, closed); counted as they arrive."""
    max_connections: int = 4096
    """Open connections per process; more get 503 and are closed at once. Lowered at start to
    fit the process's open-file limit (``ulimit -n``), so accepting never runs out of files."""

    def __post_init__(self) -> None:
        names = ("max_body_bytes", "max_image_bytes", "max_image_pixels", "max_queue")
        names += ("body_timeout_s", "max_header_bytes", "max_connections")
        for name in (*names, "large_image_pixels", "large_image_lanes", "header_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"`limits.{name}` must be positive")
        if not 1 <= self.max_candidates <= 64:
            raise ConfigError("`limits.max_candidates` must be in [1, 64]")


@dataclass
class CriticConfig:
    """How the two critic calls are made and answered."""

    observe_deadline_s: float = 8.0
    """Time budget of one history update, model included; past it the answer is degraded."""
    critique_deadline_s: float = 8.0
    """Time budget of one verdict, model included; past it the verdict is ``abstain``."""
    history_max_tokens: int = 768
    """New-token cap of a history update (reasoning included)."""
    critique_max_tokens: int = 768
    """New-token cap of a verdict (reasoning included)."""
    explanation_max_chars: int = 1500
    """Longest explanation returned to a runner."""
    prompt_dir: str = ""
    """Folder with ``critic_history_v<N>.txt`` and ``critic_critique_v<N>.txt`` (a prompt profile
    for a checkpoint trained on another layout); empty uses the package's own templates."""
    recurrence_note: bool = True
    """Append the detector's note (no-effect repeats, cycles) to the critique's trajectory text
    when it fires. Training data carries no such note, so this leaves the prompt of every step
    without a recurrence unchanged."""
    profile: str = ""
    """A critic profile folder (``hivig profile ...``): the whole interface a checkpoint was
    trained with (templates, action-space and taxonomy texts, first summary, generation budget).
    Its budget replaces the four ``*_deadline_s``/``*_max_tokens`` values and
    ``recurrence_note`` above. Empty serves hivig's own interface with the values above."""

    checkpoint: str = ""
    """The checkpoint folder a remote backend serves (``slurm/serve.sbatch`` sets it), so that
    its recorded profile is checked against ``profile`` at start; the in-process backend checks
    its own ``model`` folder."""
    allow_profile_mismatch: bool = False
    """Serve a checkpoint with a profile other than the one it records, on purpose."""

    def __post_init__(self) -> None:
        if self.profile and self.prompt_dir:
            raise ConfigError(
                "`critic.profile` and `critic.prompt_dir` exclude each other: a profile holds "
                "its own templates"
            )
        if self.observe_deadline_s <= 0 or self.critique_deadline_s <= 0:
            raise ConfigError("`critic.*_deadline_s` must be positive")
        if self.history_max_tokens <= 0 or self.critique_max_tokens <= 0:
            raise ConfigError("`critic.*_max_tokens` must be positive")


@dataclass
class SessionsConfig:
    """Where sessions, screenshots and traces live."""

    store: str = "sqlite"
    """``sqlite`` (survives a restart) or ``memory`` (tests, throwaway runs)."""
    state_dir: str = "runs/serve"
    """Folder of ``sessions.sqlite``, ``images/`` and ``traces/``."""
    ttl_s: float = 7200.0
    """Idle seconds after which a session expires."""
    frame_cache: int = 256
    """Clean canonical frames kept in memory (one per recent screenshot)."""

    def __post_init__(self) -> None:
        if self.store not in ("sqlite", "memory"):
            raise ConfigError("`sessions.store` must be sqlite or memory")
        if self.ttl_s <= 0:
            raise ConfigError("`sessions.ttl_s` must be positive")


@dataclass
class RetentionConfig:
    """What the sweep removes from ``sessions.state_dir``, and how often it runs.

    The sweep closes idle sessions and applies these limits off the event loop, a bounded slice
    at a time, so requests keep being answered while it runs.
    """

    sweep_every_s: float = 60.0
    """Seconds between sweeps (session expiry, trace retries and the removals below)."""
    closed_keep_s: float = 86400.0
    """A closed session (closed, or expired after ``sessions.ttl_s``) last seen this long ago is
    removed from the store: ``GET /v1/sessions/{id}`` then answers 404, and a runner re-creates
    it from its echo as for any lost session."""
    closed_max: int = 5000
    """Closed sessions kept at most, the most recently seen; older ones are removed first (about
    50 KB each at 60 steps: this bounds the store at about 250 MB of closed sessions)."""
    remove_traces: bool = False
    """Also delete a removed session's trace (``traces/<id>.jsonl``, about 1 MB at 60 steps).
    Off: traces are the input of ``diagnose`` and of new training data; collect them, then
    delete them, or turn this on where nobody does."""
    jobs_keep_s: float = 604800.0
    """A diagnosis job's folder (``diagnoses/<id>/``: its state, report and HTML) is removed
    this long after it finished (or after it was last written, for a job whose process died)."""

    def __post_init__(self) -> None:
        for name in ("sweep_every_s", "closed_keep_s", "jobs_keep_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"`retention.{name}` must be positive")
        if self.closed_max < 0:
            raise ConfigError("`retention.closed_max` must be >= 0")


@dataclass
class DiagnoseConfig:
    """``POST /v1/diagnose`` jobs."""

    allowed_roots: list[str] = field(default_factory=list)
    """Folders whose traces and result folders a job may read, besides ``sessions.state_dir``
    (a request names a server path, so it is confined to these)."""
    top_k: int = 3
    """Candidate steps inspected with the critic."""
    max_jobs: int = 4
    """Diagnosis jobs running at once; more wait their turn."""

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.max_jobs < 1:
            raise ConfigError("`diagnose.top_k` and `diagnose.max_jobs` must be >= 1")


@dataclass
class ServeConfig:
    """The gateway: where it listens, which critic it fronts, and its limits."""

    model: str = ""
    """Checkpoint folder (``transformers`` backend) or served model name (``openai``)."""
    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = 8080
    """TCP port."""
    auth_token_env: str = "HIVIG_SERVE_TOKEN"
    """Environment variable holding the bearer token; unset or empty turns auth off."""
    backend: BackendConfig = field(default_factory=lambda: BackendConfig(kind="transformers"))
    """The critic backend; ``backend.model`` is taken from ``model``."""
    frame: FrameConfig = field(default_factory=FrameConfig)
    """Canonical frame; replaced by the checkpoint's processor budget when it has one."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    warmup: bool = True
    """Run one history update and one verdict through the parser before ``/readyz`` is green."""
    graceful_timeout_s: float = 30.0
    """Seconds a shutdown waits for in-flight requests."""
    log_level: str = "info"
    workers: int = 1
    """Gateway processes on this node, sharing ``sessions.state_dir`` (the SQLite store orders
    each session's requests across them). Queue limits, caches and ``/metrics`` are per process."""

    def __post_init__(self) -> None:
        if self.model:
            self.backend.model = self.model
        if not 0 < self.port < 65536:
            raise ConfigError("`port` must be in 1..65535")
        if not 1 <= self.workers <= 256:
            raise ConfigError("`workers` must be in 1..256")
        if self.workers > 1 and self.sessions.store != "sqlite":
            raise ConfigError("`workers` > 1 needs sessions.store=sqlite (memory is per process)")

    def sampling(self, max_tokens: int) -> SamplingConfig:
        """The backend's sampling with a per-call token cap."""
        s = self.backend.sampling
        return SamplingConfig(
            temperature=s.temperature, top_p=s.top_p, max_tokens=max_tokens, seed=s.seed
        )
