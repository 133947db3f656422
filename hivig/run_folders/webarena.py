"""WebArenaLiteV2 task folders: ``trajectory/{idx}.png``, ``result.json``, ``results.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hivig.run_folders._base import (
    WEBARENA_PIXELS,
    FolderRun,
    FolderStep,
    as_number,
    capped_text,
    file_in,
    first_png_size,
    frame_ratio,
    nonblank,
    outcome_of,
    parse_response,
    pixel_calls,
    read_jsonl_rows,
    resized_frame,
)


def _web_metric(folder: Path, notes: list[str]) -> float | None:
    path = folder.parent / "results.jsonl"
    metric = None
    if path.is_file():
        for _line, obj in read_jsonl_rows(path, []):
            save = obj.get("save_folder")
            if isinstance(save, str) and save.rstrip("/").rsplit("/", 1)[-1] == folder.name:
                metric = as_number(obj.get("metric"))  # a rerun appends; the last line counts
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
    shots = [file_in(folder / "trajectory", f"{k}.png") for k in range(len(actions_text) + 1)]
    screen = first_png_size(shots)
    frame = resized_frame(screen, WEBARENA_PIXELS)
    steps: list[FolderStep] = []
    for k, text in enumerate(actions_text):
        if shots[k] is None:
            notes.append(f"trajectory/{k}.png is missing")
        kw = {"coord_space": "resized_px", "frame": frame} if frame else {}
        if nonblank(text):
            actions, error = parse_response(text, "scalecua", "web", screen, **kw)
        else:
            # The step still ran: with no <action> the runner executes its own fallback wait.
            actions, error = None, "no_action: the agent wrote no <action>; the runner waited"
            text = text if isinstance(text, str) else ""
        calls = None
        if actions is not None and frame is not None:
            calls = pixel_calls(text, "scalecua", frame_ratio(screen, frame))
        steps.append(
            FolderStep(
                index=len(steps),
                source_ref=f"result.json step {k}",
                screenshot=shots[k],
                raw_action=text,
                actions=actions,
                parse_error=error,
                thought=capped_text(nonblank(thoughts[k]) if k < len(thoughts) else None),
                intent=nonblank(operations[k]) if k < len(operations) else None,
                calls=calls,
            )
        )
    metric = _web_metric(folder, notes)
    return FolderRun(
        "webarena",
        folder,
        str(result.get("task_id") or folder.name),
        nonblank(result.get("task")),
        "web",
        screen,
        steps,
        final_screenshot=shots[len(actions_text)] if actions_text else None,
        outcome=outcome_of(metric),
        score=metric,
        skipped=skipped,
        notes=notes,
        finished=(folder / "result.json").is_file(),
    )
