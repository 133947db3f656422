"""Agent runs on disk -> plain step records: benchmark result folders and gateway traces.

Covers OSWorld, WindowsAgentArena, AndroidLab, WebArenaLiteV2, AndroidWorld and the gateway's
own session traces. Each benchmark writes one folder (or file) per task, in its own layout:

* **OSWorld** (``osworld``): ``traj.jsonl``, one line per executed action (``step_num``,
  ``action_timestamp``, ``action`` as pyautogui code or ``WAIT``/``DONE``/``FAIL``, ``reward``,
  ``done``, ``info``, ``screenshot_file`` = ``step_{n}_{ts}.png`` taken after it; many forks add
  ``response``), ``{"Error": ...}`` lines a crashed step leaves, and ``result.txt`` (the score).
* **WindowsAgentArena** (``windowsagentarena``): ``traj.jsonl`` with a reset line (``step_num``
  0, ``action`` null, ``screenshot`` = the first screen), then one line per executed action
  (``step_num``, ``action_timestamp``, ``action`` as pyautogui code or ``DONE``/``FAIL``/``WAIT``,
  ``reward``, ``done``, ``info``, ``screenshot`` = ``screenshot-step_N_ts.png`` taken after it,
  the agent's ``response``/``agent_raw_response``); ``result.txt`` holds the score.
* **AndroidLab** (``androidlab``): ``{task}_{ts}/traces/trace.jsonl``, one line per step
  (``index``, ``image`` = the screen before acting, saved under ``Screen/``, ``xml``,
  ``parsed_action`` = what the executor did, ``current_response`` = the agent's
  ``<think>/<operation>/<action>`` text, ``target`` = the instruction). Success is decided by a
  separate evaluation pass that writes ``results.jsonl`` lines (``task_id``, ``result.complete``).
* **WebArenaLiteV2** (``webarena``): ``results/{exp}/{task}/trajectory/{idx}.png`` (the screen
  before step ``idx``), ``result.json`` (``task``, and per step lists ``thought``,
  ``operation``, ``actions``), and ``results/{exp}/results.jsonl`` with the ``metric`` per task.
* **AndroidWorld** (``androidworld``): the checkpointer's ``{task}_{instance}.pkl.gz``, a
  gzipped pickle of a list of episode dicts (``goal``, ``task_template``, ``instance_id``,
  ``is_successful``, ``episode_data`` = per-step lists such as ``response``/``operation`` of the
  ScaleCUA agent or ``raw_screenshot``/``action_output`` of M3A-style agents). It is read with
  ``InertUnpickler``, which never imports or calls anything the file names (see there).
* **Gateway trace** (``trace``): ``<state_dir>/traces/<sid>.jsonl``, one event per line
  (``session``, ``observe``, ``critique``, ``close``), screenshots ``<state_dir>/images/<hex>.png``.

Platform and screen come from the run: the screen from the PNG header of a screenshot (no
decoding), the platform from the benchmark. A line that cannot be used is skipped with a reason,
never raised. Readers take one task folder; ``task_folders`` lists the task folders of a results
root. Only the standard library and ``hivig`` are used, so any stage can read these folders.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import pickle
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import (
    PLATFORMS,
    Action,
    ActionError,
    RawCall,
    Terminate,
    first_block,
    parse_agent_output,
    parse_osworld,
    parse_tool_calls,
)

# The tolerant readers' call lists (before the grid mapping): ingest-runs writes them out in
# ScaleCUA's own convention, so they are read here once, by the same code the grid actions use.
from hivig.actions.agent import (
    _androidworld_object,
    _osworld_calls,
    _repair_calls,
    _scalecua_calls,
)
from hivig.actions.androidworld import _translate as _androidworld_calls
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


def _jsonl(path: Path, skipped: list[tuple[str, str, str]]) -> list[tuple[int, dict[str, Any]]]:
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


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _cap(text: str | None) -> str | None:
    if text is None or len(text) <= _TEXT_CAP:
        return text
    return text[: _TEXT_CAP - 3] + "..."


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _inside(folder: Path, name: object) -> Path | None:
    """``folder/name`` when ``name`` is a plain file name that exists there (never ``..``)."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in ("..", "."):
        return None
    path = folder / name
    return path if path.is_file() else None


def _sections(response: str | None) -> tuple[str | None, str | None, str | None]:
    """``(think, operation, action)`` blocks of a ScaleCUA-style response."""
    if response is None:
        return None, None, None
    parts = [first_block(response, tag) for tag in ("think", "operation", "action")]
    think, operation, action = (p.strip() if p and p.strip() else None for p in parts)
    return think, operation, action


def _parsed(
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
        and all(_number(v) is not None for v in value)
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
        obj = _androidworld_object(text)
        calls = obj if isinstance(obj, ActionError) else _androidworld_calls(obj)
    else:
        calls = _scalecua_calls(text) if fmt == "scalecua" else _osworld_calls(text)
    if isinstance(calls, ActionError):
        return None
    if fmt == "osworld":
        calls = _repair_calls(calls)
    sx, sy = scale
    out = []
    for call in calls:
        kw = dict(call.kwargs)
        for key, factor in zip(_COORD_KEYS, (sx, sy), strict=True):
            if _number(kw.get(key)) is not None:
                kw[key] = kw[key] * factor
        for key in _PAIR_KEYS:
            if _number_pair(kw.get(key)):
                kw[key] = [kw[key][0] * sx, kw[key][1] * sy]
        out.append(RawCall(call.name, kw, call.alias, call.positional, call.line))
    return tuple(out)


def _frame_ratio(
    screen: tuple[int, int] | None, frame: tuple[int, int] | None
) -> tuple[float, float]:
    if screen is None or frame is None:
        return 1.0, 1.0
    return screen[0] / frame[0], screen[1] / frame[1]


def _resized(screen: tuple[int, int] | None, budget: tuple[int, int]) -> tuple[int, int] | None:
    """``(w, h)`` of the smart-resized frame the policy saw of ``screen``."""
    if screen is None:
        return None
    h, w = smart_resize(screen[1], screen[0], QWEN25_FACTOR, budget[0], budget[1])
    return w, h


def _first_size(paths: list[Path | None]) -> tuple[int, int] | None:
    return next((s for p in paths if p is not None and (s := png_size(p))), None)


def _score_file(path: Path, notes: list[str]) -> float | None:
    if not path.is_file():
        notes.append(f"no {path.name}; the outcome is unknown")
        return None
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        notes.append(f"{path.name} holds {text[:40]!r}, not a number; the outcome is unknown")
        return None


def _outcome(score: float | None) -> str:
    return "unknown" if score is None else ("success" if score >= 1.0 else "failure")


# ---------------------------------------------------------------------------------------------
# Detection


def detect_layout(path: Path) -> str | None:
    """The layout of one task folder (or of its record file), or ``None``.

    Args:
        path: A task folder, or its ``traj.jsonl`` / ``trace.jsonl`` / ``result.json``.

    Returns:
        ``osworld``, ``windowsagentarena``, ``androidlab``, ``webarena`` or ``None``.
    """
    if path.is_file():
        if path.name == "trace.jsonl" and path.parent.name == "traces":
            return "androidlab"
        if path.name == "result.json" and (path.parent / "trajectory").is_dir():
            return "webarena"
        if path.name == "traj.jsonl":
            return "windowsagentarena" if _is_waa(path) else "osworld"
        return None
    if (path / "traces" / "trace.jsonl").is_file():
        return "androidlab"
    if (path / "result.json").is_file() or (path / "trajectory" / "0.png").is_file():
        # result.json is written when the task ends: a run cut short has screenshots only.
        return "webarena" if (path / "trajectory").is_dir() else None
    if (path / "traj.jsonl").is_file():
        return "windowsagentarena" if _is_waa(path / "traj.jsonl") else "osworld"
    return None


def _is_waa(traj: Path) -> bool:
    """WindowsAgentArena names the screenshot ``screenshot`` (OSWorld: ``screenshot_file``)."""
    for _line, obj in _jsonl(traj, [])[:3]:
        if "screenshot_file" in obj:
            return False
        if "screenshot" in obj or "agent_raw_response" in obj:
            return True
    return False


def task_folders(root: Path) -> list[tuple[str, Path]]:
    """``(layout, folder)`` of every task folder directly under ``root`` (a results root).

    Args:
        root: A results folder holding one folder per task.

    Returns:
        The task folders in name order; empty when ``root`` holds none.
    """
    if not root.is_dir():
        return []
    found = []
    for child in sorted(root.iterdir()):
        layout = detect_layout(child) if child.is_dir() else None
        if layout is not None:
            found.append((layout, child))
    return found


def read_folder(path: Path) -> FolderRun:
    """Read one task folder of any layout.

    Args:
        path: The task folder (or its record file).

    Returns:
        The run.

    Raises:
        ValueError: The path is not a task folder of a known layout.
    """
    layout = detect_layout(path)
    folder = path
    if path.is_file():
        folder = path.parent.parent if layout == "androidlab" else path.parent
    if layout == "osworld":
        return read_osworld(folder)
    if layout == "windowsagentarena":
        return read_windowsagentarena(folder)
    if layout == "androidlab":
        return read_androidlab(folder)
    if layout == "webarena":
        return read_webarena(folder)
    raise ValueError(f"{path} is not a task folder of {', '.join(LAYOUTS)}")


# ---------------------------------------------------------------------------------------------
# OSWorld

_OSWORLD_INITIAL = ("step_0.png", "step_0_*.png", "initial*.png", "screenshot_0*.png")
_TASK_TEXT_FILES = ("instruction.txt", "task.txt")


def strip_thought_strings(code: str) -> str:
    """Blank out bare string statements (UI-TARS-style thought blocks) from pyautogui code.

    Args:
        code: The action code.

    Returns:
        The code with every top-level string-literal statement replaced by blank lines (line
        numbers are kept); the input unchanged when it does not parse.
    """
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines(keepends=True)
    drop: set[int] = set()
    for stmt in body:
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            drop.update(range(stmt.lineno - 1, (stmt.end_lineno or stmt.lineno)))
    if not drop:
        return code
    return "".join("\n" if i in drop else line for i, line in enumerate(lines))


def parse_osworld_action(code: str, width: int, height: int) -> list[Action] | ActionError:
    """Parse an OSWorld action (pyautogui code or WAIT/DONE/FAIL), ignoring thought strings.

    Args:
        code: The action text of a ``traj.jsonl`` line.
        width: Screen width in pixels.
        height: Screen height in pixels.

    Returns:
        The grid actions, or the ``ActionError`` of the text.
    """
    parsed = parse_osworld(code, width, height)
    if isinstance(parsed, ActionError) and parsed.reason == "unsupported_action":
        stripped = strip_thought_strings(code)
        if stripped != code:
            return parse_osworld(stripped, width, height)
    return parsed


def _osworld_code(action: object) -> str:
    """The action text of a traj.jsonl line: a string, or the code inside an action object."""
    if isinstance(action, str):
        return action
    if isinstance(action, dict):
        for key in ("command", "code", "action", "pyautogui", "python"):
            if isinstance(action.get(key), str):
                return action[key]
    return json.dumps(action, ensure_ascii=False)


def _response_texts(response: object) -> tuple[str | None, str | None]:
    """``(think, intent)`` from a ``response`` field that is a string or an object."""
    if isinstance(response, str):
        think, operation, _action = _sections(response)
        return _cap(think or _text(response)), operation
    if isinstance(response, dict):
        intent = _text(response.get("intent")) or _text(response.get("action_description"))
        for key in ("thought", "thoughts", "reasoning", "response", "content", "text"):
            if _text(response.get(key)):
                return _cap(response[key]), intent
        return _cap(json.dumps(response, ensure_ascii=False)), intent
    return None, None


def _info_error(info: object) -> str | None:
    if not isinstance(info, dict):
        return None
    for key, value in info.items():
        if "error" in str(key).lower() and value:
            return f"{key}: {value}"[:300]
    return None


def _osworld_task(folder: Path) -> str | None:
    task = _task_text(folder)
    if task is not None:
        return task
    for name in _TASK_TEXT_FILES:
        path = folder / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            if text:
                return text
    return None


def _initial_screenshot(folder: Path) -> Path | None:
    for pattern in _OSWORLD_INITIAL:
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
    return None


def read_osworld(folder: Path) -> FolderRun:
    """Read an OSWorld result folder (``traj.jsonl``, ``step_{n}_{ts}.png``, ``result.txt``).

    Every action line is one step (several lines may share a ``step_num`` when one response
    held several actions). The screenshot a line names is the screen *after* its action, so
    the screen before a step is the one after the step before; the first step has one only
    when the folder holds an initial screenshot (``step_0*.png``).

    Args:
        folder: The result folder holding ``traj.jsonl``.

    Returns:
        The run (platform ``ubuntu``); ``{"Error": ...}`` lines are in ``skipped``.
    """
    skipped: list[tuple[str, str, str]] = []
    notes: list[str] = []
    records: list[tuple[int, dict[str, Any], Path | None]] = []
    for number, obj in _jsonl(folder / "traj.jsonl", skipped):
        where = f"traj.jsonl:{number}"
        if "Error" in obj and "action" not in obj:
            skipped.append((where, "error_line", str(obj["Error"])[:300]))
            notes.append(f"the runner recorded an error: {str(obj['Error'])[:200]}")
            continue
        if "action" not in obj:
            skipped.append((where, "no_action", f"keys {sorted(obj)[:8]}"))
            continue
        records.append((number, obj, _inside(folder, obj.get("screenshot_file"))))
    screen = _first_size([p for _, _, p in records])
    if screen is None:
        notes.append(f"no readable screenshot; the screen is assumed {DEFAULT_SCREEN}")
    width, height = screen or DEFAULT_SCREEN
    before = _initial_screenshot(folder)
    steps: list[FolderStep] = []
    for number, obj, image in records:
        code = _osworld_code(obj["action"])
        parsed = parse_osworld_action(code, width, height)
        think, intent = _response_texts(obj.get("response"))
        ok = not isinstance(parsed, ActionError)
        steps.append(
            FolderStep(
                index=len(steps),
                source_ref=f"traj.jsonl:{number} step_num {obj.get('step_num')}",
                screenshot=before,
                raw_action=code,
                actions=parsed if ok else None,  # type: ignore[arg-type]
                parse_error=None if ok else f"{parsed.reason}: {parsed.message}",  # type: ignore[union-attr]
                thought=think,
                intent=intent,
                reward=_number(obj.get("reward")),
                error=_text(obj.get("Error")) or _info_error(obj.get("info")),
                calls=pixel_calls(strip_thought_strings(code), "osworld") if ok else None,
            )
        )
        before = image
    missing = sum(p is None for _, _, p in records)
    if missing:
        notes.append(f"{missing} step(s) have no readable screenshot file")
    if steps and steps[0].screenshot is None:
        notes.append("the folder has no initial screenshot; step 1 has no before-screen")
    score = _score_file(folder / "result.txt", notes)
    return FolderRun(
        "osworld",
        folder,
        folder.name,
        _osworld_task(folder),
        OSWORLD_PLATFORM,
        (width, height),
        steps,
        final_screenshot=before if steps else None,
        outcome=_outcome(score),
        score=score,
        skipped=skipped,
        notes=notes,
        finished=(folder / "result.txt").is_file(),
    )


# ---------------------------------------------------------------------------------------------
# WindowsAgentArena


def _waa_response(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(thought, intent)`` of a step line: the raw agent response, else ``response``."""
    raw = _text(obj.get("agent_raw_response"))
    response = obj.get("response")
    if raw is None and isinstance(response, str):
        raw = _text(response)
    if raw is None and isinstance(response, dict):
        raw = _text(response.get("agent_raw_response")) or _text(response.get("response"))
    think, operation, _action = _sections(raw)
    return _cap(think or raw), operation


def read_windowsagentarena(folder: Path) -> FolderRun:
    """Read a WindowsAgentArena task folder (``traj.jsonl``, screenshots, ``result.txt``).

    The screenshot a step line names is the screen after its action; the reset line's is the
    first screen, so step ``k`` is seen on the screenshot of the line before it.

    Args:
        folder: The task folder.

    Returns:
        The run (platform ``windows``).
    """
    skipped: list[tuple[str, str, str]] = []
    notes: list[str] = []
    lines = _jsonl(folder / "traj.jsonl", skipped)
    first: Path | None = None
    records: list[tuple[int, dict[str, Any], Path | None]] = []
    for number, obj in lines:
        where = f"traj.jsonl:{number}"
        shot = _inside(folder, obj.get("screenshot"))
        if isinstance(obj.get("screenshot"), str) and shot is None:
            notes.append(
                f"{where}: screenshot {str(obj['screenshot'])[:80]!r} is not in the folder"
            )
        if "action" in obj and obj["action"] is None:
            first = first or shot  # the reset line: the screen before step 1
            continue
        if not isinstance(obj.get("action"), str) or not obj["action"].strip():
            skipped.append((where, "no_action", f"keys {sorted(obj)[:8]}"))
            continue
        records.append((number, obj, shot))
    screen = _first_size([first, *(p for _, _, p in records)])
    steps: list[FolderStep] = []
    before = first
    for number, obj, shot in records:
        code = obj["action"].strip()
        actions, error = _parsed(code, "osworld", "windows", screen)
        calls = pixel_calls(code, "osworld") if actions is not None else None
        thought, intent = _waa_response(obj)
        info = obj.get("info")
        fault = (
            next(
                (f"{k}: {v}"[:300] for k, v in info.items() if "error" in str(k).lower() and v),
                None,
            )
            if isinstance(info, dict)
            else None
        )
        steps.append(
            FolderStep(
                index=len(steps),
                source_ref=f"traj.jsonl:{number} step_num {obj.get('step_num')}",
                screenshot=before,
                raw_action=code,
                actions=actions,
                parse_error=error,
                thought=thought,
                intent=intent,
                reward=_number(obj.get("reward")),
                error=fault,
                calls=calls,
            )
        )
        before = shot
    score = _score_file(folder / "result.txt", notes)
    return FolderRun(
        "windowsagentarena",
        folder,
        folder.name,
        _task_text(folder),
        "windows",
        screen,
        steps,
        final_screenshot=before if steps else None,
        outcome=_outcome(score),
        score=score,
        skipped=skipped,
        notes=notes,
        finished=(folder / "result.txt").is_file(),
    )


def _task_text(folder: Path) -> str | None:
    for name in ("task.json", "example.json", "config.json"):
        path = folder / name
        try:
            obj = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict) and _text(obj.get("instruction")):
            return obj["instruction"]
    return None


# ---------------------------------------------------------------------------------------------
# AndroidLab

_LAB_TS = re.compile(r"_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}$")


def _lab_image(folder: Path, value: object) -> Path | None:
    """A step's screenshot: the runner records its own absolute path; the file is in Screen/."""
    if not isinstance(value, str) or not value:
        return None
    return _inside(folder / "Screen", value.replace("\\", "/").rsplit("/", 1)[-1])


def _lab_result(folder: Path, task_id: str, notes: list[str]) -> tuple[str, float | None]:
    """Outcome from an evaluation ``results.jsonl`` next to the run, when one is found."""
    for place in (folder, folder.parent, folder.parent.parent):
        path = place / "results.jsonl"
        if not path.is_file():
            continue
        for _line, obj in _jsonl(path, []):
            result = obj.get("result")
            if obj.get("task_id") == task_id and isinstance(result, dict):
                complete = result.get("complete")
                if isinstance(complete, bool):
                    return ("success" if complete else "failure"), float(complete)
    notes.append("no evaluation results.jsonl names this task; the outcome is unknown")
    return "unknown", None


def read_androidlab(folder: Path) -> FolderRun:
    """Read an AndroidLab task folder (``traces/trace.jsonl``, ``Screen/*.png``).

    The agent's ``<action>`` is read in the smart-resized frame it saw (``ANDROIDLAB_PIXELS``);
    a step whose response has no ``<action>`` falls back to the executor's ``parsed_action``.

    Args:
        folder: The ``{task}_{timestamp}`` folder.

    Returns:
        The run (platform ``android``).
    """
    skipped: list[tuple[str, str, str]] = []
    notes: list[str] = []
    trace = folder / "traces" / "trace.jsonl"
    lines = _jsonl(trace, skipped)
    shots = [_lab_image(folder, obj.get("image")) for _, obj in lines]
    screen = _first_size(shots)
    frame = _resized(screen, ANDROIDLAB_PIXELS)
    task: str | None = None
    steps: list[FolderStep] = []
    for (number, obj), shot in zip(lines, shots, strict=True):
        where = f"trace.jsonl:{number}"
        task = task or _text(obj.get("target"))
        response = _text(obj.get("current_response"))
        think, operation, action = _sections(response)
        parsed = obj.get("parsed_action")
        if action is None and not isinstance(parsed, dict):
            skipped.append((where, "no_action", "neither an <action> nor a parsed_action"))
            continue
        if isinstance(obj.get("image"), str) and shot is None:
            notes.append(f"{where}: screenshot {obj['image'][-60:]!r} is not in Screen/")
        raw = action if action is not None else json.dumps(parsed, ensure_ascii=False)
        actions, error = (None, "no_action_text: only the executor's parsed_action")
        calls = None
        if action is not None and frame is not None:
            kw = {"coord_space": "resized_px", "frame": frame}
            actions, error = _parsed(action, "scalecua", "android", screen, **kw)
            if actions is not None:
                calls = pixel_calls(action, "scalecua", _frame_ratio(screen, frame))
        elif action is not None:
            error = "no_screen: no readable screenshot gives the screen size"
        steps.append(
            FolderStep(
                index=len(steps),
                source_ref=f"{where} index {obj.get('index')}",
                screenshot=shot,
                raw_action=raw,
                actions=actions,
                parse_error=error,
                thought=_cap(think or response),
                intent=operation,
                calls=calls,
            )
        )
    task_id = _LAB_TS.sub("", folder.name)
    outcome, score = _lab_result(folder, task_id, notes)
    end = sorted((folder / "Screen").glob("screenshot-end-*.png")) if steps else []
    return FolderRun(
        "androidlab",
        folder,
        task_id,
        task,
        "android",
        screen,
        steps,
        final_screenshot=end[-1] if end else None,
        outcome=outcome,
        score=score,
        skipped=skipped,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2


def _web_metric(folder: Path, notes: list[str]) -> float | None:
    path = folder.parent / "results.jsonl"
    metric = None
    if path.is_file():
        for _line, obj in _jsonl(path, []):
            save = obj.get("save_folder")
            if isinstance(save, str) and save.rstrip("/").rsplit("/", 1)[-1] == folder.name:
                metric = _number(obj.get("metric"))  # a rerun appends; the last line counts
    if metric is None:
        notes.append(f"{folder.parent.name}/results.jsonl has no metric for this task")
    return metric


def read_webarena(folder: Path) -> FolderRun:
    """Read a WebArenaLiteV2 task folder (``trajectory/{idx}.png``, ``result.json``).

    ``result.json`` keeps the agent's ``<action>`` text per step (``actions``), read in the
    smart-resized frame the agent saw (``WEBARENA_PIXELS``); ``trajectory/{idx}.png`` is the
    screen before step ``idx``.

    Args:
        folder: The ``results/{exp}/{task}`` folder.

    Returns:
        The run (platform ``web``).
    """
    skipped: list[tuple[str, str, str]] = []
    notes: list[str] = []
    result: Any = {}
    if not (folder / "result.json").is_file():
        notes.append("no result.json: the run did not finish, so no step was recorded")
    else:
        try:
            result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            skipped.append(("result.json", "bad_json", str(e)[:200]))
    if not isinstance(result, dict):
        skipped.append(("result.json", "not_an_object", type(result).__name__))
        result = {}
    actions_text = result.get("actions") if isinstance(result.get("actions"), list) else []
    thoughts = result.get("thought") if isinstance(result.get("thought"), list) else []
    operations = result.get("operation") if isinstance(result.get("operation"), list) else []
    shots = [_inside(folder / "trajectory", f"{k}.png") for k in range(len(actions_text) + 1)]
    screen = _first_size(shots)
    frame = _resized(screen, WEBARENA_PIXELS)
    steps: list[FolderStep] = []
    for k, text in enumerate(actions_text):
        if not _text(text):
            skipped.append((f"result.json actions[{k}]", "no_action", repr(text)[:80]))
            continue
        if shots[k] is None:
            notes.append(f"trajectory/{k}.png is missing")
        kw = {"coord_space": "resized_px", "frame": frame} if frame else {}
        actions, error = _parsed(text, "scalecua", "web", screen, **kw)
        calls = None
        if actions is not None and frame is not None:
            calls = pixel_calls(text, "scalecua", _frame_ratio(screen, frame))
        steps.append(
            FolderStep(
                index=len(steps),
                source_ref=f"result.json step {k}",
                screenshot=shots[k],
                raw_action=text,
                actions=actions,
                parse_error=error,
                thought=_cap(_text(thoughts[k]) if k < len(thoughts) else None),
                intent=_text(operations[k]) if k < len(operations) else None,
                calls=calls,
            )
        )
    metric = _web_metric(folder, notes)
    return FolderRun(
        "webarena",
        folder,
        str(result.get("task_id") or folder.name),
        _text(result.get("task")),
        "web",
        screen,
        steps,
        final_screenshot=shots[len(actions_text)] if actions_text else None,
        outcome=_outcome(metric),
        score=metric,
        skipped=skipped,
        notes=notes,
        finished=(folder / "result.json").is_file(),
    )


# ---------------------------------------------------------------------------------------------
# AndroidWorld checkpoints (gzipped pickles, read inertly)

_MAX_PICKLE_BYTES = 4 << 30  # a task's episodes with raw screenshots stay well under this


class Pickled:
    """Stand-in for any object a pickle names: class path, arguments and state, nothing run.

    Attributes:
        module: The module the pickle named.
        qualname: The name it named in that module.
        args: The arguments the pickle passed to it.
        state: What the pickle set as the object's state.
        items: Values appended to it (list-like objects).
        mapping: Items set on it (dict-like objects).
    """

    module = ""
    qualname = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Pickled:  # noqa: D102
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items, obj.mapping = args, None, [], {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: ``__new__`` kept the arguments."""

    def __setstate__(self, state: Any) -> None:
        """Keep the state; never interpreted."""
        self.state = state

    def append(self, value: Any) -> None:
        """Keep an appended value."""
        self.items.append(value)

    def extend(self, values: Any) -> None:
        """Keep appended values."""
        self.items.extend(values)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Keep a set item."""
        self.mapping[key] = value


class InertUnpickler(pickle.Unpickler):
    """An unpickler that imports and calls nothing the file names.

    Plain containers, strings, numbers and bytes load as themselves. Every global the stream
    names (``numpy`` arrays, ``datetime``, an agent's dataclasses, and equally ``os.system``)
    becomes a fresh ``Pickled`` subclass that only records its arguments and state, so a hostile
    file cannot run code; numpy arrays and scalars are decoded from their recorded state by
    ``array_pixels`` and ``plain``.
    """

    def find_class(self, module: str, name: str) -> type:  # noqa: D102
        return type(name, (Pickled,), {"module": module, "qualname": name})

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise pickle.UnpicklingError("persistent ids are not supported")


def load_pickle_inert(data: bytes) -> Any:
    """Unpickle ``data`` with ``InertUnpickler``.

    Args:
        data: The pickle bytes.

    Returns:
        The object tree (unknown classes as ``Pickled``).

    Raises:
        pickle.UnpicklingError: The stream is malformed (also for truncated streams, via the
            ``EOFError``/``ValueError`` family the caller catches).
    """
    return InertUnpickler(io.BytesIO(data)).load()


def _dtype(obj: Any) -> str | None:
    if isinstance(obj, Pickled) and obj.qualname == "dtype" and obj.args:
        return str(obj.args[0])
    return None


_SCALARS = {"f8": "<d", "f4": "<f", "i8": "<q", "i4": "<i", "u1": "<B", "b1": "<?"}


def plain(value: Any) -> Any:
    """A numpy scalar recorded by ``InertUnpickler`` as its Python number; else the value."""
    if isinstance(value, Pickled) and value.qualname == "scalar" and len(value.args) == 2:
        code = _SCALARS.get((_dtype(value.args[0]) or "").lstrip("<>|="))
        raw = value.args[1]
        if code and isinstance(raw, bytes) and len(raw) == struct.calcsize(code):
            return struct.unpack(code, raw)[0]
    return value


def array_pixels(value: Any) -> tuple[int, int, str, bytes] | None:
    """``(width, height, mode, bytes)`` of a recorded uint8 ``(H, W, 3|4)`` numpy array."""
    if not (isinstance(value, Pickled) and value.qualname == "_reconstruct"):
        return None
    state = value.state
    if not (isinstance(state, tuple) and len(state) == 5):
        return None
    _version, shape, dtype, fortran, raw = state
    ok = isinstance(shape, tuple) and len(shape) == 3 and shape[2] in (3, 4) and not fortran
    if not ok or (_dtype(dtype) or "").lstrip("|") != "u1" or not isinstance(raw, bytes):
        return None
    height, width, channels = shape
    if len(raw) != height * width * channels or width <= 0 or height <= 0:
        return None
    return width, height, "RGB" if channels == 3 else "RGBA", raw


def read_androidworld(path: Path) -> list[FolderRun]:
    """Read one AndroidWorld checkpoint file (``{task}_{instance}.pkl.gz``) inertly.

    Per step the agent's text is ``response`` (ScaleCUA's ``<operation>/<action>``, read in the
    smart-resized frame, ``ANDROIDWORLD_PIXELS``) or ``action_output`` (``Reason: ... Action:
    {...}`` in device pixels). The screen before a step is ``raw_screenshot`` when the agent
    keeps it, else ``<file stem>/screenshot_{n}.png`` (n = 1.., the ScaleCUA agent's
    ``save_dir`` naming) next to the file.

    Args:
        path: The ``.pkl.gz`` file.

    Returns:
        One run per episode; an unreadable file gives one run with no steps and the reason
        in ``skipped``.
    """
    stem = path.name.removesuffix(".pkl.gz")
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(_MAX_PICKLE_BYTES + 1)
        if len(data) > _MAX_PICKLE_BYTES:
            raise ValueError("larger than the read limit")
        episodes = load_pickle_inert(data)
    except (OSError, EOFError, ValueError, pickle.UnpicklingError, zlib.error) as e:
        run = FolderRun("androidworld", path, stem, None, "android", None, [], finished=False)
        run.skipped.append((path.name, "unreadable_file", str(e)[:200]))
        return [run]
    if isinstance(episodes, dict):
        episodes = [episodes]
    if not isinstance(episodes, list):
        run = FolderRun("androidworld", path, stem, None, "android", None, [], finished=False)
        run.skipped.append((path.name, "not_episodes", type(episodes).__name__))
        return [run]
    return [_androidworld_episode(path, stem, k, ep) for k, ep in enumerate(episodes)]


def _step_lists(data: dict[str, Any]) -> tuple[int, dict[str, list[Any]]]:
    lists = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list)}
    steps = len(lists.get("step_number") or []) or max((len(v) for v in lists.values()), default=0)
    return steps, lists


def _androidworld_episode(path: Path, stem: str, k: int, ep: Any) -> FolderRun:
    where = f"{path.name}[{k}]"
    ep = ep if isinstance(ep, dict) else {}
    template = _text(ep.get("task_template")) or stem
    instance = plain(ep.get("instance_id"))
    task_id = f"{template}_{instance}" if isinstance(instance, int) else f"{stem}_{k}"
    run = FolderRun("androidworld", path, task_id, _text(ep.get("goal")), "android", None, [])
    run.model = _text(ep.get("agent_name"))
    success = _number(plain(ep.get("is_successful")))
    data = ep.get("episode_data")
    if success is None or success != success or not isinstance(data, dict):  # NaN: it crashed
        run.finished = False
        info = str(ep.get("exception_info") or "no episode data")[:200]
        run.skipped.append((where, "episode_failed", info))
        return run
    run.score, run.outcome = success, "success" if success >= 1.0 else "failure"
    count, lists = _step_lists(data)

    def at(key: str, i: int) -> Any:
        values = lists.get(key) or []
        return values[i] if i < len(values) else None

    shots = [array_pixels(at("raw_screenshot", i)) for i in range(count)]
    files = [_inside(path.parent / stem, f"screenshot_{i + 1}.png") for i in range(count)]
    sized = next((s[:2] for s in shots if s), None) or _first_size(files)
    run.screen = sized
    frame = _resized(sized, ANDROIDWORLD_PIXELS)
    for i in range(count):
        response, output = _text(at("response", i)), _text(at("action_output", i))
        think, operation, action = _sections(response)
        if action is None and output is None:
            run.skipped.append((f"{where} step {i}", "no_action", "no <action> or action_output"))
            continue
        if action is not None:
            kw: dict[str, Any] = {"coord_space": "resized_px", "frame": frame} if frame else {}
            raw, fmt, ratio = action, "scalecua", _frame_ratio(sized, frame)
        else:
            kw, raw, fmt, ratio = {}, output, "androidworld", (1.0, 1.0)
            think, operation = _text(at("action_reason", i)), _text(at("summary", i))
        actions, error = _parsed(raw, fmt, "android", sized, **kw)  # type: ignore[arg-type]
        run.steps.append(
            FolderStep(
                index=len(run.steps),
                source_ref=f"{where} step {i}",
                screenshot=files[i] if shots[i] is None else None,
                raw_action=raw,  # type: ignore[arg-type]
                actions=actions,
                parse_error=error,
                thought=_cap(think),
                intent=_text(operation) or _text(at("operation", i)),
                calls=pixel_calls(raw, fmt, ratio) if actions is not None else None,  # type: ignore[arg-type]
                image=shots[i],
            )
        )
    return run


# ---------------------------------------------------------------------------------------------
# Gateway session traces


def trace_image(images: Path, ref: object) -> Path | None:
    """The screenshot file of a trace ``image_ref`` (``sha256:<hex>``), when it exists.

    Args:
        images: The state folder's ``images/``.
        ref: The recorded reference.

    Returns:
        ``images/<hex>.png``, or ``None`` for a malformed reference or a missing file.
    """
    if not isinstance(ref, str) or not ref.startswith("sha256:"):
        return None
    digest = ref.split(":", 1)[1]
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        return None
    path = images / f"{digest}.png"
    return path if path.is_file() else None


def trace_action(obj: object) -> tuple[str, str | None, list[Action] | None, str | None]:
    """``(raw, intent, actions, parse_error)`` of a trace action object.

    Args:
        obj: The ``prev_action`` of an observe event or the ``action`` of a critique event.

    Returns:
        The action text, its intent, the grid actions (``None`` when unreadable) and why.
    """
    if not isinstance(obj, dict):
        return "", None, None, "missing action"
    text = _text(obj.get("action_text")) or _text(obj.get("raw")) or ""
    intent = _text(obj.get("intent"))
    recorded_error = _text(obj.get("parse_error"))
    parsed = parse_tool_calls(text) if text else ActionError("empty", "no action text")
    if isinstance(parsed, ActionError):
        return text, intent, None, recorded_error or f"{parsed.reason}: {parsed.message}"
    return text, intent, parsed, recorded_error


def trace_verdict(obj: object) -> dict[str, Any] | None:
    """A critique's verdict as ``{verdict, source, dimension, explanation, confidence}``."""
    if not isinstance(obj, dict) or obj.get("verdict") not in ("good", "bad", "abstain"):
        return None
    return {
        "verdict": obj["verdict"],
        "source": str(obj.get("source") or "model"),
        "dimension": _text(obj.get("error_dimension")),
        "explanation": _text(obj.get("explanation")) or "",
        "confidence": _number(obj.get("confidence")),
    }


def trace_session_fields(
    session: dict[str, Any] | None, notes: list[str]
) -> tuple[str | None, str, tuple[int, int]]:
    """``(task, platform, screen)`` of a trace's session event (assumed when absent).

    Args:
        session: The first ``session`` event, or ``None``.
        notes: Receives what had to be assumed.

    Returns:
        The task text, the platform and ``(width, height)``.
    """
    if session is None:
        notes.append("the trace has no session event; platform and screen are assumed")
        return None, OSWORLD_PLATFORM, DEFAULT_SCREEN
    platform = {"macos": "mac", "linux": "ubuntu"}.get(session.get("platform"))
    platform = platform or session.get("platform")
    if platform not in PLATFORMS:
        notes.append(f"unknown platform {session.get('platform')!r}; assumed {OSWORLD_PLATFORM}")
        platform = OSWORLD_PLATFORM
    screen = session.get("screen")
    size = DEFAULT_SCREEN
    if isinstance(screen, dict):
        w, h = screen.get("w"), screen.get("h")
        if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0:
            size = (w, h)
    return _text(session.get("task")), str(platform), size


@dataclass
class TraceEvents:
    """A trace's events grouped by kind (the first session, observes and critiques by step).

    Attributes:
        session: The first ``session`` event.
        observes: The first ``observe`` per ``step_idx`` (observe is idempotent per step).
        critiques: Every ``critique`` per ``step_idx``, in file order.
        close: The last ``close`` event.
        skipped: Lines not used, ``(where, reason, detail)``.
    """

    session: dict[str, Any] | None = None
    observes: dict[int, dict[str, Any]] = field(default_factory=dict)
    critiques: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    close: dict[str, Any] | None = None
    skipped: list[tuple[str, str, str]] = field(default_factory=list)


def trace_events(path: Path) -> TraceEvents:
    """Group the events of one trace file.

    Args:
        path: The ``traces/<sid>.jsonl`` file.

    Returns:
        The events; bad lines, bad ``step_idx`` and unknown events are in ``skipped``.
    """
    ev = TraceEvents()
    for number, obj in _jsonl(path, ev.skipped):
        where = f"{path.name}:{number}"
        event, idx = obj.get("event"), obj.get("step_idx")
        if event == "session":
            ev.session = ev.session or obj
        elif event == "close":
            ev.close = obj
        elif event in ("observe", "critique"):
            if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
                ev.skipped.append((where, "bad_step_idx", f"step_idx {idx!r}"))
            elif event == "observe":
                ev.observes.setdefault(idx, obj)
            else:
                ev.critiques.setdefault(idx, []).append(obj)
        else:
            ev.skipped.append((where, "unknown_event", f"event {event!r}"))
    return ev


def matching_verdicts(critiques: list[dict[str, Any]], raw: str) -> list[dict[str, Any]]:
    """The verdicts on action text ``raw`` among one step's critiques, in file order."""
    out = []
    for crit in critiques:
        action = crit.get("action")
        if isinstance(action, dict) and (action.get("action_text") or action.get("raw")) == raw:
            verdict = trace_verdict(crit.get("verdict"))
            if verdict is not None:
                out.append(verdict)
    return out


_OUTCOMES = ("success", "failure")


def read_trace(path: Path) -> FolderRun:
    """Read a gateway session trace as a run of executed steps.

    Step ``k`` (screen ``k`` observed, then an action executed) takes its action from the
    ``prev_action`` of observe ``k + 1`` and its verdicts from the critiques at ``k`` of that
    same action text. A critique at the last screen is a step only when its action ends the
    task (``terminate``); otherwise whether it ran is unknown and it is skipped. The outcome is
    the ``outcome`` a runner reported on the close event, else ``failure`` for a run that ends
    in ``terminate(failure)``, else ``unknown``.

    Args:
        path: The ``traces/<sid>.jsonl`` file.

    Returns:
        The run (``finished`` is ``False`` without a close event).
    """
    ev = trace_events(path)
    notes: list[str] = []
    images = path.parent.parent / "images"
    task, platform, screen = trace_session_fields(ev.session, notes)
    steps: list[FolderStep] = []
    last = max(ev.observes) if ev.observes else -1
    for k in range(last):
        nxt = ev.observes.get(k + 1)
        if nxt is None:
            ev.skipped.append((f"step_idx {k + 1}", "missing_observe", "no observe event"))
            continue
        raw, intent, actions, error = trace_action(nxt.get("prev_action"))
        before = trace_image(images, (ev.observes.get(k) or {}).get("image_ref"))
        steps.append(
            FolderStep(
                index=len(steps),
                source_ref=f"trace step_idx {k} -> {k + 1}",
                screenshot=before,
                raw_action=raw,
                actions=actions,
                parse_error=error,
                intent=intent,
                verdicts=tuple(matching_verdicts(ev.critiques.get(k, []), raw)),
            )
        )
    final = ev.critiques.get(last, []) if last >= 0 else []
    if final:
        raw, intent, actions, error = trace_action(final[-1].get("action"))
        if actions and isinstance(actions[-1], Terminate):
            shot = trace_image(images, final[-1].get("image_ref"))
            steps.append(
                FolderStep(
                    index=len(steps),
                    source_ref=f"trace step_idx {last} (last critique)",
                    screenshot=shot or trace_image(images, ev.observes[last].get("image_ref")),
                    raw_action=raw,
                    actions=actions,
                    parse_error=error,
                    intent=intent,
                    verdicts=tuple(matching_verdicts(final, raw)),
                )
            )
        else:
            why = "a proposal with no next screen"
            ev.skipped.append((f"step_idx {last}", "not_executed", why))
    reported = (ev.close or {}).get("outcome")
    outcome = reported if reported in _OUTCOMES else "unknown"
    if outcome == "unknown" and steps and steps[-1].actions:
        end = steps[-1].actions[-1]
        outcome = "failure" if isinstance(end, Terminate) and end.status == "failure" else outcome
    run = FolderRun("trace", path, path.stem, task, platform, screen, steps, outcome=outcome)
    run.skipped, run.notes, run.finished = ev.skipped, notes, ev.close is not None
    run.model = _text((ev.session or {}).get("agent_model"))
    return run
