"""The gateway's own session traces: ``traces/<sid>.jsonl`` and ``images/<hex>.png``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import (
    PLATFORMS,
    Action,
    ActionError,
    Terminate,
    parse_tool_calls,
)
from hivig.run_folders._base import (
    DEFAULT_SCREEN,
    OSWORLD_PLATFORM,
    FolderRun,
    FolderStep,
    as_number,
    nonblank,
    read_jsonl_rows,
)


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
    text = nonblank(obj.get("action_text")) or nonblank(obj.get("raw")) or ""
    intent = nonblank(obj.get("intent"))
    recorded_error = nonblank(obj.get("parse_error"))
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
        "dimension": nonblank(obj.get("error_dimension")),
        "explanation": nonblank(obj.get("explanation")) or "",
        "confidence": as_number(obj.get("confidence")),
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
    return nonblank(session.get("task")), str(platform), size


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
    for number, obj in read_jsonl_rows(path, ev.skipped):
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


@dataclass
class TraceSegment:
    """The events of one gateway session in a trace file.

    A session re-created from an echo (``reseeded``: R3's Restore, or the client re-creating a
    lost session) goes on in the same file with the numbering the echo gives, so its step
    indices repeat earlier ones; each segment is read on its own.

    Attributes:
        observes: The first ``observe`` per ``step_idx`` of this session.
        critiques: Every ``critique`` per ``step_idx`` of this session, in file order.
    """

    observes: dict[int, dict[str, Any]] = field(default_factory=dict)
    critiques: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def last(self) -> int:
        """The index of the last screen this session observed."""
        return max(self.observes)


def trace_segments(path: Path) -> list[TraceSegment]:
    """The session segments of one trace file, in file order (those that observed anything).

    A ``session`` event with ``"reseeded": true`` starts a new segment. Lines ``trace_events``
    cannot use (bad JSON, bad ``step_idx``) are skipped here too; it records them.

    Args:
        path: The ``traces/<sid>.jsonl`` file.

    Returns:
        The segments; none for an unreadable file or one without observes.
    """
    segments = [TraceSegment()]
    for _line, obj in read_jsonl_rows(path, []):
        event, idx = obj.get("event"), obj.get("step_idx")
        if event == "session" and obj.get("reseeded") is True:
            segments.append(TraceSegment())
        elif event in ("observe", "critique") and _valid_idx(idx):
            seg = segments[-1]
            if event == "observe":
                seg.observes.setdefault(idx, obj)
            else:
                seg.critiques.setdefault(idx, []).append(obj)
    return [s for s in segments if s.observes]


def _valid_idx(idx: object) -> bool:
    return isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0


@dataclass(frozen=True)
class TraceTransition:
    """One executed step of a trace: a screen observed, then an action run on it.

    Attributes:
        before: The observe of the screen acted on (``None`` when it was not recorded).
        after: The next observe: its ``prev_action`` is the action, its image the screen after.
        critiques: The critiques at the screen acted on (the action's verdicts are among them).
        source_ref: Where it is in the trace, e.g. ``trace step_idx 2 -> 3 (session 2)``.
    """

    before: dict[str, Any] | None
    after: dict[str, Any]
    critiques: list[dict[str, Any]]
    source_ref: str


def _action_key(obs: dict[str, Any]) -> tuple[str, object]:
    """What identifies the transition an observe records: its action text and its screen."""
    return trace_action(obs.get("prev_action"))[0], obs.get("image_ref")


def trace_transitions(
    segments: list[TraceSegment], skipped: list[tuple[str, str, str]]
) -> list[TraceTransition]:
    """The executed steps of a trace's segments, each once, in the order they ran.

    Within a segment step ``k`` goes from observe ``k`` to observe ``k + 1``. A re-created
    session's first observe either repeats the transition the previous segment ended on (R3's
    Restore observes the accepted step again: same action, same screen) and is not a new step,
    or records a new one whose before-screen is the previous segment's last.

    Args:
        segments: What ``trace_segments`` read.
        skipped: Receives ``(where, "missing_observe", detail)`` for each gap in the indices.

    Returns:
        The transitions (the proposal critiqued at the last screen is not one of them).
    """
    out: list[TraceTransition] = []
    for n, seg in enumerate(segments):
        where = f" (session {n + 1})" if len(segments) > 1 else ""
        first = min(seg.observes)
        if n > 0:
            prev = segments[n - 1]
            head, tail = seg.observes[first], prev.observes[prev.last]
            if _action_key(head) != _action_key(tail):
                ref = f"trace step_idx {prev.last} -> {first}{where}"
                out.append(TraceTransition(tail, head, prev.critiques.get(prev.last, []), ref))
        for k in range(first, seg.last):
            nxt = seg.observes.get(k + 1)
            if nxt is None:
                skipped.append((f"step_idx {k + 1}{where}", "missing_observe", "no observe event"))
                continue
            ref = f"trace step_idx {k} -> {k + 1}{where}"
            out.append(TraceTransition(seg.observes.get(k), nxt, seg.critiques.get(k, []), ref))
    return out


def critique_pairs(crit: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """The ``(action, verdict)`` pairs of one critique event, in candidate order.

    The gateway writes lists (``actions``, ``verdicts``: one per candidate, a single action
    being a list of one); a hand-written or older trace may hold one ``action`` and one
    ``verdict``. Both are read.
    """
    actions, verdicts = crit.get("actions"), crit.get("verdicts")
    if isinstance(actions, list):
        verdicts = verdicts if isinstance(verdicts, list) else []
        return [
            (a, verdicts[i] if i < len(verdicts) else None)
            for i, a in enumerate(actions)
            if isinstance(a, dict)
        ]
    action = crit.get("action")
    return [(action, crit.get("verdict"))] if isinstance(action, dict) else []


def final_action(crit: dict[str, Any]) -> tuple[dict[str, Any] | None, Any]:
    """The action and verdict a run's last critique ended on.

    The terminate among its candidates when there is one, else its first action.
    """
    pairs = critique_pairs(crit)
    for action, verdict in pairs:
        parsed = trace_action(action)[2]
        if parsed and isinstance(parsed[-1], Terminate):
            return action, verdict
    return pairs[0] if pairs else (None, None)


def matching_verdicts(critiques: list[dict[str, Any]], raw: str) -> list[dict[str, Any]]:
    """The verdicts on action text ``raw`` among one step's critiques, in file order."""
    out = []
    for crit in critiques:
        for action, verdict_obj in critique_pairs(crit):
            if (action.get("action_text") or action.get("raw")) == raw:
                verdict = trace_verdict(verdict_obj)
                if verdict is not None:
                    out.append(verdict)
    return out


_OUTCOMES = ("success", "failure")


def read_trace(path: Path) -> FolderRun:
    """Read a gateway session trace as a run of executed steps.

    Step ``k`` (screen ``k`` observed, then an action executed) takes its action from the
    ``prev_action`` of observe ``k + 1`` and its verdicts from the critiques at ``k`` of that
    same action text. A session re-created in the same file (``reseeded``) is read as a further
    segment (``trace_segments``, ``trace_transitions``), so every executed step is listed once,
    in the order it ran. A critique at the last screen of the last segment is a step only when
    its action ends the task (``terminate``); otherwise whether it ran is unknown and it is
    skipped. The outcome is the ``outcome`` a runner reported on the close event, else
    ``failure`` for a run that ends in ``terminate(failure)``, else ``unknown``.

    Args:
        path: The ``traces/<sid>.jsonl`` file.

    Returns:
        The run (``finished`` is ``False`` without a close event).
    """
    ev = trace_events(path)
    notes: list[str] = []
    images = path.parent.parent / "images"
    task, platform, screen = trace_session_fields(ev.session, notes)
    segments = trace_segments(path)
    steps = [
        _folder_step(images, t, n) for n, t in enumerate(trace_transitions(segments, ev.skipped))
    ]
    if len(segments) > 1:
        notes.append(f"the trace holds {len(segments)} sessions (re-created from an echo)")
    if segments:
        _final_step(images, segments[-1], steps, ev.skipped)
    reported = (ev.close or {}).get("outcome")
    outcome = reported if reported in _OUTCOMES else "unknown"
    if outcome == "unknown" and steps and steps[-1].actions:
        end = steps[-1].actions[-1]
        outcome = "failure" if isinstance(end, Terminate) and end.status == "failure" else outcome
    run = FolderRun("trace", path, path.stem, task, platform, screen, steps, outcome=outcome)
    run.skipped, run.notes, run.finished = ev.skipped, notes, ev.close is not None
    run.model = nonblank((ev.session or {}).get("agent_model"))
    return run


def _folder_step(images: Path, t: TraceTransition, index: int) -> FolderStep:
    raw, intent, actions, error = trace_action(t.after.get("prev_action"))
    return FolderStep(
        index=index,
        source_ref=t.source_ref,
        screenshot=trace_image(images, (t.before or {}).get("image_ref")),
        raw_action=raw,
        actions=actions,
        parse_error=error,
        intent=intent,
        verdicts=tuple(matching_verdicts(t.critiques, raw)),
    )


def _final_step(
    images: Path, seg: TraceSegment, steps: list[FolderStep], skipped: list[tuple[str, str, str]]
) -> None:
    """The proposal critiqued at the last screen, appended when it ends the task."""
    last = seg.last
    final = seg.critiques.get(last, [])
    if not final:
        return
    raw, intent, actions, error = trace_action(final_action(final[-1])[0])
    if not actions or not isinstance(actions[-1], Terminate):
        # Without a next screen, whether any other proposal ran is unknown.
        skipped.append((f"step_idx {last}", "not_executed", "a proposal with no next screen"))
        return
    shot = trace_image(images, final[-1].get("image_ref"))
    steps.append(
        FolderStep(
            index=len(steps),
            source_ref=f"trace step_idx {last} (last critique)",
            screenshot=shot or trace_image(images, seg.observes[last].get("image_ref")),
            raw_action=raw,
            actions=actions,
            parse_error=error,
            intent=intent,
            verdicts=tuple(matching_verdicts(final, raw)),
        )
    )
