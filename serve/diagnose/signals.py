"""Cheap candidate ranking: signals computed without a model, each with a weight.

A step's score is the sum of its signal weights; candidates are ranked by score, earlier steps
first on ties (the root cause is the earliest step that introduced a new mistake, and what
follows it is mostly consequence). The weights favour the *onset* of a symptom over its repeats:
the first no-effect step of a streak, the first step of a repeated screen+action, the first
failed ``Last Action Result``.

Signals (name: weight):

* ``bad_verdict`` 3.0: the gateway's critic judged the executed action Bad;
  ``low_confidence_verdict`` 1.0: judged Good with confidence below 0.5.
* ``unparseable_action`` 2.0 (0.75 when the same broken text is re-emitted) /
  ``execution_error`` 2.0: the action text does not parse, or the runner recorded an error.
* ``no_effect`` 2.0 (first of a streak) / ``no_effect_repeat`` 0.75: identical or near-identical
  before/after screens for an action that should change the screen.
* ``recurrence_onset`` 2.5 / ``recurrence_repeat`` 0.5: the same action on the same screen again.
* ``typed_without_focus`` 2.5: typing with no effect where the step before it was no click (or
  there was none): nothing gave a field the focus, so the keys went nowhere (the taxonomy's
  Procedural Prerequisite Neglect by definition, not a guess from the symptom).
* ``later_reverted`` 1.5: a later step returned to the screen this step left (backing out of a
  wrong page or dialog).
* ``failed_last_action_result`` 1.5 (first of a streak) / 0.5, ``history_stall`` 0.75: the
  history model reported a failure, or its progress summary stopped advancing.
* ``premature_done`` 2.0: ``terminate(success)`` (``DONE``) but the task failed; ``gave_up``
  1.0: ``terminate(failure)`` (``FAIL``); ``answer_on_failure`` 1.5: an answer, task failed.
  A run whose outcome is not recorded (a trace) is assumed to have failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hivig.actions import (
    Action,
    Answer,
    CallUser,
    HScroll,
    Key,
    LeftClickDrag,
    MobileKey,
    MouseMove,
    Scroll,
    Swipe,
    Terminate,
    Type,
    Wait,
)
from hivig.taxonomy import Dimension, lookup_dimension
from serve.diagnose.run import Run, RunStep
from serve.diagnose.screens import Change, Screens, on_element

WEIGHTS: dict[str, float] = {
    "bad_verdict": 3.0,
    "low_confidence_verdict": 1.0,
    "unparseable_action": 2.0,
    "unparseable_action_repeat": 0.75,
    "execution_error": 2.0,
    "no_effect": 2.0,
    "no_effect_repeat": 0.75,
    "recurrence_onset": 2.5,
    "recurrence_repeat": 0.5,
    "typed_without_focus": 2.5,
    "later_reverted": 1.5,
    "failed_last_action_result": 1.5,
    "failed_last_action_result_repeat": 0.5,
    "history_stall": 0.75,
    "premature_done": 2.0,
    "gave_up": 1.0,
    "answer_on_failure": 1.5,
}
"""Signal name -> weight added to the step's score."""

LOW_CONFIDENCE = 0.5
"""A Good verdict below this confidence counts as a weak signal."""

_SAME_POINT = 8  # grid units (0-1000) within which two pointer targets count as the same
_NO_EFFECT_EXEMPT = (Wait, Terminate, Answer, MouseMove, CallUser)
_FAILED_RESULT = re.compile(
    r"\b(no (visible |apparent )?(change|effect)|nothing (happened|changed)|did not|didn't|"
    r"does not|failed|fails|unchanged|unexpected|error|wrong|not respond\w*)\b",
    re.IGNORECASE,
)


@dataclass
class Signal:
    """One cheap signal on one step."""

    name: str
    weight: float
    detail: str

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"name": self.name, "weight": self.weight, "detail": self.detail}


@dataclass
class Candidate:
    """A ranked step with the signals that put it there."""

    step: int
    signals: list[Signal] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Sum of the signal weights."""
        return round(sum(s.weight for s in self.signals), 3)

    def names(self) -> set[str]:
        """Names of the signals."""
        return {s.name for s in self.signals}

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {
            "step": self.step,
            "score": self.score,
            "signals": [s.to_json() for s in self.signals],
        }


# --------------------------------------------------------------------------------------------
# Action comparison


def expects_effect(step: RunStep) -> bool:
    """Whether the step's action should visibly change the screen (waits and ends need not)."""
    if step.actions is None:
        return True
    return any(not isinstance(a, _NO_EFFECT_EXEMPT) for a in step.actions)


def _same_action(a: Action, b: Action) -> bool:
    if type(a) is not type(b):
        return False
    pa, pb = a.to_arguments(), b.to_arguments()
    if set(pa) != set(pb):
        return False
    for key, va in pa.items():
        vb = pb[key]
        if key.startswith("coordinate") and isinstance(va, list) and isinstance(vb, list):
            if any(abs(x - y) > _SAME_POINT for x, y in zip(va, vb, strict=True)):
                return False
        elif isinstance(va, str) and isinstance(vb, str):
            if " ".join(va.lower().split()) != " ".join(vb.lower().split()):
                return False
        elif va != vb:
            return False
    return True


def same_step_action(a: RunStep, b: RunStep) -> bool:
    """Whether two steps did the same thing (relaxed: nearby points, normalised text)."""
    if a.actions is None or b.actions is None:
        return a.actions is None and b.actions is None and a.raw.split() == b.raw.split()
    if len(a.actions) != len(b.actions):
        return False
    return all(_same_action(x, y) for x, y in zip(a.actions, b.actions, strict=True))


# --------------------------------------------------------------------------------------------
# Signals


def step_changes(run: Run, screens: Screens) -> dict[int, Change | None]:
    """The before/after change of every step; the gateway's recorded one when no images."""
    out: dict[int, Change | None] = {}
    for s in run.steps:
        # A step that did not parse is judged by its text: it may have acted anywhere.
        actions = s.actions if s.actions is not None else [s.raw] if s.raw else []
        change = screens.compare(s.before, s.after, actions)
        if change is None and s.recorded_change is not None:
            rec = s.recorded_change
            if isinstance(rec.get("no_effect"), bool):
                dist = rec.get("dhash_dist")
                frac = rec.get("masked_diff_frac")
                change = Change(
                    identical=bool(rec.get("identical")),
                    dhash_dist=dist if isinstance(dist, int) else -1,
                    diff_frac=float(frac) if isinstance(frac, (int, float)) else -1.0,
                    no_effect=rec["no_effect"],
                )
        out[s.step] = change
    return out


def _add(signals: dict[int, list[Signal]], step: int, name: str, detail: str) -> None:
    signals.setdefault(step, []).append(Signal(name, WEIGHTS[name], detail))


def _verdict_signals(run: Run, signals: dict[int, list[Signal]]) -> None:
    for s in run.steps:
        v = s.verdict
        if v is None or not s.executed:
            continue
        if v.verdict == "bad":
            dim = f" ({v.dimension})" if v.dimension else ""
            _add(
                signals,
                s.step,
                "bad_verdict",
                f"the critic ({v.source}) judged it Bad{dim} and it was executed: "
                f"{v.explanation[:200]}",
            )
        elif v.verdict == "good" and v.confidence is not None and v.confidence < LOW_CONFIDENCE:
            _add(
                signals,
                s.step,
                "low_confidence_verdict",
                f"judged Good with confidence {v.confidence:.2f}",
            )


def _error_signals(run: Run, signals: dict[int, list[Signal]]) -> None:
    previous: RunStep | None = None
    for s in run.steps:
        if s.parse_error:
            # Re-emitting the same broken call is a consequence, not a new mistake.
            repeat = previous is not None and previous.parse_error and previous.raw == s.raw
            name = "unparseable_action_repeat" if repeat else "unparseable_action"
            _add(signals, s.step, name, f"the action does not parse: {s.parse_error}")
        if s.error:
            _add(signals, s.step, "execution_error", f"the runner recorded: {s.error}")
        previous = s


def _no_effect_signals(
    run: Run, changes: dict[int, Change | None], signals: dict[int, list[Signal]]
) -> None:
    streak = False
    for s in run.steps:
        change = changes.get(s.step)
        if change is None or not change.no_effect or not expects_effect(s):
            streak = False
            continue
        how = (
            "identical"
            if change.identical
            else f"near-identical (dHash distance {change.dhash_dist}, "
            f"{100 * change.diff_frac:.3f} % of pixels changed)"
        )
        name = "no_effect_repeat" if streak else "no_effect"
        _add(signals, s.step, name, f"before and after screens are {how}")
        streak = True


def _focus_signals(
    run: Run, changes: dict[int, Change | None], signals: dict[int, list[Signal]]
) -> None:
    previous: RunStep | None = None
    for s in run.steps:
        change = changes.get(s.step)
        typed = bool(s.actions) and any(isinstance(a, Type) for a in s.actions or [])
        if typed and change is not None and change.no_effect:
            clicked = previous is not None and any(
                isinstance(getattr(a, "coordinate", None), tuple) for a in previous.actions or []
            )
            if not clicked:
                before = "the run's first step" if previous is None else "no click before it"
                _add(
                    signals,
                    s.step,
                    "typed_without_focus",
                    f"typing changed nothing and nothing gave a field the focus ({before})",
                )
        previous = s


def _recurrence_signals(
    run: Run, screens: Screens, signals: dict[int, list[Signal]]
) -> dict[int, list[int]]:
    """Group steps by (screen, action); return onset step -> its repeats."""
    onsets: dict[int, list[int]] = {}
    steps = [
        s
        for s in run.steps
        if s.actions is None or not all(isinstance(a, (Wait, Terminate)) for a in s.actions)
    ]
    for i, s in enumerate(steps):
        if screens.get(s.before) is None:
            continue
        for earlier in steps[:i]:
            if same_step_action(earlier, s) and screens.same(earlier.before, s.before):
                root = next((o for o, reps in onsets.items() if earlier.step in (o, *reps)), None)
                onsets.setdefault(root or earlier.step, []).append(s.step)
                break
    for onset, repeats in onsets.items():
        listed = ", ".join(map(str, repeats))
        _add(
            signals,
            onset,
            "recurrence_onset",
            f"the same action on the same screen was repeated at step(s) {listed}",
        )
        for r in repeats:
            _add(signals, r, "recurrence_repeat", f"repeats step {onset} on the same screen")
    return onsets


def _reverted_signals(
    run: Run, screens: Screens, changes: dict[int, Change | None], signals: dict[int, list[Signal]]
) -> None:
    for i, s in enumerate(run.steps):
        change = changes.get(s.step)
        if screens.get(s.before) is None or change is None or change.no_effect:
            continue
        for later in run.steps[i + 1 :]:
            back = screens.same(later.after, s.before)
            if back and not screens.same(later.before, s.before):
                _add(
                    signals,
                    s.step,
                    "later_reverted",
                    f"step {later.step} returned to the screen this step left",
                )
                break


def _history_signals(run: Run, signals: dict[int, list[Signal]]) -> None:
    failed_streak = False
    previous: str | None = None
    stalled = False
    for s in run.steps:
        result = s.last_action_result
        if result and _FAILED_RESULT.search(result):
            name = (
                "failed_last_action_result_repeat" if failed_streak else "failed_last_action_result"
            )
            _add(signals, s.step, name, f"Last Action Result: {result[:200]}")
            failed_streak = True
        else:
            failed_streak = False
        summary = s.progress_summary
        if summary and previous and " ".join(summary.split()) == " ".join(previous.split()):
            if not stalled:
                _add(signals, s.step, "history_stall", "the progress summary stopped advancing")
            stalled = True
        else:
            stalled = False
        previous = summary or previous


def _terminal_signals(run: Run, signals: dict[int, list[Signal]]) -> None:
    # A run under diagnosis failed; where the source does not record the outcome (a trace),
    # that is assumed and said so in the signal.
    if not run.steps or run.outcome == "success":
        return
    last = run.steps[-1]
    action = last.actions[-1] if last.actions else None
    if run.outcome == "failure":
        how = f" (score {run.score:g})" if run.score is not None else ""
    else:
        how = " (outcome not recorded; assumed failed)"
    if isinstance(action, Terminate) and action.status == "success":
        _add(
            signals,
            last.step,
            "premature_done",
            f"the agent declared the task done but it failed{how}",
        )
    elif isinstance(action, Terminate) and action.status == "failure":
        _add(signals, last.step, "gave_up", "the agent gave up (terminate failure)")
    elif isinstance(action, Answer):
        _add(
            signals, last.step, "answer_on_failure", f"the agent answered but the task failed{how}"
        )


def rank_candidates(run: Run, screens: Screens) -> tuple[list[Candidate], dict[int, Change | None]]:
    """Compute every cheap signal and rank the steps that have any.

    Args:
        run: The loaded run.
        screens: The fingerprint cache (shared with the report).

    Returns:
        ``(candidates, changes)``: candidates by score (descending), earlier first on ties;
        and the before/after change of every step (``None`` where a screen is missing).
    """
    changes = step_changes(run, screens)
    signals: dict[int, list[Signal]] = {}
    _verdict_signals(run, signals)
    _error_signals(run, signals)
    _no_effect_signals(run, changes, signals)
    _focus_signals(run, changes, signals)
    _recurrence_signals(run, screens, signals)
    _reverted_signals(run, screens, changes, signals)
    _history_signals(run, signals)
    _terminal_signals(run, signals)
    ranked = [Candidate(step, sig) for step, sig in signals.items()]
    ranked.sort(key=lambda c: (-c.score, c.step))
    return ranked, changes


# --------------------------------------------------------------------------------------------
# Error guess from the signals


def _by_action(step: RunStep) -> Dimension | None:
    actions = [a for a in step.actions or [] if not isinstance(a, (Wait, MouseMove))]
    if not actions:
        return None
    last = actions[-1]
    if isinstance(last, (Type, Key, MobileKey)):
        return lookup_dimension("Procedural Prerequisite Neglect")
    if isinstance(last, (Scroll, HScroll, Swipe, LeftClickDrag)):
        return lookup_dimension("Parameter Vector Miscalibration")
    return lookup_dimension("Grounding/Spatial Error")


UNRESPONSIVE_CONTROL = "the click landed on an element that did not respond"
"""``why`` of a click with no effect whose point is on a drawn element (a disabled or inert
control): the point found a control, so it is not a grounding miss."""


def _pointer_dimension(step: RunStep, why: str) -> tuple[Dimension | None, str]:
    """``_by_action``, except that a click on a drawn element that did not respond is not a
    grounding miss: the control was hit and refused (disabled, or its prerequisite unmet)."""
    dim = _by_action(step)
    if dim is None or dim.key != "grounding_spatial_error":
        return dim, why
    last = [a for a in step.actions or [] if not isinstance(a, (Wait, MouseMove))][-1]
    point = getattr(last, "coordinate", None)
    if isinstance(point, tuple) and on_element(step.before, point):
        return lookup_dimension("Procedural Prerequisite Neglect"), UNRESPONSIVE_CONTROL
    return dim, why


def guess_error(step: RunStep, candidate: Candidate) -> tuple[Dimension | None, str | None, str]:
    """The most likely error of a candidate from its signals alone.

    Args:
        step: The step.
        candidate: Its signals.

    Returns:
        ``(dimension, l2 code without a dimension, why)``; the dimension is ``None`` when the
        signals point to a system cause (then the L2 code is set) or to nothing specific.
    """
    names = candidate.names()
    if "bad_verdict" in names and step.verdict and step.verdict.dimension:
        dim = lookup_dimension(step.verdict.dimension)
        if dim is not None:
            return dim, None, "the dimension the gateway's critic named"
    if "unparseable_action" in names:
        return lookup_dimension("Action Formulation Error"), None, "the action text is invalid"
    if "typed_without_focus" in names:
        dim = lookup_dimension("Procedural Prerequisite Neglect")
        return dim, None, "the keys were typed with no field focused"
    if "premature_done" in names or "answer_on_failure" in names:
        return lookup_dimension("Termination Misjudgment"), None, "the agent ended a failed task"
    if names & {"no_effect", "failed_last_action_result"}:
        dim, why = _pointer_dimension(step, "an action that should change the screen had no effect")
        if dim is not None:
            return dim, None, why
    if "later_reverted" in names:
        # The action worked but led somewhere the agent had to back out of: a misread target.
        return lookup_dimension("Semantic Error"), None, "the step led to a screen later undone"
    if "recurrence_onset" in names:
        dim, why = _pointer_dimension(step, "the same action on the same screen was repeated")
        if dim is not None:
            return dim, None, why
    if "execution_error" in names:
        return None, "S5", "the runner reported an execution error"
    return None, None, "no signal names a specific error"
