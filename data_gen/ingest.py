"""Ingest ScaleCUA-Data: ``meta.json`` + annotation JSONL + image roots -> trajectories.

    python -m data_gen ingest --root CORPUS --out OUT
    python -m data_gen ingest --root CORPUS --out OUT --platforms web android --shard 0/4
    python -m data_gen ingest --root CORPUS --out OUT --verify-images full

Writes ``OUT/trajectories.jsonl`` (one trajectory per line), ``OUT/quarantine.jsonl`` (one line
per rejected input line, with a stable reason code), ``OUT/stats.json`` (``lines == steps_kept +
Σ dropped``) and ``OUT/report.json`` (per-file scale decisions, scroll-sign decisions, skipped
meta entries, image checks). With ``--shard i/N`` the same files go to ``OUT/shard-i-of-N/``;
lines are assigned to shards by source folder, so every episode (and all its copies and
instruction variants) lands in exactly one shard.

Reconstruction follows the format notes (§5): a record whose history is ``None`` opens a
trajectory; a record attaches to the open trajectory with the same source folder and task whose
step count equals its history length. Boost-instruction variants differ by task text, so they
become parallel trajectories sharing one episode key. A bad step ends its trajectory: the good
prefix is kept and the later steps are quarantined as ``after_bad_step``.

Per file the coordinate scale is tallied over all records first (two passes, §7.2); per platform
and family the wheel-scroll sign is decided from the ``<operation>``/``<think>`` texts (§8.1).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image
from tqdm import tqdm

from data_gen.quarantine import Ledger, jsonl, split_lines, write_atomic
from hivig.actions import (
    Action,
    ActionError,
    CallUser,
    RawCall,
    Terminate,
    coordinate_values,
    detect_scale,
    normalise_calls,
    parse_scalecua_calls,
)
from hivig.logging import get_logger
from hivig.trajectory import Source, Step, Trajectory, episode_key, trajectory_id

log = get_logger(__name__)

PLATFORMS = ("windows", "mac", "ubuntu", "web", "android")
VERIFY_MODES = ("none", "header", "full")
# Platform names as they appear in meta keys, tasks and conv_styles (format notes §3.2).
_PLATFORM_ALIASES = {
    "windows": "windows",
    "win": "windows",
    "mac": "mac",
    "macos": "mac",
    "ubuntu": "ubuntu",
    "linux": "ubuntu",
    "web": "web",
    "android": "android",
    "mobile": "android",
    "iphone": "ios",
    "ios": "ios",
}
REASONS: dict[str, str] = {
    "empty_line": "blank line in an annotation file",
    "bad_json": "the line is not JSON",
    "bad_record": "not {image, conversations[2], width, height} or the image path escapes its root",
    "missing_task": "no 'Task:' (or empty task text) in the user turn",
    "missing_history": "no 'Previous operations:' block",
    "bad_history": "history entries are not numbered 1, 2, 3, ...",
    "missing_operation": "no <operation> in the response",
    "missing_action": "no <action> in the response",
    "bad_action": "an action line does not parse or has no Qwen3-VL equivalent",
    "call_user": "the step hands control to the user (call_user has no Qwen3-VL form to train on)",
    "coordinate_out_of_range": "a coordinate lies off screen after conversion",
    "ambiguous_scale": "the record's coordinate scale contradicts its file's",
    "missing_image": "the screenshot does not exist (also after the suffix lookup)",
    "corrupt_image": "the screenshot is not a readable PNG/JPEG (or is truncated)",
    "duplicate": "repeats an earlier line, or a position its trajectory already has",
    "no_trajectory_start": "a step whose trajectory was never opened by a first step",
    "history_gap": "earlier positions of the trajectory are missing",
    "history_mismatch": "a history line differs from the operation of that earlier step",
    "screen_size_mismatch": "width/height differ from the trajectory's earlier steps",
    "after_bad_step": "an earlier step of the same trajectory was rejected",
}
"""Quarantine reason codes (stable; counters and reports use them)."""
LONG_OPERATION_WORDS = 40
"""Operations longer than this are flagged (they tend to describe the screen, not the action)."""
SCROLL_MIN_EVIDENCE = 5
"""Classified scroll steps needed before any sign convention is decided (else kept as is)."""
SCROLL_SHARE = 0.9
"""Share of classified scroll steps that must agree before a sign convention is adopted (§8.1)."""
MIXED_SCALE_SHARE = 0.001
"""Files whose scale conflicts exceed this share of records are reported as mixed (§7.2)."""

# Action errors that keep their own code in the quarantine; everything else is ``bad_action``.
_OWN_REASONS = frozenset({"coordinate_out_of_range", "ambiguous_scale"})
_TAGS = ("think", "operation", "action")


def _tag_body(text: str, tag: str) -> str | None:
    """Body of the first ``<tag>…</tag>``; a linear scan, so unclosed tags cannot go quadratic."""
    start = text.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return None if end < 0 else text[start:end]
_STEP = re.compile(r"^\s*Step\s+(\d+)\s*[:.]\s?(.*)$")
_UP = re.compile(
    r"\bscroll\w*\s+(?:\w+\s+){0,3}?(?:up|upward|upwards)\b|toward(?:s)? the top", re.IGNORECASE
)
_DOWN = re.compile(
    r"\bscroll\w*\s+(?:\w+\s+){0,3}?(?:down|downward|downwards)\b|further down"
    r"|toward(?:s)? the bottom",
    re.IGNORECASE,
)


class IngestError(ValueError):
    """The corpus cannot be read at all (no or unreadable ``meta.json``, bad options)."""


@dataclass(frozen=True)
class IngestConfig:
    """Options of one ingest run."""

    platforms: tuple[str, ...] | None = None
    """Keep only these platforms (``None`` = all trajectory platforms)."""
    shard: tuple[int, int] = (0, 1)
    """``(i, N)``: process the source folders whose stable hash is ``i`` modulo ``N``."""
    verify_images: str = "header"
    """``header`` (signature, size and end marker), ``full`` (decode every image) or ``none``."""
    hswipe: str = "finger"
    """Horizontal swipe sign for the action normaliser: ``finger`` or ``reference``."""

    def __post_init__(self) -> None:
        i, n = self.shard
        if n < 1 or not 0 <= i < n:
            raise IngestError(f"`shard` must be i/N with 0 <= i < N, got {i}/{n}")
        if self.verify_images not in VERIFY_MODES:
            raise IngestError(f"`verify_images` must be one of {VERIFY_MODES}")
        if self.platforms is not None and set(self.platforms) - set(PLATFORMS):
            raise IngestError(f"`platforms` must be a subset of {PLATFORMS}")


@dataclass(frozen=True)
class Entry:
    """A ``meta.json`` entry that holds trajectory steps."""

    key: str
    annotation: str
    root: str
    platform: str
    family: str
    """``navigation`` (direct action) or ``planning_cot`` (reasoned action)."""


@dataclass
class Record:
    """One annotation line after the first pass (parsed, not yet normalised)."""

    line: int
    raw_hash: int
    error: tuple[str, str] | None = None
    image: str = ""
    folder: str | None = None
    """Source folder; ``None`` when the line cannot be attributed to any trajectory."""
    task: str = ""
    history: list[str] = field(default_factory=list)
    width: int = 0
    height: int = 0
    think: str | None = None
    operation: str = ""
    action_text: str = ""
    calls: list[RawCall] = field(default_factory=list)
    scale: str | None = None


@dataclass
class _Open:
    """A trajectory under reconstruction."""

    key: tuple[str, str]
    first_line: int
    width: int
    height: int
    steps: list[Step] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)
    broken: bool = False
    pointer: tuple[int, int] | None = None


# ------------------------------------------------------------------------ meta.json


def _tokens(*texts: str) -> list[str]:
    return [t for text in texts for t in re.split(r"[^a-z0-9]+", text.lower()) if t]


def classify_entry(key: str, value: Any) -> Entry | str:
    """A trajectory ``Entry`` for a meta.json item, or the reason it is skipped."""
    if not isinstance(value, dict):
        return "entry_not_an_object"
    annotation, root = value.get("annotation"), value.get("root")
    if not isinstance(annotation, str) or not isinstance(root, str):
        return "entry_missing_annotation_or_root"
    task, style = str(value.get("task", "")), str(value.get("conv_style", ""))
    words = _tokens(key, task, style)
    joined = " ".join(words)
    if "planning" in words:
        family = "planning_cot"
    elif "navigation" in words:
        family = "navigation"
    else:
        return "not_a_trajectory_family"
    if "wo history" in joined:
        return "without_history"  # position cannot be read from the prompt (§5.7)
    if "boost action" in joined or "boost instruction action" in joined:
        return "boost_action_unverified"  # semantics undocumented; excluded until inspected
    # The platform comes from meta.json (task first, then key, then conv_style), never file names.
    for text in (task, key, style):
        found = [_PLATFORM_ALIASES[t] for t in _tokens(text) if t in _PLATFORM_ALIASES]
        if found:
            platform = found[0]
            break
    else:
        return "unknown_platform"
    if platform not in PLATFORMS:
        return f"no_trajectories_for_{platform}"
    return Entry(key, annotation, root.rstrip("/"), platform, family)


def read_meta(root: Path) -> dict[str, Any]:
    """``root/meta.json`` as a dict; ``IngestError`` when missing or not a JSON object."""
    path = root / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IngestError(f"no meta.json in {root}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IngestError(f"unreadable meta.json: {exc}") from exc
    if not isinstance(meta, dict):
        raise IngestError("meta.json must be an object of entries")
    return meta


# ------------------------------------------------------------------------ first pass: parsing


def _unquote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def parse_prompt(human: str) -> tuple[str, list[str]] | tuple[str, str]:
    """(task, history) from a user turn, or (reason, message) on failure (format notes §4.1).

    Parsing is structural: the task is everything between ``Task:`` and ``Previous
    operations:``; a history entry starts at each ``Step <n>:`` line and continues over other
    lines; ``None`` means no history.
    """
    start = human.find("Task:")
    if start < 0:
        return "missing_task", "no 'Task:' in the user turn"
    end = human.find("Previous operations:", start)
    if end < 0:
        return "missing_history", "no 'Previous operations:' block"
    task = " ".join(human[start + 5 : end].split())
    if not task:
        return "missing_task", "empty task text"
    block = human[end + len("Previous operations:") :].strip()
    history: list[str] = []
    if block and block != "None":
        for line in block.splitlines():
            m = _STEP.match(line)
            if m:
                if int(m.group(1)) != len(history) + 1:
                    return "bad_history", f"history numbering breaks at 'Step {m.group(1)}'"
                history.append(m.group(2))
            elif line.strip():
                if not history:
                    return "bad_history", "history text before 'Step 1:'"
                history[-1] += " " + line.strip()
    return task, [_unquote(h) for h in history]


def _source_folder(image: str) -> str:
    """The path prefix before ``/images/``, else the image's directory (§5.1)."""
    head, sep, _ = image.rpartition("/images/")
    return head if sep else posixpath.dirname(image)


def parse_line(raw: str, line: int) -> Record:
    """First pass over one JSONL line: structure, prompt, response tags and call syntax."""
    # Python's string hash is 64-bit and stable within one run, which is all duplicate detection
    # needs (a 32-bit checksum would collide on files of a million lines).
    rec = Record(line, hash(raw))
    if not raw.strip():
        rec.error = ("empty_line", "blank line")
        return rec
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        rec.error = ("bad_json", f"not JSON: {exc}")
        return rec
    conv = obj.get("conversations") if isinstance(obj, dict) else None
    image = obj.get("image") if isinstance(obj, dict) else None
    w, h = (obj.get("width"), obj.get("height")) if isinstance(obj, dict) else (None, None)
    ok = (
        isinstance(conv, list)
        and len(conv) == 2
        and all(isinstance(c, dict) and isinstance(c.get("value"), str) for c in conv)
        and isinstance(image, str)
        and image
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (w, h))
    )
    if not ok:
        rec.error = ("bad_record", "expected image, 2 conversations, positive integer width/height")
        return rec
    norm = posixpath.normpath(image)
    if norm.startswith(("/", "../")) or norm == "..":
        rec.error = ("bad_record", f"image path escapes its root: {image!r}")
        return rec
    prompt = parse_prompt(conv[0]["value"])
    if isinstance(prompt[1], str):
        rec.error = prompt  # type: ignore[assignment]
        return rec
    rec.task, rec.history = prompt  # type: ignore[assignment]
    rec.image, rec.folder, rec.width, rec.height = norm, _source_folder(norm), w, h
    gpt = conv[1]["value"]
    tags = {t: (_tag_body(gpt, t) or "").strip() for t in _TAGS}
    rec.think = tags["think"] or None
    if not tags["operation"]:
        rec.error = ("missing_operation", "no <operation> in the response")
        return rec
    if not tags["action"]:
        rec.error = ("missing_action", "no <action> in the response")
        return rec
    rec.operation = tags["operation"]
    rec.action_text = tags["action"]
    calls = parse_scalecua_calls(rec.action_text)
    if isinstance(calls, ActionError):
        rec.error = ("bad_action", f"{calls.reason}: {calls.message}")
        return rec
    rec.calls = calls
    values = coordinate_values(calls)
    rec.scale = detect_scale(values)
    if rec.scale == "unit" and all(v in (0.0, 1.0) for v in values):
        rec.scale = None  # all-0/1 records fit any scale; the file decides (§7.2)
    return rec


def file_scale(records: list[Record]) -> tuple[str | None, dict[str, int]]:
    """The file's scale decision (majority of per-record decisions) and the tally."""
    tally = Counter(r.scale for r in records if r.scale is not None and r.error is None)
    if not tally:
        return None, {}
    order = {"unit": 0, "grid": 1, "pixel": 2}
    best = max(tally, key=lambda s: (tally[s], -order[s]))
    return best, dict(tally)


def scroll_direction(text: str) -> str | None:
    """``up``/``down`` if the text talks about scrolling one way only, else ``None``."""
    up, down = bool(_UP.search(text)), bool(_DOWN.search(text))
    return "up" if up and not down else "down" if down and not up else None


def scroll_decision(records: list[Record]) -> dict[str, Any]:
    """Decide the wheel-scroll sign convention from the texts of ``scroll`` steps (§8.1)."""
    agree = classified = 0
    for r in records:
        clicks = [c.kwargs.get("clicks") for c in r.calls if c.name == "scroll"]
        clicks = [c for c in clicks if isinstance(c, (int, float)) and c != 0]
        direction = scroll_direction(f"{r.operation} {r.think or ''}") if clicks else None
        if direction is None:
            continue
        classified += 1
        agree += (clicks[0] > 0) == (direction == "up")
    if not classified:
        decision = "no_evidence"
    elif classified < SCROLL_MIN_EVIDENCE:
        decision = "too_few"  # a handful of texts must not flip the sign of a whole family
    else:
        share = agree / classified
        decision = (
            "pyautogui"
            if share >= SCROLL_SHARE
            else "inverted"
            if share <= 1 - SCROLL_SHARE
            else "ambiguous"
        )
    return {"decision": decision, "classified": classified, "pyautogui_agree": agree}


# ------------------------------------------------------------------------ images


def sniff_image(path: str | os.PathLike, mode: str) -> tuple[int, int] | tuple[str, str]:
    """(width, height) of an image, or (reason, message) when it is missing or corrupt.

    ``header`` reads the PNG/JPEG signature and size from the first bytes and checks the end
    marker (IEND / EOI), which catches truncated files without decoding; ``full`` decodes.
    """
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            # A PNG's size is in its first 24 bytes; a JPEG's SOF marker may come after large
            # EXIF/ICC segments, so JPEGs get a longer look.
            head = f.read(32)
            if head[:2] == b"\xff\xd8":
                head += f.read(64 * 1024 - 32)
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64))
            tail = f.read()
    except FileNotFoundError:
        return "missing_image", f"no file {name}"
    except OSError as exc:
        return "missing_image", f"unreadable {name}: {exc.strerror}"
    dims = _png_size(head, tail) if head[:8] == b"\x89PNG\r\n\x1a\n" else _jpeg_size(head, tail)
    if isinstance(dims[0], str) or mode != "full":
        return dims
    try:
        with Image.open(path) as im:
            im.load()
            return im.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return "corrupt_image", f"{name} does not decode: {exc}"


def _png_size(head: bytes, tail: bytes) -> tuple[int, int] | tuple[str, str]:
    if len(head) < 24 or head[12:16] != b"IHDR":
        return "corrupt_image", "PNG without an IHDR header"
    if b"IEND" not in tail[-12:]:
        return "corrupt_image", "PNG truncated (no IEND chunk at the end)"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _jpeg_size(head: bytes, tail: bytes) -> tuple[int, int] | tuple[str, str]:
    if head[:2] != b"\xff\xd8":
        return "corrupt_image", "neither PNG nor JPEG signature"
    if b"\xff\xd9" not in tail:
        return "corrupt_image", "JPEG truncated (no end-of-image marker)"
    i = 2
    while i + 9 < len(head):
        if head[i] != 0xFF:
            return "corrupt_image", "JPEG marker stream broken"
        marker = head[i + 1]
        seg = int.from_bytes(head[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            return int.from_bytes(head[i + 7 : i + 9], "big"), int.from_bytes(
                head[i + 5 : i + 7], "big"
            )
        i += 2 + seg
    return "corrupt_image", "JPEG size not found in the first 64 KiB"


class ImageResolver:
    """Finds and checks screenshots, once per path, with the suffix fallback of §2.2."""

    def __init__(self, root: Path, mode: str) -> None:
        self.root = root
        # Plain string joins: pathlib objects cost more than the header read itself.
        self._base = str(root)
        self.mode = mode
        self._checked: dict[str, tuple[str, tuple]] = {}
        self._suffix: dict[str, dict[str, str | None]] = {}
        self.stats: Counter[str] = Counter()

    def check(self, entry_root: str, image: str, size: tuple[int, int]) -> tuple[str, tuple]:
        """(corpus-relative path, result) where result is (w, h) or (reason, message)."""
        rel = posixpath.normpath(f"{entry_root}/{image}")
        if rel not in self._checked:
            self._checked[rel] = self._check(rel, entry_root, image)
        path, result = self._checked[rel]
        if isinstance(result[0], int) and tuple(result) != size:
            self.stats["size_mismatch"] += 1
        return path, result

    def _check(self, rel: str, entry_root: str, image: str) -> tuple[str, tuple]:
        if self.mode == "none":
            return rel, ("unchecked", "unchecked")  # type: ignore[return-value]
        result = sniff_image(os.path.join(self._base, rel), self.mode)
        if result[0] == "missing_image":
            alt = self._by_suffix(entry_root, image)
            if alt is not None:
                self.stats["resolved_by_suffix"] += 1
                return alt, sniff_image(os.path.join(self._base, alt), self.mode)
        self.stats[result[0] if isinstance(result[0], str) else "ok"] += 1
        return rel, result

    def _by_suffix(self, entry_root: str, image: str) -> str | None:
        # Index the batch folder (data/data_YYYYMMDD) by the last three path parts, once.
        batch = "/".join(entry_root.split("/")[:2])
        if batch not in self._suffix:
            index: dict[str, str | None] = {}
            base = self.root / batch
            if base.is_dir():
                for p in base.rglob("*"):
                    if p.is_file():
                        rel = p.relative_to(self.root).as_posix()
                        tail = "/".join(rel.split("/")[-3:])
                        index[tail] = None if tail in index else rel  # None marks a collision
            self._suffix[batch] = index
        return self._suffix[batch].get("/".join(image.split("/")[-3:]))


# ------------------------------------------------------------------------ second pass


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


@dataclass
class FileReport:
    """What ingest found in one annotation file."""

    lines: int = 0
    scale: str | None = None
    scale_tally: dict[str, int] = field(default_factory=dict)
    scale_conflicts: int = 0
    mixed_scale: bool = False
    trajectories: int = 0
    flags: Counter[str] = field(default_factory=Counter)


class _FileIngest:
    """Second pass over one file: reconstruction, normalisation, image checks."""

    def __init__(
        self,
        entry: Entry,
        records: list[Record],
        ledger: Ledger,
        images: ImageResolver,
        cfg: IngestConfig,
        scroll_sign: int,
        report: FileReport,
    ) -> None:
        self.entry, self.records, self.ledger, self.images = entry, records, ledger, images
        self.cfg, self.scroll_sign, self.report = cfg, scroll_sign, report
        self.scale, report.scale_tally = file_scale(records)
        report.scale = self.scale
        # Ordered screenshot list per source folder over the whole file: the episode key must not
        # depend on which steps survive, or a truncated variant would leak across splits.
        shots: dict[str, dict[int, str]] = defaultdict(dict)
        for r in records:
            if r.folder is not None:
                shots[r.folder].setdefault(len(r.history), f"{entry.root}/{r.image}")
        self.keys = {f: episode_key(f, [s[p] for p in sorted(s)]) for f, s in shots.items()}

    def mine(self, rec: Record) -> bool:
        i, n = self.cfg.shard
        unit = rec.folder if rec.folder is not None else f"{self.entry.annotation}:{rec.line}"
        return n == 1 or _stable_hash(unit) % n == i

    def drop(self, rec: Record, reason: str, message: str) -> None:
        self.ledger.drop(self.entry.annotation, rec.line, reason, message)

    def run(self) -> list[dict]:
        open_: dict[tuple[str, str], _Open] = {}
        done: list[_Open] = []
        seen: set[int] = set()
        for rec in self.records:
            if not self.mine(rec):
                continue
            self.ledger.lines += 1
            self.report.lines += 1
            traj = self._attach(rec, open_, done, seen)
            if traj is None:
                continue
            if rec.error is not None:
                traj.broken = True
                self.drop(rec, *rec.error)
                continue
            problem = self._step(rec, traj)
            if problem is not None:
                traj.broken = True
                self.drop(rec, *problem)
        out = [self._finish(t) for t in sorted(done, key=lambda t: t.first_line) if t.steps]
        self.report.trajectories = len(out)
        return out

    def _attach(self, rec: Record, open_: dict, done: list, seen: set[int]) -> _Open | None:
        """The trajectory ``rec`` continues, or ``None`` after recording why it is dropped."""
        if rec.folder is None:
            self.drop(rec, *rec.error)  # type: ignore[misc]
            return None
        if rec.raw_hash in seen:
            self.drop(rec, "duplicate", "line repeats an earlier line of this file")
            return None
        seen.add(rec.raw_hash)
        key, p = (rec.folder, rec.task), len(rec.history)
        traj = open_.get(key)
        if p == 0:
            traj = _Open(key, rec.line, rec.width, rec.height)
            open_[key] = traj
            done.append(traj)
            return traj
        if traj is None:
            self.drop(rec, "no_trajectory_start", f"step {p + 1} without an open trajectory")
        elif traj.broken:
            self.drop(rec, "after_bad_step", "an earlier step of this trajectory was rejected")
        elif p < len(traj.steps):
            self.drop(rec, "duplicate", f"trajectory already has a step at position {p}")
        elif p > len(traj.steps):
            traj.broken = True
            self.drop(rec, "history_gap", f"positions {len(traj.steps)}..{p - 1} are missing")
        else:
            return traj
        return None

    def _step(self, rec: Record, traj: _Open) -> tuple[str, str] | None:
        """Validate and append one step; the (reason, message) when it is rejected."""
        for k, (said, did) in enumerate(zip(rec.history, traj.operations, strict=False)):
            if said != did:
                return "history_mismatch", f"history line {k + 1} differs from step {k + 1}"
        if (rec.width, rec.height) != (traj.width, traj.height):
            return (
                "screen_size_mismatch",
                f"{rec.width}x{rec.height} in a {traj.width}x{traj.height} trajectory",
            )
        flags: Counter[str] = Counter()
        actions = normalise_calls(
            rec.calls,
            self.entry.platform,
            rec.width,
            rec.height,
            self.scale,
            scroll_sign=self.scroll_sign,
            hswipe=self.cfg.hswipe,  # type: ignore[arg-type]
            pointer=traj.pointer,
            flags=flags,
        )
        if isinstance(actions, ActionError):
            if actions.reason == "ambiguous_scale":
                self.report.scale_conflicts += 1
            reason = actions.reason if actions.reason in _OWN_REASONS else "bad_action"
            return reason, f"{actions.reason}: {actions.message}"
        if any(isinstance(a, CallUser) for a in actions):
            return "call_user", "call_user() asks the user to take over; no tool call to learn"
        path, result = self.images.check(self.entry.root, rec.image, (rec.width, rec.height))
        if isinstance(result[0], str) and result[0] != "unchecked":
            return result  # type: ignore[return-value]
        # Data-quality counters of the format notes (§4.3, §6.1): positional arguments, aliases,
        # and operations long enough to describe the screen rather than the action.
        flags.update(f"positional:{c.name}" for c in rec.calls if c.positional)
        flags.update(f"alias:{c.alias}" for c in rec.calls if c.alias)
        if len(rec.operation.split()) > LONG_OPERATION_WORDS:
            flags["long_operation"] += 1
        self.report.flags.update(flags)
        traj.steps.append(
            Step(len(traj.steps), path, rec.think, rec.operation, actions, rec.action_text)
        )
        traj.operations.append(_unquote(rec.operation))
        traj.pointer = _last_point(actions) or traj.pointer
        self.ledger.kept += 1
        return None

    def _finish(self, t: _Open) -> dict:
        folder, task = t.key
        last = t.steps[-1].actions
        outcome = "unknown"
        if last and isinstance(last[-1], Terminate):
            outcome = "success" if last[-1].status == "success" else "failure"
        traj = Trajectory(
            id=trajectory_id(folder, task),
            episode_key=self.keys[folder],
            source=Source(self.entry.key, self.entry.annotation),
            platform=self.entry.platform,
            task=task,
            screen_w=t.width,
            screen_h=t.height,
            steps=t.steps,
            outcome=outcome,  # type: ignore[arg-type]
        )
        return traj.to_json()


def _last_point(actions: list[Action]) -> tuple[int, int] | None:
    for a in reversed(actions):
        if isinstance(a, Terminate):
            continue
        point = a.to_arguments().get("coordinate2") or a.to_arguments().get("coordinate")
        if point is not None:
            return int(point[0]), int(point[1])
    return None


# ------------------------------------------------------------------------ driver


@dataclass
class IngestResult:
    """Counts and the report of one run (also written to ``stats.json``/``report.json``)."""

    out_dir: Path
    stats: dict[str, Any]
    report: dict[str, Any]


def _read_lines(path: Path) -> list[str]:
    # Undecodable bytes become U+FFFD so the line is still counted (and fails as bad_json).
    return split_lines(path.read_bytes().decode("utf-8", errors="replace"))


def ingest(
    root: str | Path, out: str | Path, cfg: IngestConfig | None = None, progress: bool = True
) -> IngestResult:
    """Read a ScaleCUA-format corpus and write trajectories, quarantine, stats and report.

    Args:
        root: Corpus folder holding ``meta.json``.
        out: Output folder (the shard's subfolder is used when ``cfg.shard`` has N > 1).
        cfg: Run options.
        progress: Show a tqdm bar (stderr).

    Returns:
        The stats and report that were written.

    Raises:
        IngestError: ``meta.json`` is missing or unreadable.
        AccountingError: The counts identity fails (a bug; nothing is written).
    """
    cfg = cfg or IngestConfig()
    root, out_dir = Path(root), Path(out)
    i, n = cfg.shard
    if n > 1:
        out_dir = out_dir / f"shard-{i}-of-{n}"
    meta = read_meta(root)
    entries, skipped = [], {}
    for key in sorted(meta):
        got = classify_entry(key, meta[key])
        if isinstance(got, str):
            skipped[key] = got
        elif cfg.platforms is None or got.platform in cfg.platforms:
            entries.append(got)
        else:
            skipped[key] = "platform_not_selected"
    ledger, images = Ledger(), ImageResolver(root, cfg.verify_images)
    files: dict[str, FileReport] = {}
    scroll: dict[str, dict] = {}
    trajectories: list[dict] = []
    # Scroll-sign decisions are per (platform, family), so each group is parsed before any of
    # its files is normalised.
    groups: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        groups[(e.platform, e.family)].append(e)
    bar = tqdm(desc="ingest", unit="line", unit_scale=True, disable=not progress)
    for (platform, family), group in sorted(groups.items()):
        parsed: list[tuple[Entry, list[Record]]] = []
        for e in group:
            path = root / e.annotation
            if not path.is_file():
                skipped[e.key] = "missing_annotation_file"
                continue
            parsed.append((e, [parse_line(raw, k) for k, raw in enumerate(_read_lines(path), 1)]))
            bar.update(len(parsed[-1][1]))
        decision = scroll_decision([r for _, recs in parsed for r in recs if r.error is None])
        scroll[f"{platform}/{family}"] = decision
        sign = -1 if decision["decision"] == "inverted" else 1
        for e, recs in parsed:
            rep = files[e.annotation] = FileReport()
            trajectories += _FileIngest(e, recs, ledger, images, cfg, sign, rep).run()
            rep.mixed_scale = rep.scale_conflicts > MIXED_SCALE_SHARE * max(1, len(recs))
    bar.close()
    ledger.check()
    stats = {
        "lines": ledger.lines,
        "steps_kept": ledger.kept,
        "trajectories": len(trajectories),
        "dropped": dict(sorted(ledger.dropped.items())),
    }
    report = {
        "shard": f"{i}/{n}",
        "verify_images": cfg.verify_images,
        "files": {k: _file_json(v) for k, v in sorted(files.items())},
        "scroll_sign": scroll,
        "skipped_entries": dict(sorted(skipped.items())),
        "images": dict(sorted(images.stats.items())),
        "outcomes": dict(sorted(Counter(t["outcome"] for t in trajectories).items())),
    }
    write_atomic(out_dir / "trajectories.jsonl", jsonl(trajectories))
    write_atomic(out_dir / "quarantine.jsonl", jsonl(e.to_json() for e in ledger.sorted_entries()))
    write_atomic(out_dir / "report.json", json.dumps(report, indent=2) + "\n")
    write_atomic(out_dir / "stats.json", json.dumps(stats, indent=2) + "\n")
    return IngestResult(out_dir, stats, report)


def _file_json(r: FileReport) -> dict[str, Any]:
    return {
        "lines": r.lines,
        "trajectories": r.trajectories,
        "scale": r.scale,
        "scale_tally": r.scale_tally,
        "scale_conflicts": r.scale_conflicts,
        "mixed_scale": r.mixed_scale,
        "flags": dict(sorted(r.flags.items())),
    }
