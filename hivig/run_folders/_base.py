"""What every result-folder reader shares.

The step and run records, PNG sizes, JSONL lines, coordinates in the runner's own pixels,
scores.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import (
    Action,
    ActionError,
    RawCall,
    first_block,
    parse_agent_output,
)

# The tolerant readers' call lists (before the grid mapping): ingest-runs writes them out in
# ScaleCUA's own convention, so they are read here once, by the same code the grid actions use.
from hivig.actions.agent import (
    androidworld_object,
    osworld_calls,
    repair_calls,
    scalecua_calls,
)
from hivig.actions.androidworld import androidworld_calls
from hivig.vision import smart_resize

LAYOUTS = ("osworld", "windowsagentarena", "androidlab", "webarena")
"""Task-folder layouts read here (``androidworld`` files and ``trace`` files are read by
``read_androidworld`` and ``read_trace``)."""

OSWORLD_PLATFORM = "ubuntu"
"""OSWorld runs on an Ubuntu VM; its folders do not record the platform."""
DEFAULT_SCREEN = (1920, 1080)
"""OSWorld's default screen, used when no screenshot can be read to learn the size."""
ANDROIDWORLD_PIXELS = (3136, 2_109_744)
"""The ScaleCUA AndroidWorld agent's smart-resize budget (min, max pixels)."""

QWEN25_FACTOR = 28
"""Side multiple of the smart-resized frame the ScaleCUA agents of these benchmarks see."""
ANDROIDLAB_PIXELS = (3136, 2_109_744)
"""AndroidLab's smart-resize budget (min, max pixels): 1440x3120 -> 980x2128."""
WEBARENA_PIXELS = (3136, 2_007_040)
"""WebArenaLiteV2's smart-resize budget (min, max pixels): 1280x720 -> 1288x728."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_TEXT_CAP = 2000  # characters of a response kept as the step's thought
_WAA_SPECIAL = ("DONE", "FAIL", "WAIT")


@dataclass(frozen=True)
class FolderStep:
    """One executed step of a benchmark run.

    Attributes:
        index: 0-based position in the run.
        source_ref: Where the step came from (``file:line`` and the runner's own step number).
        screenshot: The screen the agent saw before acting, when on disk.
        raw_action: The action text as recorded.
        actions: The typed grid actions, or ``None`` when the text could not be read.
        parse_error: Why it could not be read (``reason: message``), else ``None``.
        thought: The agent's reasoning text, when recorded.
        intent: The agent's verbal intent (ScaleCUA ``<operation>``), when recorded.
        reward: The runner's reward after the step, when recorded.
        error: An execution error the runner recorded for the step.
        calls: The runner's calls with coordinates in screen pixels, after the runner's own
            conversion (resized frame -> device); ``None`` when the source holds grid actions
            only (a trace) or the text could not be read.
        verdicts: The critic's recorded verdicts on this step's action (traces), as
            ``{verdict, source, dimension, explanation, confidence}``.
        image: The screen as raw pixels ``(width, height, mode, bytes)`` when the source keeps
            arrays instead of files (AndroidWorld episodes), else ``None``.
    """

    index: int
    source_ref: str
    screenshot: Path | None
    raw_action: str
    actions: list[Action] | None
    parse_error: str | None = None
    thought: str | None = None
    intent: str | None = None
    reward: float | None = None
    error: str | None = None
    calls: tuple[RawCall, ...] | None = None
    verdicts: tuple[dict[str, Any], ...] = ()
    image: tuple[int, int, str, bytes] | None = None


@dataclass
class FolderRun:
    """One task's run as a benchmark folder records it.

    Attributes:
        layout: One of ``LAYOUTS``.
        folder: The task folder.
        task_id: The benchmark's task id (from the folder or the records).
        task: The instruction, when recorded.
        platform: ``windows``, ``android`` or ``web``.
        screen: ``(width, height)`` read from a screenshot header; ``None`` when none is readable.
        steps: The steps in order.
        final_screenshot: The screen after the last step, when on disk.
        outcome: ``success``, ``failure`` or ``unknown``.
        score: The benchmark's score for the task, when recorded.
        skipped: ``(where, reason, detail)`` of every line or item not used.
        notes: Facts about the folder worth stating (missing files, assumptions).
        finished: ``False`` when the runner's end-of-task file is missing (a run cut short).
        model: The agent model, when the source records it.
    """

    layout: str
    folder: Path
    task_id: str
    task: str | None
    platform: str
    screen: tuple[int, int] | None
    steps: list[FolderStep]
    final_screenshot: Path | None = None
    outcome: str = "unknown"
    score: float | None = None
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finished: bool = True
    model: str | None = None


# ---------------------------------------------------------------------------------------------
# Small readers


def png_size(path: Path) -> tuple[int, int] | None:
    """``(width, height)`` from a PNG's IHDR chunk, without decoding; ``None`` if not a PNG.

    Args:
        path: The file.

    Returns:
        The size, or ``None`` for a missing, short or non-PNG file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != _PNG_MAGIC or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return (width, height) if width > 0 and height > 0 else None


def read_jsonl_rows(
    path: Path, skipped: list[tuple[str, str, str]]
) -> list[tuple[int, dict[str, Any]]]:
    out: list[tuple[int, dict[str, Any]]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        skipped.append((path.name, "unreadable", str(e.strerror)))
        return out
    # Split on "\n" only: str.splitlines would also split on U+2028 and friends, which a JSON
    # writer may leave raw inside strings (the gateway's traces do).
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:
            skipped.append((where, "bad_json", str(e)[:200]))
            continue
        if not isinstance(obj, dict):
            skipped.append((where, "not_an_object", type(obj).__name__))
            continue
        out.append((number, obj))
    return out


def nonblank(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def capped_text(text: str | None) -> str | None:
    if text is None or len(text) <= _TEXT_CAP:
        return text
    return text[: _TEXT_CAP - 3] + "..."


def as_number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def file_in(folder: Path, name: object) -> Path | None:
    """``folder/name`` when ``name`` is a plain file name that exists there (never ``..``)."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in ("..", "."):
        return None
    path = folder / name
    return path if path.is_file() else None


def response_sections(response: str | None) -> tuple[str | None, str | None, str | None]:
    """``(think, operation, action)`` blocks of a ScaleCUA-style response."""
    if response is None:
        return None, None, None
    parts = [first_block(response, tag) for tag in ("think", "operation", "action")]
    think, operation, action = (p.strip() if p and p.strip() else None for p in parts)
    return think, operation, action


def parse_response(
    raw: str, fmt: str, platform: str, screen: tuple[int, int] | None, **kw: Any
) -> tuple[list[Action] | None, str | None]:
    if screen is None:
        return None, "no_screen: no readable screenshot gives the screen size"
    got = parse_agent_output(raw, fmt, platform=platform, width=screen[0], height=screen[1], **kw)
    if isinstance(got, ActionError):
        return None, f"{got.reason}: {got.message}"
    return got, None


_COORD_KEYS = ("x", "y")
_PAIR_KEYS = ("from_coord", "to_coord")


def _number_pair(value: object) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(as_number(v) is not None for v in value)
    )


def pixel_calls(
    text: str, fmt: str, scale: tuple[float, float] = (1.0, 1.0)
) -> tuple[RawCall, ...] | None:
    """The calls of one action text with coordinates in screen pixels.

    This is the runner's own conversion: coordinates written in a resized frame are multiplied
    by ``screen / frame`` per axis (ScaleCUA's AndroidLab, AndroidWorld and WebArenaLiteV2
    agents: ``x / resized_w * screen_w``, no rounding); screen-pixel code (OSWorld, WAA) is kept.

    Args:
        text: ScaleCUA ``<action>`` lines (``fmt`` ``scalecua``), pyautogui code
            (``osworld``) or an AndroidWorld ``Action: {...}`` answer (``androidworld``).
        fmt: ``scalecua``, ``osworld`` or ``androidworld``.
        scale: ``(screen_w / frame_w, screen_h / frame_h)``.

    Returns:
        The calls, or ``None`` when the text does not read.
    """
    if fmt == "androidworld":
        obj = androidworld_object(text)
        calls = obj if isinstance(obj, ActionError) else androidworld_calls(obj)
    else:
        calls = scalecua_calls(text) if fmt == "scalecua" else osworld_calls(text)
    if isinstance(calls, ActionError):
        return None
    if fmt == "osworld":
        calls = repair_calls(calls)
    sx, sy = scale
    out = []
    for call in calls:
        kw = dict(call.kwargs)
        for key, factor in zip(_COORD_KEYS, (sx, sy), strict=True):
            if as_number(kw.get(key)) is not None:
                kw[key] = kw[key] * factor
        for key in _PAIR_KEYS:
            if _number_pair(kw.get(key)):
                kw[key] = [kw[key][0] * sx, kw[key][1] * sy]
        out.append(RawCall(call.name, kw, call.alias, call.positional, call.line))
    return tuple(out)


def frame_ratio(
    screen: tuple[int, int] | None, frame: tuple[int, int] | None
) -> tuple[float, float]:
    if screen is None or frame is None:
        return 1.0, 1.0
    return screen[0] / frame[0], screen[1] / frame[1]


def resized_frame(
    screen: tuple[int, int] | None, budget: tuple[int, int]
) -> tuple[int, int] | None:
    """``(w, h)`` of the smart-resized frame the policy saw of ``screen``."""
    if screen is None:
        return None
    h, w = smart_resize(screen[1], screen[0], QWEN25_FACTOR, budget[0], budget[1])
    return w, h


def first_png_size(paths: list[Path | None]) -> tuple[int, int] | None:
    return next((s for p in paths if p is not None and (s := png_size(p))), None)


def read_score(path: Path, notes: list[str]) -> float | None:
    if not path.is_file():
        notes.append(f"no {path.name}; the outcome is unknown")
        return None
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        notes.append(f"{path.name} holds {text[:40]!r}, not a number; the outcome is unknown")
        return None


def outcome_of(score: float | None) -> str:
    return "unknown" if score is None else ("success" if score >= 1.0 else "failure")


def task_text(folder: Path) -> str | None:
    for name in ("task.json", "example.json", "config.json"):
        path = folder / name
        try:
            obj = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict) and nonblank(obj.get("instruction")):
            return obj["instruction"]
    return None
