"""First pass of ingest: meta.json entries, options, and parsing of one annotation line.

Everything here is per line and stateless: the user turn's task and history, the
response tags, the call syntax, and the evidence later tallied per file (coordinate
scale) and per platform family (wheel-scroll sign).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import (
    PLATFORM_ALIASES,
    PLATFORMS,
    ActionError,
    RawCall,
    coordinate_values,
    detect_scale,
    first_block,
    parse_scalecua_calls,
)
from hivig.files import split_lines

VERIFY_MODES = ("none", "header", "full")
# Platform names as they appear in meta keys, tasks and conv_styles: the shared aliases, plus
# iOS, which the corpus names and no action space covers (its lines are quarantined).
_PLATFORM_ALIASES: dict[str, str] = {**PLATFORM_ALIASES, "iphone": "ios", "ios": "ios"}
REASONS: dict[str, str] = {
    "empty_line": "blank line in an annotation file",
    "bad_encoding": "the line is not valid UTF-8 (its bytes are never guessed at)",
    "bad_json": "the line is not JSON (or nests deeper than the parser's recursion limit)",
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
    "bad_characters": "a string of the line holds a NUL byte or a lone surrogate (no valid "
    "UTF-8 text can carry it into the outputs)",
    "missing_image": "the screenshot does not exist (also after the suffix lookup)",
    "image_outside_corpus": "the screenshot path (or a symlink on it) leads out of the corpus",
    "image_not_a_file": "the screenshot is not a regular file (a FIFO, device or folder)",
    "corrupt_image": "the screenshot is not a readable PNG/JPEG (or is truncated)",
    "duplicate": "repeats an earlier line or step position, or belongs to a trajectory whose "
    "copy in another file is kept (the copy with <think>, then the longer one)",
    "no_trajectory_start": "a step whose trajectory was never opened by a first step",
    "history_gap": "earlier positions of the trajectory are missing",
    "history_mismatch": "a history line differs from the operation of that earlier step",
    "screen_size_mismatch": "width/height differ from the trajectory's earlier steps",
    "after_bad_step": "an earlier step of the same trajectory was rejected",
}
"""Quarantine reason codes (stable; counters and reports use them)."""
SCROLL_MIN_EVIDENCE = 5
"""Classified scroll steps needed before any sign convention is decided (else kept as is)."""
SCROLL_SHARE = 0.9
"""Share of classified scroll steps that must agree before a sign convention is adopted."""
MIXED_SCALE_SHARE = 0.001
"""Files whose scale conflicts exceed this share of records are reported as mixed."""

_TAGS = ("think", "operation", "action")


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


# ------------------------------------------------------------------------ meta.json


def _tokens(*texts: str) -> list[str]:
    return [t for text in texts for t in re.split(r"[^a-z0-9]+", text.lower()) if t]


def _inside(path: str) -> str | None:
    """``path`` normalised when it stays inside the corpus (relative, no ``..`` escape)."""
    # Windows spellings (``C:\\x``, ``..\\x``) are refused too, though POSIX reads them as names.
    for form in (path, path.replace("\\", "/")):
        norm = posixpath.normpath(form)
        if norm.startswith(("/", "../")) or norm == ".." or re.match(r"^[A-Za-z]:", norm):
            return None
    return posixpath.normpath(path)


def classify_entry(key: str, value: Any) -> Entry | str:
    """A trajectory ``Entry`` for a meta.json item, or the reason it is skipped."""
    if not isinstance(value, dict):
        return "entry_not_an_object"
    annotation, root = value.get("annotation"), value.get("root")
    if not isinstance(annotation, str) or not isinstance(root, str):
        return "entry_missing_annotation_or_root"
    # Ingest never reads outside the corpus: an absolute or ``..`` path in meta.json is a
    # broken (or hostile) entry, not a location to follow.
    annotation, root = _inside(annotation), _inside(root)  # type: ignore[assignment]
    if annotation is None or root is None:
        return "entry_path_escapes_corpus"
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
        return "without_history"  # position cannot be read from the prompt
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
    return Entry(key, annotation, "" if root == "." else root, platform, family)


def read_meta(root: Path) -> dict[str, Any]:
    """``root/meta.json`` as a dict; ``IngestError`` when missing or not a JSON object."""
    path = root / "meta.json"
    try:
        # utf-8-sig: a byte-order mark written by an editor is not part of the JSON.
        meta = json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise IngestError(f"no meta.json in {root}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise IngestError(f"unreadable meta.json: {exc}") from exc
    if not isinstance(meta, dict):
        raise IngestError("meta.json must be an object of entries")
    return meta


# ------------------------------------------------------------------------ first pass: parsing


def normalise_space(text: str) -> str:
    """Runs of whitespace as one space, no leading/trailing space."""
    return " ".join(text.split())


def history_matches(said: str, did: str) -> bool:
    """Whether history line ``said`` names operation ``did`` (both whitespace-normalised).

    Planning files quote their history lines (``Step 1: "Click 'OK'"``); only those surrounding
    quotes are stripped, never quotes inside the operation, and an operation that is itself
    wholly quoted still matches its unstripped history line.
    """
    if said == did:
        return True
    if len(said) >= 2 and said[0] == said[-1] and said[0] in "\"'":
        return said[1:-1].strip() == did
    return False


def parse_prompt(human: str) -> tuple[str, list[str]] | tuple[str, str]:
    """(task, history) from a user turn, or (reason, message) on failure.

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
    return task, [normalise_space(h) for h in history]


def _source_folder(image: str) -> str:
    """The path prefix before ``/images/``, else the image's directory."""
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
    except RecursionError:
        # ``[[[[…`` deeper than the interpreter's recursion limit; json raises this, not
        # ValueError.
        rec.error = ("bad_json", "nesting deeper than the JSON parser's recursion limit")
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
    bad_text = _bad_characters(image, conv[0]["value"], conv[1]["value"])
    if bad_text is not None:
        rec.error = ("bad_characters", bad_text)
        return rec
    norm = _inside(image)
    if norm is None:
        rec.error = ("bad_record", f"image path escapes its root: {image!r}")
        return rec
    prompt = parse_prompt(conv[0]["value"])
    if isinstance(prompt[1], str):
        rec.error = prompt  # type: ignore[assignment]
        return rec
    rec.task, rec.history = prompt  # type: ignore[assignment]
    rec.image, rec.folder, rec.width, rec.height = norm, _source_folder(norm), w, h
    gpt = conv[1]["value"]
    tags = {t: (first_block(gpt, t) or "").strip() for t in _TAGS}
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
        rec.scale = None  # all-0/1 records fit any scale; the file decides
    return rec


_UNWRITABLE = re.compile(r"[\x00\ud800-\udfff]")


def _bad_characters(*texts: str) -> str | None:
    """Why a string of the line cannot go into the outputs, or ``None``.

    JSON's ``\\u0000`` and lone ``\\ud800`` escapes parse into a NUL byte and an unpaired
    surrogate: the first breaks file paths and C-level readers, the second cannot be encoded as
    UTF-8 at all, so the write of the whole output would fail.
    """
    names = ("image path", "user turn", "response")
    for name, text in zip(names, texts, strict=False):
        m = _UNWRITABLE.search(text)
        if m is not None:
            what = "a NUL byte" if m.group() == "\x00" else "a lone surrogate"
            return f"the {name} holds {what} at character {m.start()}"
    return None


def bad_encoding_record(raw: str, line: int, message: str) -> Record:
    """The record of a line whose bytes are not UTF-8 (``raw`` is its lossy decoding)."""
    return Record(line, hash(raw), error=("bad_encoding", message))


def read_lines(path: Path) -> tuple[list[str], dict[int, str]]:
    """An annotation file's lines and, by 1-based line number, why a line is not UTF-8.

    Lines are split on ``\\n`` only (see ``split_lines``). A line with invalid UTF-8 is
    returned decoded with U+FFFD replacements (so duplicates still compare) and listed as
    ``bad_encoding``: a replacement character inside a JSON string would parse, and the step
    would be kept with text its annotator never wrote.
    """
    data = path.read_bytes()
    # A UTF-8 byte-order mark is not part of the first line (it would break its JSON and with
    # it the file's first trajectory).
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return split_lines(data.decode("utf-8")), {}
    except UnicodeDecodeError:
        pass  # the slow path below finds the offending lines one by one
    lines, bad = [], {}
    for n, chunk in enumerate(split_lines_bytes(data), 1):
        try:
            lines.append(chunk.decode("utf-8"))
        except UnicodeDecodeError as exc:
            lines.append(chunk.decode("utf-8", errors="replace"))
            bad[n] = f"invalid UTF-8 at byte {exc.start} of the line"
    return lines, bad


def split_lines_bytes(data: bytes) -> list[bytes]:
    """``split_lines`` on bytes (split on ``\\n``, one trailing ``\\r`` dropped)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


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
    """Decide the wheel-scroll sign convention from the texts of ``scroll`` steps."""
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
