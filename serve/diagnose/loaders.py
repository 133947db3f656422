"""Readers for the inputs of ``diagnose``, detected from the path.

* a gateway session trace, ``<state_dir>/traces/<sid>.jsonl``, whose screenshots are
  ``<state_dir>/images/<hex>.png``;
* an OSWorld-style result folder (``traj.jsonl``, ``step_{n}_{timestamp}.png`` after each action,
  ``result.txt``), including the ``{"Error": ...}`` lines real runs write and the ``response``
  field (a string or an object) some forks add;
* a task folder of WindowsAgentArena, AndroidLab or WebArenaLiteV2, read by
  ``hivig.run_folders`` (platform and screen from the run itself);
* an ingested trajectories file (``hivig.trajectory``; screenshots relative to the corpus root).

A bad line never stops a load: it is skipped and recorded in ``Run.skipped`` with a reason.
Only a path that cannot be read as any of them raises ``DiagnoseInputError``; a results root
holding many task folders raises it too, naming the task folders to pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hivig.actions import Terminate, render_tool_calls, space_for_platform
from hivig.run_folders import (
    DEFAULT_SCREEN,
    OSWORLD_PLATFORM,
    FolderRun,
    critique_pairs,
    detect_layout,
    final_action,
    parse_osworld_action,
    read_folder,
    read_osworld,
    strip_thought_strings,
    task_folders,
    trace_action,
    trace_events,
    trace_image,
    trace_session_fields,
    trace_verdict,
)
from hivig.run_folders.trace import (
    TraceSegment,
    TraceTransition,
    trace_segments,
    trace_transitions,
)
from hivig.screens import volatile_boxes
from hivig.trajectory import Trajectory, TrajectoryError, scan_trajectories
from serve.diagnose.run import Run, RunStep, Skipped, Verdict

_TEXT_CAP = 2000  # characters of a response kept as the step's reasoning
__all__ = [
    "DEFAULT_SCREEN",
    "FOLDER_KINDS",
    "OSWORLD_PLATFORM",
    "DiagnoseInputError",
    "detect_kind",
    "from_folder_run",
    "load_osworld",
    "load_run",
    "load_trace",
    "load_trajectories",
    "parse_osworld_action",
    "strip_thought_strings",
]


class DiagnoseInputError(ValueError):
    """The input path cannot be diagnosed (missing, empty, or of no known format)."""


# --------------------------------------------------------------------------------------------
# Detection


FOLDER_KINDS = ("windowsagentarena", "androidlab", "webarena")
"""Kinds read through ``hivig.run_folders`` (one benchmark task folder each)."""


def detect_kind(path: Path) -> str:
    """Which reader a path needs.

    Args:
        path: A trace file, an OSWorld result folder (or its ``traj.jsonl``), a
            WindowsAgentArena, AndroidLab or WebArenaLiteV2 task folder (or its ``traj.jsonl``,
            ``traces/trace.jsonl``, ``result.json``), or an ingested trajectories file.

    Returns:
        ``trace``, ``osworld``, ``trajectories``, ``windowsagentarena``, ``androidlab`` or
        ``webarena``.

    Raises:
        DiagnoseInputError: The path is missing, matches none of the formats, or is a results
            root of many tasks (the message names task folders to pass instead).
    """
    layout = detect_layout(path) if path.exists() else None
    if layout is not None:
        return layout
    if path.is_dir():
        if (path / "traj.jsonl").is_file():
            return "osworld"
        _many_tasks(path)
        raise DiagnoseInputError(f"{path} is a folder without traj.jsonl; pass a result folder")
    if not path.is_file():
        raise DiagnoseInputError(f"{path} does not exist")
    if path.name == "traj.jsonl":
        return "osworld"
    first = _first_object(path)
    if first is None:
        raise DiagnoseInputError(f"{path} holds no JSON object on any line")
    if "event" in first:
        return "trace"
    if "steps" in first and "task" in first:
        return "trajectories"
    if "step_num" in first or "Error" in first:
        return "osworld"
    raise DiagnoseInputError(
        f"{path}: cannot tell the format (expected a gateway trace, an OSWorld traj.jsonl or "
        "ingested trajectories)"
    )


def _many_tasks(root: Path) -> None:
    """Raise the one-line hint for a results root: which task folders it holds."""
    found = task_folders(root)
    seen = {c for _k, c in found}
    found += [
        ("osworld", c)
        for c in sorted(root.iterdir())
        if c not in seen and (c / "traj.jsonl").is_file()
    ]
    if not found:
        return
    names = ", ".join(sorted({c.name for _k, c in found})[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    raise DiagnoseInputError(
        f"{root} is a results root of {len(found)} task folders ({found[0][0]}); "
        f"pass one task folder, e.g. {root / found[0][1].name} [{names}{more}]"
    )


def _first_object(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    return obj
    except OSError as e:
        raise DiagnoseInputError(f"cannot read {path}: {e.strerror}") from None
    return None


def load_run(
    path: str | Path, *, images_root: str | Path | None = None, trajectory_id: str | None = None
) -> Run:
    """Read any input of ``detect_kind`` into a ``Run``.

    Args:
        path: Trace file, OSWorld result folder (or its ``traj.jsonl``), a benchmark task
            folder (``FOLDER_KINDS``), or trajectories file.
        images_root: Corpus root for an ingested trajectories file (default: its folder).
        trajectory_id: Which trajectory of a trajectories file to read (default: the first
            failed one, else the first).

    Returns:
        The run.

    Raises:
        DiagnoseInputError: The path cannot be read or holds no usable step.
    """
    p = Path(path)
    kind = detect_kind(p)
    if kind == "trace":
        run = load_trace(p)
    elif kind == "osworld":
        run = load_osworld(p if p.is_dir() else p.parent)
    elif kind in FOLDER_KINDS:
        run = from_folder_run(read_folder(p))
    else:
        run = load_trajectories(p, images_root=images_root, trajectory_id=trajectory_id)
    if not run.steps:
        reasons = ", ".join(sorted({s.reason for s in run.skipped})) or "no action lines"
        raise DiagnoseInputError(f"{p}: no usable step ({reasons})")
    return run


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _cap(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= _TEXT_CAP else text[: _TEXT_CAP - 3] + "..."


def _history_fields(obs: dict[str, Any] | None) -> tuple[str | None, str | None]:
    history = (obs or {}).get("history")
    if not isinstance(history, dict):
        return None, None
    return _text(history.get("progress_summary")), _text(history.get("last_action_result"))


def _trace_step(images: Path, t: TraceTransition, number: int) -> RunStep:
    nxt = t.after
    raw, intent, actions, error = trace_action(nxt.get("prev_action"))
    progress, result = _history_fields(nxt)
    change = nxt.get("change") if isinstance(nxt.get("change"), dict) else None
    return RunStep(
        step=number,
        source_ref=t.source_ref,
        raw=raw,
        actions=actions,
        parse_error=error,
        intent=intent,
        before=trace_image(images, (t.before or {}).get("image_ref")),
        after=trace_image(images, nxt.get("image_ref")),
        verdict=_matching_verdict(t.critiques, raw),
        last_action_result=result,
        progress_summary=progress,
        recorded_change=change,
    )


def load_trace(path: Path) -> Run:
    """Read a gateway session trace (one JSON event per line) into a run.

    Step ``k`` of the session (screen ``k`` observed, then an action executed) becomes run step
    ``k + 1``: its action is the ``prev_action`` of observe ``k + 1``, its screens the images of
    observes ``k`` and ``k + 1``, its verdict the critique at ``k`` of that same action. A
    critique at the last observed screen becomes a final step without an after-screen. A
    session re-created in the same file (``reseeded``) is read as a further segment
    (``hivig.run_folders.trace.trace_segments``, ``trace_transitions``), so every
    executed step is listed once, in the order it ran.

    Args:
        path: The ``traces/<sid>.jsonl`` file.

    Returns:
        The run (outcome: the one the runner reported on close; else ``failure`` when it ends
        in ``terminate(failure)``; else ``unknown``).
    """
    notes: list[str] = []
    images = path.parent.parent / "images"
    events = trace_events(path)
    skipped = [Skipped(where, reason, detail) for where, reason, detail in events.skipped]
    task, platform, screen = trace_session_fields(events.session, notes)
    segments = trace_segments(path)
    found: list[tuple[str, str, str]] = []
    transitions = trace_transitions(segments, found)
    skipped += [Skipped(where, reason, detail) for where, reason, detail in found]
    steps = [_trace_step(images, t, n) for n, t in enumerate(transitions, start=1)]
    if len(segments) > 1:
        notes.append(f"the trace holds {len(segments)} sessions (re-created from an echo)")
    if segments:
        _final_step(images, segments[-1], steps)
    missing = sum(s.before is None for s in steps)
    if missing:
        notes.append(f"{missing} step(s) have no readable before-screenshot in {images}")
    outcome = "unknown"
    reported = (events.close or {}).get("outcome")
    if reported in ("success", "failure"):
        outcome = reported  # the runner's evaluator, reported when it closed the session
    elif steps and steps[-1].actions and isinstance(steps[-1].actions[-1], Terminate):
        outcome = "failure" if steps[-1].actions[-1].status == "failure" else "unknown"
    if outcome == "unknown":
        notes.append("a trace does not record the task outcome; the run is assumed to have failed")
    regions = _volatile_regions(events.session, notes)
    return Run("trace", path, task, platform, screen, steps, outcome, None, skipped, notes, regions)


def _final_step(images: Path, seg: TraceSegment, steps: list[RunStep]) -> None:
    """The proposal critiqued at the last observed screen, as a final step without an after."""
    last = seg.last
    final = seg.critiques.get(last, [])
    if not final:
        return
    crit = final[-1]
    action, verdict_obj = final_action(crit)
    raw, intent, actions, error = trace_action(action)
    terminal = bool(actions) and isinstance(actions[-1], Terminate)
    steps.append(
        RunStep(
            step=len(steps) + 1,
            source_ref=f"trace step_idx {last} (last critique)",
            raw=raw,
            actions=actions,
            parse_error=error,
            intent=intent,
            before=trace_image(images, crit.get("image_ref"))
            or trace_image(images, seg.observes[last].get("image_ref")),
            verdict=_verdict(verdict_obj),
            executed=terminal,
        )
    )


def _volatile_regions(session: dict[str, Any] | None, notes: list[str]) -> list[list[int]]:
    """The session's volatile boxes, or none when the event has none or malformed ones."""
    regions = (session or {}).get("volatile_regions") or []
    try:
        volatile_boxes(None, regions)
    except (TypeError, ValueError):
        notes.append("the session's volatile_regions are malformed; only the platform's are masked")
        return []
    return [[int(v) for v in box] for box in regions]


def _verdict(obj: object) -> Verdict | None:
    got = trace_verdict(obj)
    return None if got is None else Verdict(**got)


def _matching_verdict(critiques: list[dict[str, Any]], raw: str) -> Verdict | None:
    """The verdict on the executed action: the last critique of the same action text."""
    for crit in reversed(critiques):
        for action, verdict in reversed(critique_pairs(crit)):
            if (action.get("action_text") or action.get("raw")) == raw:
                return _verdict(verdict)
    return None


# --------------------------------------------------------------------------------------------
# OSWorld result folders


def load_osworld(folder: Path) -> Run:
    """Read an OSWorld-style result folder into a run (``hivig.run_folders.read_osworld``).

    Args:
        folder: The result folder holding ``traj.jsonl``.

    Returns:
        The run; ``{"Error": ...}`` lines and other unusable lines are in ``Run.skipped``.
    """
    return from_folder_run(read_osworld(folder))


# --------------------------------------------------------------------------------------------
# Benchmark task folders (hivig.run_folders)


def from_folder_run(folder_run: FolderRun) -> Run:
    """A benchmark task folder's run as diagnose's ``Run``.

    A step's screenshot is its before-screen; the next step's (or the folder's final screen)
    is its after-screen.

    Args:
        folder_run: What ``hivig.run_folders.read_folder`` read.

    Returns:
        The run; platform, screen and outcome are the folder's own.
    """
    fr = folder_run
    notes = list(fr.notes)
    shots = [s.screenshot for s in fr.steps] + [fr.final_screenshot]
    steps = [
        RunStep(
            step=k + 1,
            source_ref=s.source_ref,
            raw=s.raw_action,
            actions=s.actions,
            parse_error=s.parse_error,
            intent=s.intent,
            think=s.thought,
            before=s.screenshot,
            after=shots[k + 1],
            reward=s.reward,
            error=s.error,
        )
        for k, s in enumerate(fr.steps)
    ]
    screen = fr.screen
    if screen is None:
        notes.append("no readable screenshot; the screen size is unknown (reported as 0x0)")
        screen = (0, 0)
    if fr.task is None:
        notes.append("the folder does not record the task instruction")
    skipped = [Skipped(where, reason, detail) for where, reason, detail in fr.skipped]
    return Run(
        fr.layout,
        fr.folder,
        fr.task,
        fr.platform,
        screen,
        steps,
        fr.outcome,
        fr.score,
        skipped,
        notes,
    )


# --------------------------------------------------------------------------------------------
# Ingested trajectories


def _pick(
    items: list[Trajectory], trajectory_id: str | None, path: Path, notes: list[str]
) -> Trajectory | None:
    if trajectory_id is not None:
        for t in items:
            if t.id == trajectory_id:
                return t
        raise DiagnoseInputError(f"{path}: no trajectory with id {trajectory_id}")
    if not items:
        return None
    failed = [t for t in items if t.outcome == "failure"]
    chosen = failed[0] if failed else items[0]
    if len(items) > 1:
        notes.append(
            f"the file holds {len(items)} trajectories; diagnosed {chosen.id} "
            "(pass trajectory_id / --trajectory to choose another)"
        )
    return chosen


def load_trajectories(
    path: Path, *, images_root: str | Path | None = None, trajectory_id: str | None = None
) -> Run:
    """Read one trajectory of an ingested trajectories file into a run.

    A step's screenshot is its before-screen; the next step's screenshot is its after-screen.

    Args:
        path: The JSONL file.
        images_root: The corpus root the screenshot paths are relative to (default: the
            file's folder).
        trajectory_id: The trajectory to read (default: the first failed one, else the first).

    Returns:
        The run; malformed lines are in ``Run.skipped``.

    Raises:
        DiagnoseInputError: ``trajectory_id`` is not in the file.
    """
    skipped: list[Skipped] = []
    notes: list[str] = []
    items: list[Trajectory] = []
    for number, item in scan_trajectories(path):
        if isinstance(item, TrajectoryError):
            skipped.append(Skipped(f"{path.name}:{number}", item.reason, item.message[:300]))
        else:
            items.append(item)
    chosen = _pick(items, trajectory_id, path, notes)
    if chosen is None:
        return Run(
            "trajectories",
            path,
            None,
            OSWORLD_PLATFORM,
            DEFAULT_SCREEN,
            [],
            "unknown",
            None,
            skipped,
            notes,
        )
    root = Path(images_root) if images_root is not None else path.parent
    space = space_for_platform(chosen.platform)
    base = root.resolve()
    # A path that leaves the corpus root (``..``) is never read.
    shots = [(root / s.screenshot).resolve() for s in chosen.steps]
    shots = [p if p.is_relative_to(base) and p.is_file() else None for p in shots]
    if any(p is None for p in shots):
        notes.append(
            f"{sum(p is None for p in shots)} screenshot(s) not found under {root} "
            "(pass images_root / --images-root: the corpus root)"
        )
    steps: list[RunStep] = []
    for k, s in enumerate(chosen.steps):
        steps.append(
            RunStep(
                step=k + 1,
                source_ref=f"trajectory {chosen.id} step index {s.index}",
                raw=s.raw_action or render_tool_calls(s.actions, space),
                actions=list(s.actions) or None,
                parse_error=None if s.actions else "empty: the step has no action",
                intent=s.intent,
                think=_cap(_text(s.think)),
                before=shots[k],
                after=shots[k + 1] if k + 1 < len(shots) else None,
            )
        )
    return Run(
        "trajectories",
        path,
        chosen.task,
        chosen.platform,
        (chosen.screen_w, chosen.screen_h),
        steps,
        chosen.outcome,
        None,
        skipped,
        notes,
    )
