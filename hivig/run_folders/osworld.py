"""OSWorld result folders: ``traj.jsonl`` of executed pyautogui code, ``result.txt``."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from hivig.actions import (
    Action,
    ActionError,
    parse_osworld,
)
from hivig.run_folders._base import (
    DEFAULT_SCREEN,
    OSWORLD_PLATFORM,
    FolderRun,
    FolderStep,
    as_number,
    capped_text,
    file_in,
    first_png_size,
    nonblank,
    outcome_of,
    pixel_calls,
    read_jsonl_rows,
    read_score,
    response_sections,
    task_text,
)

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
        think, operation, _action = response_sections(response)
        return capped_text(think or nonblank(response)), operation
    if isinstance(response, dict):
        intent = nonblank(response.get("intent")) or nonblank(response.get("action_description"))
        for key in ("thought", "thoughts", "reasoning", "response", "content", "text"):
            if nonblank(response.get(key)):
                return capped_text(response[key]), intent
        return capped_text(json.dumps(response, ensure_ascii=False)), intent
    return None, None


def _info_error(info: object) -> str | None:
    if not isinstance(info, dict):
        return None
    for key, value in info.items():
        if "error" in str(key).lower() and value:
            return f"{key}: {value}"[:300]
    return None


def _osworld_task(folder: Path) -> str | None:
    task = task_text(folder)
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
    for number, obj in read_jsonl_rows(folder / "traj.jsonl", skipped):
        where = f"traj.jsonl:{number}"
        if "Error" in obj and "action" not in obj:
            skipped.append((where, "error_line", str(obj["Error"])[:300]))
            notes.append(f"the runner recorded an error: {str(obj['Error'])[:200]}")
            continue
        if "action" not in obj:
            skipped.append((where, "no_action", f"keys {sorted(obj)[:8]}"))
            continue
        records.append((number, obj, file_in(folder, obj.get("screenshot_file"))))
    screen = first_png_size([p for _, _, p in records])
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
                reward=as_number(obj.get("reward")),
                error=nonblank(obj.get("Error")) or _info_error(obj.get("info")),
                calls=pixel_calls(strip_thought_strings(code), "osworld") if ok else None,
            )
        )
        before = image
    missing = sum(p is None for _, _, p in records)
    if missing:
        notes.append(f"{missing} step(s) have no readable screenshot file")
    if steps and steps[0].screenshot is None:
        notes.append("the folder has no initial screenshot; step 1 has no before-screen")
    score = read_score(folder / "result.txt", notes)
    return FolderRun(
        "osworld",
        folder,
        folder.name,
        _osworld_task(folder),
        OSWORLD_PLATFORM,
        (width, height),
        steps,
        final_screenshot=before if steps else None,
        outcome=outcome_of(score),
        score=score,
        skipped=skipped,
        notes=notes,
        finished=(folder / "result.txt").is_file(),
    )
