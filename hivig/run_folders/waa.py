"""WindowsAgentArena result folders: ``traj.jsonl`` with its reset line, ``result.txt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hivig.run_folders._base import (
    FolderRun,
    FolderStep,
    as_number,
    capped_text,
    file_in,
    first_png_size,
    nonblank,
    outcome_of,
    parse_response,
    pixel_calls,
    read_jsonl_rows,
    read_score,
    response_sections,
    task_text,
)


def _waa_response(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(thought, intent)`` of a step line: the raw agent response, else ``response``."""
    raw = nonblank(obj.get("agent_raw_response"))
    response = obj.get("response")
    if raw is None and isinstance(response, str):
        raw = nonblank(response)
    if raw is None and isinstance(response, dict):
        raw = nonblank(response.get("agent_raw_response")) or nonblank(response.get("response"))
    think, operation, _action = response_sections(raw)
    return capped_text(think or raw), operation


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
    lines = read_jsonl_rows(folder / "traj.jsonl", skipped)
    first: Path | None = None
    records: list[tuple[int, dict[str, Any], Path | None]] = []
    for number, obj in lines:
        where = f"traj.jsonl:{number}"
        shot = file_in(folder, obj.get("screenshot"))
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
    screen = first_png_size([first, *(p for _, _, p in records)])
    steps: list[FolderStep] = []
    before = first
    for number, obj, shot in records:
        code = obj["action"].strip()
        actions, error = parse_response(code, "osworld", "windows", screen)
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
                reward=as_number(obj.get("reward")),
                error=fault,
                calls=calls,
            )
        )
        before = shot
    score = read_score(folder / "result.txt", notes)
    return FolderRun(
        "windowsagentarena",
        folder,
        folder.name,
        task_text(folder),
        "windows",
        screen,
        steps,
        final_screenshot=before if steps else None,
        outcome=outcome_of(score),
        score=score,
        skipped=skipped,
        notes=notes,
        finished=(folder / "result.txt").is_file(),
    )
