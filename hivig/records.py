"""The SFT sample record shared by data_gen (writes), train (reads) and exports.

One ``SFTRecord`` type serves both tasks (history and critique). Images are referenced by path with
the marks to draw, never copied; ``record_messages`` turns a record into the chat messages that
train and serve feed through ``hivig.vision.materialise``, so both see the same frames.

Records are stored as Parquet shards (``part-00000.parquet``, ...) readable with
``datasets.load_dataset("parquet", data_files=...)``. Writing the same records twice gives
identical bytes: data_gen's resume check compares shard files.

``to_sharegpt`` exports LlamaFactory ShareGPT rows. Every image, marked or clean, is rendered
through the canonical frame (plus its marks) into a directory the caller names, so LlamaFactory
gets exactly the frames training uses for both kinds of image.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from hivig.actions import PLATFORMS
from hivig.files import atomic_path, write_atomic
from hivig.logging import get_logger
from hivig.messages import (
    ArrowMark,
    ChatMessage,
    ImagePart,
    ImageRef,
    Mark,
    PointMark,
    TextPart,
)
from hivig.profiles import Profile, default_profile, load_profile
from hivig.taxonomy import lookup_dimension
from hivig.vision import (
    CANONICAL,
    FAST_PNG_LEVEL,
    FrameCache,
    FramePolicy,
    ImageError,
    canonical_frame,
    draw_marks,
    encode_png,
    load_image,
)

logger = get_logger(__name__)

Kind = Literal["history", "critique"]
KINDS: tuple[str, ...] = ("history", "critique")
SPLITS: tuple[str, ...] = ("train", "val", "test")
GENERATORS: tuple[str, ...] = ("programmatic", "annotator", "run")
SOURCES: tuple[str, ...] = ("scalecua", "run")
SHARD_GLOB = "part-*.parquet"
IMAGE_TOKEN = "<image>"
"""LlamaFactory's image placeholder in ShareGPT text."""


class RecordError(ValueError):
    """A record is inconsistent, or a shard cannot be written or read."""


@dataclass(frozen=True)
class ImageSlot:
    """Position of ``images[index]`` inside the user content."""

    index: int


UserPart = TextPart | ImageSlot


@dataclass(frozen=True)
class Labels:
    """What the sample teaches.

    Attributes:
        verdict: ``Good``/``Bad`` for critique samples, ``None`` for history samples.
        error_dimension: Exact dimension name for Bad samples, else ``None``.
        intent_masked: The proposed/executed step was shown without its ``Action:`` line.
        generator: Family that produced a Bad step (``programmatic``/``annotator``, or ``run``:
            an agent's own executed step at the root cause of its failed run); required for Bad
            critique samples and ``None`` for Good and history samples.
    """

    verdict: Literal["Good", "Bad"] | None = None
    error_dimension: str | None = None
    intent_masked: bool = False
    generator: Literal["programmatic", "annotator", "run"] | None = None


@dataclass(frozen=True)
class Provenance:
    """Where the target came from.

    Attributes:
        annotator_model: Model name of the annotator endpoint (``None`` for programmatic output).
        annotator_kind: ``endpoint``, ``offline`` (deterministic ground-truth annotator), ...
        request_hashes: Content hashes of the annotator requests behind this sample, in order.
        source: ``scalecua`` (a published or synthetic trajectory) or ``run`` (an agent's own
            run, read by ``data_gen ingest-runs``).
        benchmark: The run's benchmark (``osworld``, ``androidlab``, ...; runs only).
        task_id: The run's task id (runs only; splits never separate a task's runs).
        hard_case: The recorded critic's mistake this sample corrects (runs only):
            ``critic_good_on_root_cause`` or ``critic_bad_on_success``.
    """

    annotator_model: str | None = None
    annotator_kind: str | None = None
    request_hashes: tuple[str, ...] = ()
    source: str = "scalecua"
    benchmark: str | None = None
    task_id: str | None = None
    hard_case: str | None = None


@dataclass(frozen=True)
class SFTRecord:
    """One supervised sample: prompt (system + user parts), images, target, labels, provenance.

    Attributes:
        id: Stable sample id (per-sample seeds derive from it).
        kind: ``history`` or ``critique``.
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.
        prompt_version: Id of the template the prompt was built from, e.g. ``critic_critique_v1``.
        trajectory_id: Id of the source trajectory.
        episode_key: Episode grouping key (splits never separate an episode).
        step_index: Index of the step the sample is about.
        split: ``train``, ``val`` or ``test``.
        images: Referenced screenshots with their marks.
        system: System prompt text.
        user: User content in order: ``TextPart`` items and ``ImageSlot`` positions.
        target: Assistant target text (``<think>`` + ``<summary>``/``<criticism>``).
        labels: Verdict, dimension, masking and generator.
        provenance: Annotator model/kind and request hashes.
    """

    id: str
    kind: Kind
    platform: str
    prompt_version: str
    trajectory_id: str
    episode_key: str
    step_index: int
    split: str
    images: tuple[ImageRef, ...]
    system: str
    user: tuple[UserPart, ...]
    target: str
    labels: Labels = field(default_factory=Labels)
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        """Reject inconsistent records at construction, naming the field."""
        problem = _problem(self)
        if problem:
            raise RecordError(f"record {self.id!r}: {problem}")


def _problem(r: SFTRecord) -> str | None:
    if not r.id:
        return "`id` is empty"
    if r.platform not in PLATFORMS:
        return f"`platform` must be one of {sorted(PLATFORMS)}, got {r.platform!r}"
    if not r.prompt_version:
        return "`prompt_version` is empty"
    if r.step_index < 0:
        return f"`step_index` must be >= 0, got {r.step_index}"
    if r.kind not in KINDS:
        return f"`kind` must be one of {KINDS}, got {r.kind!r}"
    if r.split not in SPLITS:
        return f"`split` must be one of {SPLITS}, got {r.split!r}"
    slots = [p.index for p in r.user if isinstance(p, ImageSlot)]
    if slots != list(range(len(r.images))):
        return f"`user` must reference each of the {len(r.images)} images once, in order: {slots}"
    if any(IMAGE_TOKEN in p.text for p in r.user if isinstance(p, TextPart)):
        return f"`user` text contains the reserved token {IMAGE_TOKEN!r}"
    return _label_problem(r.kind, r.labels)


def _label_problem(kind: str, labels: Labels) -> str | None:
    if kind == "history":
        if labels.verdict is not None or labels.error_dimension is not None:
            return "history samples carry no verdict or error dimension"
        if labels.generator is not None:
            return "history samples carry no `labels.generator` (only Bad steps are generated)"
        return None
    if labels.verdict not in ("Good", "Bad"):
        return f"`labels.verdict` must be Good or Bad, got {labels.verdict!r}"
    if labels.verdict == "Good":
        if labels.error_dimension is not None:
            return "a Good sample has no error dimension"
        if labels.generator is not None:
            return "a Good sample has no `labels.generator` (only Bad steps are generated)"
        return None
    dim = lookup_dimension(labels.error_dimension or "")
    if dim is None or dim.name != labels.error_dimension:
        return (
            f"`labels.error_dimension` must be an exact dimension name: {labels.error_dimension!r}"
        )
    if labels.intent_masked and not dim.maskable:
        return f"{dim.name} samples must not be intent-masked"
    if labels.generator not in GENERATORS:
        # Reports split Bad samples by generator family; a missing family would vanish there.
        return f"a Bad sample needs `labels.generator` in {GENERATORS}, got {labels.generator!r}"
    return None


# ---------------------------------------------------------------------------------------------
# Messages


def record_messages(record: SFTRecord) -> list[ChatMessage]:
    """The record as chat messages: system, user (``ImagePart(ImageRef)`` at slots), assistant.

    This is the one conversion used by training and serving-side evaluation.

    Args:
        record: The sample.

    Returns:
        ``[system, user, assistant]`` messages.
    """
    user: list[TextPart | ImagePart] = [
        ImagePart(record.images[p.index]) if isinstance(p, ImageSlot) else p for p in record.user
    ]
    return [
        ChatMessage("system", [TextPart(record.system)]),
        ChatMessage("user", user),
        ChatMessage("assistant", [TextPart(record.target)]),
    ]


def record_from_messages(messages: Sequence[ChatMessage], target: str, **fields: Any) -> SFTRecord:
    """Build a record from builder output (``[system, user]``) and its target.

    Args:
        messages: A system message (text only) and a user message whose images are ``ImageRef``.
        target: The assistant target.
        **fields: The remaining ``SFTRecord`` fields (``id``, ``kind``, ``platform``,
            ``prompt_version``, ...).

    Returns:
        The record.

    Raises:
        RecordError: The messages are not ``[system, user]`` or hold non-``ImageRef`` images.
    """
    roles = [m.role for m in messages]
    if roles != ["system", "user"]:
        raise RecordError(f"expected [system, user] messages, got {roles}")
    system, user_msg = messages
    if system.images():
        raise RecordError("the system message must not hold images")
    images: list[ImageRef] = []
    user: list[UserPart] = []
    for part in user_msg.content:
        if isinstance(part, ImagePart):
            if not isinstance(part.image, ImageRef):
                raise RecordError("records reference images; materialised images are not allowed")
            user.append(ImageSlot(len(images)))
            images.append(part.image)
        else:
            user.append(part)
    return SFTRecord(
        system=system.text(), user=tuple(user), images=tuple(images), target=target, **fields
    )


# ---------------------------------------------------------------------------------------------
# Parquet shards

_MARK = pa.struct([("kind", pa.string()), ("coords", pa.list_(pa.int32()))])
_IMAGE = pa.struct([("path", pa.string()), ("marks", pa.list_(_MARK)), ("size_class", pa.string())])
_USER = pa.struct([("type", pa.string()), ("text", pa.string()), ("image", pa.int32())])
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("kind", pa.string()),
        ("platform", pa.string()),
        ("prompt_version", pa.string()),
        ("trajectory_id", pa.string()),
        ("episode_key", pa.string()),
        ("step_index", pa.int64()),
        ("split", pa.string()),
        ("images", pa.list_(_IMAGE)),
        ("system", pa.string()),
        ("user", pa.list_(_USER)),
        ("target", pa.string()),
        (
            "labels",
            pa.struct(
                [
                    ("verdict", pa.string()),
                    ("error_dimension", pa.string()),
                    ("intent_masked", pa.bool_()),
                    ("generator", pa.string()),
                ]
            ),
        ),
        (
            "provenance",
            pa.struct(
                [
                    ("annotator_model", pa.string()),
                    ("annotator_kind", pa.string()),
                    ("request_hashes", pa.list_(pa.string())),
                    ("source", pa.string()),
                    ("benchmark", pa.string()),
                    ("task_id", pa.string()),
                    ("hard_case", pa.string()),
                ]
            ),
        ),
    ]
)
"""Arrow schema of a shard (also what ``datasets`` sees)."""


def _mark_row(mark: Mark) -> dict[str, Any]:
    if isinstance(mark, PointMark):
        return {"kind": "point", "coords": [mark.x, mark.y]}
    return {"kind": "arrow", "coords": [mark.x1, mark.y1, mark.x2, mark.y2]}


def _mark_from_row(row: dict[str, Any]) -> Mark:
    coords = row["coords"]
    if row["kind"] == "point" and len(coords) == 2:
        return PointMark(*coords)
    if row["kind"] == "arrow" and len(coords) == 4:
        return ArrowMark(*coords)
    raise RecordError(f"bad mark row {row!r}")


def _to_row(r: SFTRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "kind": r.kind,
        "platform": r.platform,
        "prompt_version": r.prompt_version,
        "trajectory_id": r.trajectory_id,
        "episode_key": r.episode_key,
        "step_index": r.step_index,
        "split": r.split,
        "images": [
            {"path": i.path, "marks": [_mark_row(m) for m in i.marks], "size_class": i.size_class}
            for i in r.images
        ],
        "system": r.system,
        "user": [
            {"type": "image", "text": None, "image": p.index}
            if isinstance(p, ImageSlot)
            else {"type": "text", "text": p.text, "image": None}
            for p in r.user
        ],
        "target": r.target,
        "labels": {
            "verdict": r.labels.verdict,
            "error_dimension": r.labels.error_dimension,
            "intent_masked": r.labels.intent_masked,
            "generator": r.labels.generator,
        },
        "provenance": {
            "annotator_model": r.provenance.annotator_model,
            "annotator_kind": r.provenance.annotator_kind,
            "request_hashes": list(r.provenance.request_hashes),
            "source": r.provenance.source,
            "benchmark": r.provenance.benchmark,
            "task_id": r.provenance.task_id,
            "hard_case": r.provenance.hard_case,
        },
    }


def _from_row(row: dict[str, Any]) -> SFTRecord:
    images = tuple(
        ImageRef(
            path=i["path"],
            marks=tuple(_mark_from_row(m) for m in i["marks"]),
            size_class=i["size_class"],
        )
        for i in row["images"]
    )
    user = tuple(
        ImageSlot(p["image"]) if p["type"] == "image" else TextPart(p["text"]) for p in row["user"]
    )
    labels = row["labels"]
    prov = row["provenance"]
    return SFTRecord(
        id=row["id"],
        kind=row["kind"],
        platform=row["platform"],
        prompt_version=row["prompt_version"],
        trajectory_id=row["trajectory_id"],
        episode_key=row["episode_key"],
        step_index=row["step_index"],
        split=row["split"],
        images=images,
        system=row["system"],
        user=user,
        target=row["target"],
        labels=Labels(**labels),
        provenance=Provenance(
            annotator_model=prov["annotator_model"],
            annotator_kind=prov["annotator_kind"],
            request_hashes=tuple(prov["request_hashes"]),
            # Shards written before runs had provenance have no such fields.
            source=prov.get("source") or "scalecua",
            benchmark=prov.get("benchmark"),
            task_id=prov.get("task_id"),
            hard_case=prov.get("hard_case"),
        ),
    )


def write_records(
    records: Iterable[SFTRecord],
    out_dir: str | os.PathLike[str],
    shard_size: int = 10_000,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Write records as Parquet shards ``part-00000.parquet``, ... in input order.

    Each shard is written to a temporary file and renamed, so a crash never leaves a partial
    shard. The same records give byte-identical shards.

    Args:
        records: Records to write; ids must be unique.
        out_dir: Output directory (created if needed).
        shard_size: Records per shard.
        overwrite: Replace existing shards (stale ones beyond the new count are removed).

    Returns:
        The shard paths, in order.

    Raises:
        RecordError: Duplicate ids, a bad ``shard_size``, or shards already present.
    """
    if shard_size < 1:
        raise RecordError(f"`shard_size` must be >= 1, got {shard_size}")
    rows = list(records)
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise RecordError(f"duplicate record ids, e.g. {dupes}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(out.glob(SHARD_GLOB))
    if existing and not overwrite:
        raise RecordError(f"{out} already holds {len(existing)} shards (pass overwrite=True)")
    for stale in existing:
        stale.unlink()
    paths: list[Path] = []
    # At least one shard, so an empty dataset is still a readable (empty) table.
    for n, start in enumerate(range(0, max(len(rows), 1), shard_size)):
        chunk = rows[start : start + shard_size]
        table = pa.Table.from_pylist([_to_row(r) for r in chunk], schema=SCHEMA)
        path = out / f"part-{n:05d}.parquet"
        with atomic_path(path, mkdir=False) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        paths.append(path)
    logger.info("wrote %d records in %d shards to %s", len(rows), len(paths), out)
    return paths


def read_records(path: str | os.PathLike[str]) -> list[SFTRecord]:
    """Read records from one shard or from every ``part-*.parquet`` of a directory, in order.

    Args:
        path: A shard file or a directory of shards.

    Returns:
        The records.

    Raises:
        RecordError: No shards, an unreadable shard, or a row that is not a valid record.
    """
    src = Path(path)
    files = sorted(src.glob(SHARD_GLOB)) if src.is_dir() else [src]
    if not files or not files[0].exists():
        raise RecordError(f"no record shards at {src}")
    records: list[SFTRecord] = []
    for file in files:
        try:
            table = pq.read_table(file, schema=SCHEMA)
        except (OSError, pa.ArrowException) as e:
            raise RecordError(f"{file}: cannot read shard: {e}") from e
        for row in table.to_pylist():
            try:
                records.append(_from_row(row))
            except (KeyError, TypeError) as e:
                raise RecordError(f"{file}: malformed row: {e}") from e
    return records


# ---------------------------------------------------------------------------------------------
# LlamaFactory ShareGPT export


_CLEAN_FRAMES = 16
"""Decoded clean frames kept per export call; records come sorted by id, so the references to
one screenshot (its history and critique samples, each mark set) arrive close together."""


class _FrameSource:
    """Clean canonical frames by screenshot for one export.

    Each screenshot is decoded and resized once and marked on a copy per mark set, giving the
    same pixels as ``canonical_frame`` with the marks.
    """

    def __init__(
        self,
        image_root: Path,
        min_pixels: int,
        max_pixels: int,
        factor: int,
        policy: FramePolicy = CANONICAL,
    ) -> None:
        self.root = image_root
        self.bounds = (min_pixels, max_pixels, factor)
        self.policy = policy
        self._clean = FrameCache(max_items=_CLEAN_FRAMES)

    def frame(self, ref: ImageRef) -> Image.Image:
        """The canonical frame of ``ref`` with its marks drawn.

        Args:
            ref: Screenshot path (absolute, or relative to the image root) and marks.

        Returns:
            A new image; the cached clean frame is never drawn on.
        """
        if self.policy.geometry == "llamafactory":
            # LlamaFactory resizes what it is given: hand it the screenshot as the policy has
            # it before LlamaFactory's own steps (markers drawn on the original, if so), and
            # its resize and the processor's give the frames training sees here.
            src = Path(ref.path)
            original = load_image(src if src.is_absolute() else self.root / src)
            marks = ref.marks if self.policy.markers == "original" else ()
            return draw_marks(original, marks, self.policy.marker_class(ref.size_class)).image
        clean = self._clean.get(ref.path, lambda: self._canonical(ref.path))
        # Only the marks are drawn, on a copy. Not a second canonical_frame pass: smart_resize is
        # not idempotent where growing rounds up past max_pixels, so a second pass could resize
        # a frame training never resizes.
        return draw_marks(clean, ref.marks, ref.size_class).image

    def _canonical(self, path: str) -> Image.Image:
        min_pixels, max_pixels, factor = self.bounds
        src = Path(path)
        return canonical_frame(
            src if src.is_absolute() else self.root / src,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            factor=factor,
        )


def _frame_png(ref: ImageRef, frames_dir: Path, source: _FrameSource) -> Path:
    """Render one image as training sees it (canonical frame, then marks) under a stable name."""
    min_pixels, max_pixels, factor = source.bounds
    key = [ref.path, [_mark_row(m) for m in ref.marks], ref.size_class, min_pixels, max_pixels]
    if factor != 32:
        key.append(factor)  # names of the default factor stay as they were
    if source.policy != CANONICAL:
        key.append(asdict(source.policy))
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]
    out = frames_dir / f"{digest}.png"
    if not out.exists():
        try:
            frame = source.frame(ref)
        except ImageError as e:
            raise RecordError(f"image {ref.path!r}: {e}") from e
        write_atomic(out, encode_png(frame, FAST_PNG_LEVEL), durable=False, mkdir=False)
    return out


def to_sharegpt(
    records: Iterable[SFTRecord],
    image_root: str | os.PathLike[str],
    frames_dir: str | os.PathLike[str] | None = None,
    *,
    min_pixels: int = 65_536,
    max_pixels: int = 1_048_576,
    marked_dir: str | os.PathLike[str] | None = None,
    factor: int = 32,
    policy: FramePolicy = CANONICAL,
) -> list[dict[str, Any]]:
    """Export records as LlamaFactory ShareGPT rows.

    Row shape: ``{"system", "conversations": [{"from": "human", "value"}, {"from": "gpt",
    "value"}], "images": [...]}`` with one ``<image>`` token per image, where its slot is.
    Every image, marked or not, is rendered once through ``hivig.vision.canonical_frame`` (the
    frame training uses, then the marks) into ``frames_dir`` under a content-derived name and
    referenced there, so LlamaFactory gets the frames training uses for clean and marked images
    alike (with the same pixel bounds, its own resizing has nothing left to change).

    Args:
        records: Records to export.
        image_root: Directory relative image paths resolve against.
        frames_dir: Where the rendered PNGs are written; required when any record has images.
        min_pixels: Canonical-frame lower bound, in pixels.
        max_pixels: Canonical-frame upper bound, in pixels.
        marked_dir: Former name of ``frames_dir``, still accepted as a keyword.
        factor: Side multiple of the canonical frame, in pixels (32 for Qwen3-VL).
        policy: The frame policy of the records' profile. Under ``llamafactory`` geometry the
            screenshots are written as that geometry starts from (full resolution, markers
            drawn on it where the policy draws them first): LlamaFactory's own resize and the
            processor's then give the frames hivig trains on.

    Returns:
        One dict per record, in order (dump with ``json.dump`` for LlamaFactory).

    Raises:
        RecordError: A record has images and no ``frames_dir`` is given, both ``frames_dir`` and
            ``marked_dir`` are given, or an image cannot be loaded.
    """
    if frames_dir is not None and marked_dir is not None:
        raise RecordError("pass `frames_dir` only (`marked_dir` is its former name)")
    chosen = frames_dir if frames_dir is not None else marked_dir
    root = Path(image_root)
    frames = Path(chosen) if chosen is not None else None
    if frames is not None:
        frames.mkdir(parents=True, exist_ok=True)
    source = _FrameSource(root, min_pixels, max_pixels, factor, policy)
    rows: list[dict[str, Any]] = []
    for r in records:
        if r.images and frames is None:
            raise RecordError(
                f"record {r.id!r} has images; every image is rendered through the canonical "
                "frame for LlamaFactory, so pass `frames_dir`"
            )
        paths = [str(_frame_png(ref, frames, source)) for ref in r.images if frames is not None]
        human = "".join(IMAGE_TOKEN if isinstance(p, ImageSlot) else p.text for p in r.user)
        rows.append(
            {
                "system": r.system,
                "conversations": [
                    {"from": "human", "value": human},
                    {"from": "gpt", "value": r.target},
                ],
                "images": paths,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Dataset layout shared by data_gen (writer) and train (reader)

RECORDS_SUBDIR = "dataset/records"
"""Where a data_gen output directory keeps its record splits: ``<out>/dataset/records/<split>``."""
MANIFEST_NAME = "manifest.json"
"""File in the records folder naming the directory that relative image paths resolve against."""


def records_dir(data_dir: str | os.PathLike[str]) -> Path:
    """The records folder of a data_gen output directory (``<data_dir>/dataset/records``).

    Args:
        data_dir: A data_gen output directory (what training takes as ``data=``).

    Returns:
        The folder holding one sub-folder of Parquet shards per split.
    """
    return Path(data_dir) / RECORDS_SUBDIR


def write_manifest(
    records_root: str | os.PathLike[str],
    image_root: str | os.PathLike[str],
    *,
    final_root: str | os.PathLike[str] | None = None,
) -> None:
    """Record where the records' relative image paths resolve, relative to the records folder.

    A relative path keeps the pair (output folder, corpus) movable together.

    Args:
        records_root: The records folder to write the manifest into.
        image_root: The directory image paths are relative to (the corpus root).
        final_root: Where ``records_root`` will live once moved into place (writers that build
            in a temporary folder and rename it); defaults to ``records_root``.
    """
    root = Path(records_root)
    root.mkdir(parents=True, exist_ok=True)
    anchor = Path(final_root) if final_root is not None else root
    rel = os.path.relpath(Path(image_root).resolve(), anchor.resolve())
    text = json.dumps({"image_root": Path(rel).as_posix()}, indent=2) + "\n"
    (root / MANIFEST_NAME).write_text(text, encoding="utf-8")


def read_image_root(records_root: str | os.PathLike[str]) -> Path | None:
    """The image root a records folder's manifest names, or ``None`` without a manifest.

    Args:
        records_root: The records folder.

    Returns:
        The absolute-or-joined image root, resolved against ``records_root``.

    Raises:
        RecordError: The manifest exists but is not a JSON object with a string ``image_root``.
    """
    path = Path(records_root) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        raise RecordError(f"{path}: not JSON ({e})") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("image_root"), str):
        raise RecordError(f"{path}: expected an object with a string 'image_root'")
    return Path(records_root) / obj["image_root"]


PROFILE_DIR = "profile"
"""Sub-folder of a records folder holding the critic profile its samples are written in."""


def write_profile(records_root: str | os.PathLike[str], profile: Profile) -> None:
    """Record the critic profile of a records folder (its files, in ``profile/``).

    hivig's own profile is recorded too: a records folder then always says which interface its
    samples speak, and a checkpoint trained on it can say the same.

    Args:
        records_root: The records folder.
        profile: The profile its samples are written in.
    """
    profile.write(Path(records_root) / PROFILE_DIR)


def read_profile(records_root: str | os.PathLike[str]) -> Profile:
    """The critic profile a records folder was written in.

    hivig's own when none is recorded (folders written before profiles existed).

    Args:
        records_root: The records folder.

    Returns:
        The recorded profile, or the default one.

    Raises:
        ProfileError: A recorded profile is incomplete or invalid.
    """
    folder = Path(records_root) / PROFILE_DIR
    return load_profile(folder) if folder.is_dir() else default_profile()
