"""Benchmark result folders -> plain step records: WindowsAgentArena, AndroidLab, WebArenaLiteV2.

Each benchmark writes one folder per task, in its own layout:

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

Platform and screen come from the run: the screen from the PNG header of a screenshot (no
decoding), the platform from the benchmark. A line that cannot be used is skipped with a reason,
never raised. Readers take one task folder; ``task_folders`` lists the task folders of a results
root. Only the standard library and ``hivig`` are used, so any stage can read these folders.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import Action, ActionError, first_block, parse_agent_output
from hivig.vision import smart_resize

LAYOUTS = ("windowsagentarena", "androidlab", "webarena")
"""Folder layouts read here."""

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
    for number, line in enumerate(text.splitlines(), start=1):
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
        ``windowsagentarena``, ``androidlab``, ``webarena`` or ``None``.
    """
    if path.is_file():
        if path.name == "trace.jsonl" and path.parent.name == "traces":
            return "androidlab"
        if path.name == "result.json" and (path.parent / "trajectory").is_dir():
            return "webarena"
        if path.name == "traj.jsonl":
            return "windowsagentarena" if _is_waa(path) else None
        return None
    if (path / "traces" / "trace.jsonl").is_file():
        return "androidlab"
    if (path / "result.json").is_file() or (path / "trajectory" / "0.png").is_file():
        # result.json is written when the task ends: a run cut short has screenshots only.
        return "webarena" if (path / "trajectory").is_dir() else None
    if (path / "traj.jsonl").is_file() and _is_waa(path / "traj.jsonl"):
        return "windowsagentarena"
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
    if layout == "windowsagentarena":
        return read_windowsagentarena(folder)
    if layout == "androidlab":
        return read_androidlab(folder)
    if layout == "webarena":
        return read_webarena(folder)
    raise ValueError(f"{path} is not a task folder of {', '.join(LAYOUTS)}")


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
        if action is not None and frame is not None:
            kw = {"coord_space": "resized_px", "frame": frame}
            actions, error = _parsed(action, "scalecua", "android", screen, **kw)
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
    )
