"""The data_gen run configuration: one typed dataclass tree, YAML values, dotlist overrides.

    python -m data_gen run --config configs/data_gen/demo.yaml corpus=CORPUS out=OUT
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --shard 0/8
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --dry-run

Defaults that encode a HiViG paper choice say so in the field docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from data_gen.annotator import OUTAGE_WAIT_S, PREFETCH
from data_gen.audit import DEFAULT_GATED, FAMILIES, GATE_NAMES
from data_gen.runs.config import RunsConfig
from hivig.backends.images import check_transport
from hivig.config import BackendConfig, ConfigError, FrameConfig, SamplingConfig
from hivig.taxonomy import DIMENSIONS, Dimension, dimension_by_key


class UnknownDimensionError(ConfigError):
    """A config names an error dimension that is not in ``hivig.taxonomy``."""


def _uniform_dimensions() -> dict[str, float]:
    return {d.key: 1.0 for d in DIMENSIONS}


def resolve_dimension(text: str, where: str) -> Dimension:
    """The taxonomy dimension a config entry names, by its key or its exact name.

    Args:
        text: A ``Dimension.key`` (``visual_hallucination``) or ``Dimension.name``.
        where: The config field, for the error message.

    Raises:
        UnknownDimensionError: ``text`` is neither a key nor a name of the taxonomy.
    """
    try:
        return dimension_by_key(text)
    except KeyError:
        pass
    for dim in DIMENSIONS:
        if dim.name == text:
            return dim
    raise UnknownDimensionError(
        f"`{where}` names an unknown dimension {text!r}; use a key of hivig.taxonomy "
        f"({', '.join(d.key for d in DIMENSIONS)}) or its exact name"
    )


def _annotator_backend() -> BackendConfig:
    return BackendConfig(kind="offline", sampling=SamplingConfig(temperature=0.0, max_tokens=4096))


@dataclass
class AnnotatorConfig:
    """The annotator: an OpenAI-compatible endpoint or the deterministic offline annotator."""

    backend: BackendConfig = field(default_factory=_annotator_backend)
    """Endpoint, model, API-key variable, concurrency, timeouts and sampling (recorded in output).
    ``kind=offline`` selects the deterministic offline annotator (no model, labelled as such)."""
    max_attempts: int = 3
    """Attempts per request when the output fails its contract (1 = no validation retry)."""
    cache_dir: str = ""
    """Content-addressed request cache; empty means ``<out>/cache``. Shared across reruns."""
    cache_offline: bool = False
    """Also cache offline-annotator outputs (they are free to recompute, so off by default)."""
    frame_cache_mb: int = 4096
    """Memory for prepared frames: each screenshot of a shard is decoded and resized once and
    every request using it gets the same frame; beyond this budget the least recently used are
    dropped (and prepared again if needed). 4 MB per 1 MP frame (Pillow's RGB layout)."""
    image_format: str = "jpeg"
    """How screenshots travel to an endpoint annotator: ``jpeg`` or ``png``. JPEG because the
    annotator only writes text about the screen (its answers never carry pixels into training,
    and the critic's own requests stay lossless PNG); the markers stay clearly visible at
    quality 95, and encoding a freshly marked ~1 MP frame costs 4-6x less CPU than lossless PNG
    (1344x768: 4.5 ms against 23 ms on a busy frame), and that encoding bounds annotator
    throughput. At q=95 the bytes are about the same as PNG level 1 (larger on noisy frames), so
    bandwidth is no gain. The request cache is keyed on the screenshot files, so the format changes
    no cache key."""
    jpeg_quality: int = 95
    """JPEG quality (1-100) when ``image_format`` is ``jpeg``."""
    prefetch: int = PREFETCH
    """Requests prepared (screenshots decoded, payloads encoded) ahead of a free request slot,
    so every slot spends its time on the network; see ``Annotator.jobs_in_flight``."""
    prepare_threads: int = 0
    """Threads preparing requests; 0 = one per CPU the process may use (more only contend)."""
    outage_wait_s: float = OUTAGE_WAIT_S
    """Longest wait through an endpoint outage (timeouts, refused connections, 429, 5xx, error
    bodies), pausing 1 s doubling to 30 s between tries, before a request is given up; a request
    given up leaves its stage uncommitted, so a rerun retries it. 0: give up at the client's
    last retry."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("`annotator.max_attempts` must be >= 1")
        if self.frame_cache_mb < 1:
            raise ConfigError("`annotator.frame_cache_mb` must be >= 1")
        if self.outage_wait_s < 0:
            raise ConfigError("`annotator.outage_wait_s` must be >= 0")
        if self.prefetch < 0 or self.prepare_threads < 0:
            raise ConfigError("`annotator.prefetch` and `annotator.prepare_threads` must be >= 0")
        try:
            check_transport(self.image_format, self.jpeg_quality)
        except ValueError as e:
            raise ConfigError(f"`annotator.image_format`/`jpeg_quality`: {e}") from e


@dataclass
class TransitionsConfig:
    """Stage 2: state transitions conditioned on the real after-screenshot."""

    keep_no_change: bool = True
    """Keep steps whose after-screenshot is identical to the before-screenshot (labelled
    ``no_change``); the reference release dropped them, losing silent failures and waits."""


@dataclass
class HistoryConfig:
    """Stage 3: rolling macro-history summaries, sequential within a trajectory."""

    intent_mask_rate: float = 0.5
    """Share of history samples whose previous step shows only its tool call(s), no ``Action:``
    line (reference release: 50 %)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.intent_mask_rate <= 1.0:
            raise ConfigError("`history.intent_mask_rate` must be in [0, 1]")


@dataclass
class PerturbConfig:
    """Stage 4: Bad actions across the 12 error dimensions."""

    dimension_weights: dict[str, float] = field(default_factory=_uniform_dimensions)
    """Target distribution over dimensions (relative weights, any positive scale), keyed by the
    taxonomy key (``visual_hallucination``) or exact name; dimensions left out get weight 0.
    Default: uniform, so every dimension is ~8 % of Bad samples."""
    min_share: float = 0.03
    """Floor on every dimension's share of the planned Bad samples (at least 3 %)."""
    platform_weights: dict[str, float] = field(default_factory=dict)
    """Target share of critique steps per platform (relative weights); empty keeps the corpus'
    natural mix. Over-represented platforms are down-sampled (counted as a drop reason)."""
    bad_share: float = 1.0
    """Share of critique steps offered a Bad sample; the distribution caps below decide which
    of them get one."""
    max_dimension_ratio: float = 1.5
    """No dimension gets more than this multiple of its target share of the Bad samples: a
    step whose only feasible dimensions are full gets no Bad (it may still be a Good sample)."""
    min_dimension_ratio: float = 0.5
    """A dimension below this multiple of its target share, where the corpus could express more
    of it, fails the export (``unreachable_dimension=error``) or is reported (``warn``)."""
    good_bad_ratio: float = 1.0
    """Good critique samples per Bad one (HiViG: 1:1). Goods of steps that have a Bad come
    first, so pairs stay together; surplus Goods are left out and counted."""
    near_miss_margin: int = 12
    """Grounding/Spatial near-miss: distance outside the target element box, in 0-1000 grid
    units."""
    scroll_shrink: float = 0.05
    """Parameter Vector Miscalibration magnitude shrink factor (200 px -> 10 px)."""
    element_source: str = "auto"
    """Where element boxes come from: ``sidecar`` (``elements_file`` only), ``annotator`` (a
    grounding request per click step on a screen the sidecar lacks; the answer counts only when
    the expert's click is inside the returned box), or ``auto`` (annotator grounding when there
    is no sidecar file, as on real ScaleCUA data). Grounding runs once per ``out`` folder, in
    the first shard to start; the others read its ``grounding/elements.jsonl``."""
    unreachable_dimension: str = "error"
    """What to do when a dimension with positive weight has no eligible step in the corpus
    (e.g. element-based dimensions without element boxes): ``error`` stops the run before any
    work starts, naming the dimensions; ``warn`` logs them and plans the others."""

    def __post_init__(self) -> None:
        if not self.dimension_weights or any(w < 0 for w in self.dimension_weights.values()):
            raise ConfigError("`perturb.dimension_weights` must be non-empty and non-negative")
        self.weights_by_name()  # raises on unknown or repeated dimensions
        if not 0.0 <= self.min_share * len(self.dimension_weights) <= 1.0:
            raise ConfigError("`perturb.min_share` times the dimension count must be <= 1")
        if any(w < 0 for w in self.platform_weights.values()):
            raise ConfigError("`perturb.platform_weights` must be non-negative")
        if not 0.0 <= self.bad_share <= 1.0:
            raise ConfigError("`perturb.bad_share` must be in [0, 1]")
        if self.max_dimension_ratio < 1.0:
            raise ConfigError("`perturb.max_dimension_ratio` must be >= 1")
        if not 0.0 <= self.min_dimension_ratio <= 1.0:
            raise ConfigError("`perturb.min_dimension_ratio` must be in [0, 1]")
        if self.good_bad_ratio < 0:
            raise ConfigError("`perturb.good_bad_ratio` must be >= 0 (0 = keep every Good)")
        if self.near_miss_margin <= 0:
            raise ConfigError("`perturb.near_miss_margin` must be positive")
        if not 0.0 < self.scroll_shrink < 1.0:
            raise ConfigError("`perturb.scroll_shrink` must be in (0, 1)")
        if self.element_source not in ("auto", "sidecar", "annotator"):
            raise ConfigError("`perturb.element_source` must be `auto`, `sidecar` or `annotator`")
        if self.unreachable_dimension not in ("error", "warn"):
            raise ConfigError("`perturb.unreachable_dimension` must be `error` or `warn`")

    def weights_by_name(self) -> dict[str, float]:
        """``dimension_weights`` keyed by exact dimension name, in taxonomy order.

        Raises:
            UnknownDimensionError: A key names no dimension of the taxonomy.
            ConfigError: One dimension is given twice (by key and by name).
        """
        by_dim: dict[Dimension, float] = {}
        for text, weight in self.dimension_weights.items():
            dim = resolve_dimension(str(text), "perturb.dimension_weights")
            if dim in by_dim:
                raise ConfigError(f"`perturb.dimension_weights` gives {dim.key!r} twice")
            by_dim[dim] = float(weight)
        return {d.name: by_dim[d] for d in DIMENSIONS if d in by_dim}


@dataclass
class JudgeConfig:
    """Stage 5: the double-blind judge (expert and perturbed step in random order)."""

    enabled: bool = True
    """Run the judge; when off every generated Bad sample is kept (counted as unjudged)."""
    require_dimension_match: bool = True
    """Drop Bad samples whose judged dimension differs from the injected one (HiViG filter)."""


@dataclass
class RationaleConfig:
    """Stage 6: critic rationales for Good and Bad steps, and intent masking."""

    intent_mask_rate: float = 0.3
    """Share of critique samples that show only the tool call(s), no ``Action:`` intent
    (HiViG: 30 % beat 0 % and 50 %). Dimensions that need an intent are never masked."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.intent_mask_rate <= 1.0:
            raise ConfigError("`rationale.intent_mask_rate` must be in [0, 1]")


@dataclass
class ExportConfig:
    """Stage 7: SFT records per split, ShareGPT export, stats and report."""

    val_share: float = 0.05
    """Share of episodes (not samples) assigned to the validation split."""
    test_share: float = 0.05
    """Share of episodes assigned to the test split."""
    report_cards: int = 36
    """Sample cards in report.html (marked screenshots with prompt and target)."""
    sharegpt: bool = True
    """Also write the LlamaFactory ShareGPT export (``sharegpt/<split>.json``)."""
    history_critique_ratio: float = 0.625
    """History samples per critique sample in the export (HiViG: 20k history to 32k critique);
    surplus history samples are left out and counted (``mix_ratio``); 0 keeps them all."""
    audit_max_auc: float = 0.7
    """Shortcut audit: the highest acceptable AUC of a text-only probe (proposed step, history
    text) separating Good from Bad in a gated family; above it the export fails loudly."""
    audit_gated: list[str] = field(default_factory=lambda: list(DEFAULT_GATED))
    """What the audit gates: dimension families (``pointing``, ``visual_other``,
    ``cognitive``; see ``data_gen.audit.FAMILIES``), ``text_blind`` (every dimension whose
    error is not in the step's text by nature: Grounding/Spatial Error, Action-Operation
    Misalignment, Constraint Neglect; ``data_gen.audit.TEXT_BLIND``) or dimension keys. A
    family is scored pooled, a dimension key alone. The default (``data_gen.audit
    .DEFAULT_GATED``) gates the text-blind family, and alone Grounding/Spatial Error and
    Constraint Neglect; every other probe is reported only."""
    audit_min_samples: int = 20
    """Families with fewer Bad samples are reported as too small to score."""
    max_tokens: int = 16384
    """Drop samples longer than this, in tokens (system + user + images + target), estimated on
    the canonical frame (image tokens exact, text at 4 UTF-8 bytes per token); 0 = no limit.
    Reference run: ``cutoff_len`` 16,384."""

    def __post_init__(self) -> None:
        if self.val_share < 0 or self.test_share < 0 or self.val_share + self.test_share >= 1:
            raise ConfigError("`export.val_share` + `export.test_share` must be in [0, 1)")
        if self.report_cards < 0:
            raise ConfigError("`export.report_cards` must be >= 0")
        if self.max_tokens < 0:
            raise ConfigError("`export.max_tokens` must be >= 0 (0 = no limit)")
        if self.history_critique_ratio < 0:
            raise ConfigError("`export.history_critique_ratio` must be >= 0 (0 = keep all)")
        if not 0.5 <= self.audit_max_auc <= 1.0:
            raise ConfigError("`export.audit_max_auc` must be in [0.5, 1]")
        unknown = sorted(set(self.audit_gated) - GATE_NAMES)
        if unknown:
            raise ConfigError(
                f"`export.audit_gated` names unknown families {unknown}; use families "
                f"{sorted(FAMILIES)}, text_blind, or dimension keys"
            )


@dataclass
class DataGenConfig:
    """A whole data_gen run: corpus in, SFT datasets out."""

    corpus: str = ""
    """Corpus root: the ScaleCUA-format folder (``meta.json``, images, element sidecar) that
    screenshot paths are relative to."""
    out: str = ""
    """Output directory (work files, completion markers, cache, and the ``dataset/`` export)."""
    trajectories: str = ""
    """``trajectories.jsonl`` written by ``python -m data_gen ingest``. Empty: use
    ``<corpus>/trajectories.jsonl`` when present, else ingest the ScaleCUA-format corpus (a
    ``make-sample`` folder, say) into ``<out>/ingest`` first. Screenshot paths are relative to
    ``corpus``."""
    elements_file: str = "elements.jsonl"
    """Element-box sidecar inside ``corpus`` (a11y / grounding boxes per screenshot); optional,
    without it the element-based generators have no candidates."""
    seed: int = 0
    """Run seed; every per-sample seed derives from it and the sample id."""
    max_trajectories: int = 0
    """Use only the first N trajectories in id order (0 = all); for smoke runs."""
    verify_images: str = "header"
    """How the ingest that ``run`` starts checks screenshots: ``header`` (signature, size, end
    marker, and a decompression-bomb size limit) or ``full`` (decode every screenshot, so a
    corrupt body is quarantined at ingest rather than dropped where it is first decoded)."""
    keep_failed: bool = False
    """Also build samples from trajectories whose outcome is not ``success`` (HiViG synthesises
    from successful trajectories only; failed and unfinished ones are counted and left out)."""
    frame: FrameConfig = field(default_factory=FrameConfig)
    """Canonical frame for marked images and token estimates."""
    profile: str = ""
    """The critic profile the samples are written in (``hivig.profiles``: templates, texts,
    first summary, frame policy); empty: hivig's own. The export records it for ``train``."""
    annotator: AnnotatorConfig = field(default_factory=AnnotatorConfig)
    """The annotator backend, cache and validation retries."""
    transitions: TransitionsConfig = field(default_factory=TransitionsConfig)
    """State-transition stage."""
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """Macro-history stage."""
    perturb: PerturbConfig = field(default_factory=PerturbConfig)
    """Perturbation stage."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Double-blind judge stage."""
    rationale: RationaleConfig = field(default_factory=RationaleConfig)
    """Rationale stage and intent masking."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """Export stage."""
    runs: RunsConfig = field(default_factory=RunsConfig)
    """The agent's own ingested runs (the flywheel); empty ``runs.corpus``: none."""

    def __post_init__(self) -> None:
        if self.max_trajectories < 0:
            raise ConfigError("`max_trajectories` must be >= 0")
        if self.verify_images not in ("header", "full"):
            raise ConfigError("`verify_images` must be `header` or `full`")

    def require_paths(self) -> None:
        """Check the two paths every real run needs (``--dry-run`` may leave them empty).

        Raises:
            ConfigError: ``corpus`` or ``out`` is empty.
        """
        if not self.corpus:
            raise ConfigError("`corpus` must be set (override: corpus=DIR)")
        if not self.out:
            raise ConfigError("`out` must be set (override: out=DIR)")
