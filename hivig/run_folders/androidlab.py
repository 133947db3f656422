"""AndroidLab runs: ``traces/trace.jsonl``, ``Screen/*.png``, the evaluation's ``results.jsonl``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hivig.run_folders._base import (
    ANDROIDLAB_PIXELS,
    FolderRun,
    FolderStep,
    capped_text,
    file_in,
    first_png_size,
    frame_ratio,
    nonblank,
    parse_response,
    pixel_calls,
    read_jsonl_rows,
    resized_frame,
    response_sections,
)

_LAB_TS = re.compile(r"_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}$")


def _lab_image(folder: Path, value: object) -> Path | None:
    """A step's screenshot: the runner records its own absolute path; the file is in Screen/."""
    if not isinstance(value, str) or not value:
        return None
    return file_in(folder / "Screen", value.replace("\\", "/").rsplit("/", 1)[-1])


def _lab_result(folder: Path, task_id: str, notes: list[str]) -> tuple[str, float | None]:
    """Outcome from an evaluation ``results.jsonl`` next to the run, when one is found."""
    for place in (folder, folder.parent, folder.parent.parent):
        path = place / "results.jsonl"
        if not path.is_file():
            continue
        for _line, obj in read_jsonl_rows(path, []):
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
    lines = read_jsonl_rows(trace, skipped)
    shots = [_lab_image(folder, obj.get("image")) for _, obj in lines]
    screen = first_png_size(shots)
    frame = resized_frame(screen, ANDROIDLAB_PIXELS)
    task: str | None = None
    steps: list[FolderStep] = []
    for (number, obj), shot in zip(lines, shots, strict=True):
        where = f"trace.jsonl:{number}"
        task = task or nonblank(obj.get("target"))
        response = nonblank(obj.get("current_response"))
        think, operation, action = response_sections(response)
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
            actions, error = parse_response(action, "scalecua", "android", screen, **kw)
            if actions is not None:
                calls = pixel_calls(action, "scalecua", frame_ratio(screen, frame))
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
                thought=capped_text(think or response),
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
