"""What makes a Bad sample true to its dimension, checked on every sample a generator emits.

One check per dimension: ``check(view, bad)`` returns why the sample is *not* an instance of its
dimension, or ``None``. The programmatic generators are built to satisfy their check (the tests
run it on every sample of a generated corpus); the perturbation stage runs it on every Bad step,
the annotator's included, and drops a failing one as ``property_violated`` with the reason.

Checks that need element boxes pass when the screen has none listed (an endpoint annotator's
perturbation on a corpus without boxes cannot be verified, only trusted); the programmatic
generators never emit an element-based sample without boxes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from data_gen.perturb.base import BadStep, StepView
from data_gen.perturb.calls import POINT_TARGETS, Call, primary_point
from data_gen.perturb.elements import Element, target_at
from data_gen.perturb.programmatic import (
    ACTION_FORMULATION,
    GROUNDING,
    HALLUCINATION,
    MISALIGNMENT,
    PARAMETER_VECTOR,
    PREREQUISITE,
    TERMINATION,
    TEXT_ROLES,
    TIMING,
    busy_indicators,
    mentions,
    on_screen_labels,
    points_of,
    states_destination,
)
from data_gen.perturb.semantic import (
    INTERACTIVE_ROLES,
    label_core,
    scroll_region,
    stated_in_goal,
)
from hivig.taxonomy import dimension_by_key

Check = Callable[[StepView, BadStep], "str | None"]

_ANSWER_WORDS = re.compile(r"^\s*(report|tell|reply|respond)\b|\banswer\b", re.IGNORECASE)
_POINT_WORDS = re.compile(
    r"^\s*(click|tap|double[- ]click|right[- ]click|select|choose|long[- ]press|press and hold)\b",
    re.IGNORECASE,
)
_TYPE_WORDS = re.compile(r"\b(type|typing)\b", re.IGNORECASE)
_WAIT_WORDS = re.compile(r"^\s*wait\b", re.IGNORECASE)
_SCROLL_WORDS = re.compile(r"^\s*(scroll|swipe)\b", re.IGNORECASE)


def intent_contradiction(intent: str, calls: Sequence[Call]) -> str | None:
    """How a stated intent contradicts its tool calls, or ``None``.

    By the paper's definition a contradiction between intent and call is Action-Operation
    Misalignment, so no other dimension's sample may carry one: an intent to report an answer
    with no ``answer`` call, to click with no point action, to type with no ``type``, to wait
    with no ``wait``, to scroll with no scroll or swipe.
    """
    if not intent.strip():
        return None
    names = {str(c.get("action")) for c in calls}
    if _ANSWER_WORDS.search(intent) and "answer" not in names:
        return "the intent reports an answer but no call answers"
    if _POINT_WORDS.search(intent) and not names & (POINT_TARGETS | {"open", "left_click_drag"}):
        return "the intent clicks an element but no call points at one"
    if _TYPE_WORDS.search(intent) and "type" not in names:
        return "the intent types but no call types"
    if _WAIT_WORDS.search(intent) and "wait" not in names:
        return "the intent waits but no call waits"
    if _SCROLL_WORDS.search(intent) and not names & {"scroll", "hscroll", "swipe"}:
        return "the intent scrolls but no call scrolls"
    return _direction_contradiction(intent, calls)


_DOWN = re.compile(r"\bdown(ward)?s?\b", re.IGNORECASE)
_UP = re.compile(r"\bup(ward)?s?\b", re.IGNORECASE)


def stated_direction(intent: str) -> str | None:
    """``up`` or ``down`` when the intent names exactly one of them, else ``None``."""
    down, up = bool(_DOWN.search(intent)), bool(_UP.search(intent))
    return "down" if down and not up else "up" if up and not down else None


_SWIPE_DIRECTION = re.compile(r"\bswipe\s+(up|down)\b", re.IGNORECASE)


def _direction_contradiction(intent: str, calls: Sequence[Call]) -> str | None:
    """A wheel scroll against the intent's direction (Qwen3-VL: negative pixels scroll down),
    or a swipe whose finger moves against a stated "swipe up/down"."""
    said = stated_direction(intent)
    swipe = _SWIPE_DIRECTION.search(intent)
    for c in calls:
        px = c.get("pixels")
        wheel = c.get("action") == "scroll" and isinstance(px, int) and px != 0
        if said is not None and wheel and (px < 0) != (said == "down"):  # type: ignore[operator]
            return f"the intent scrolls {said} but the wheel turns the other way"
        a, b = c.get("coordinate"), c.get("coordinate2")
        if swipe and c.get("action") == "swipe" and isinstance(a, list) and isinstance(b, list):
            finger = "up" if b[1] < a[1] else "down" if b[1] > a[1] else None
            if finger is not None and finger != swipe.group(1).lower():
                return f"the intent swipes {swipe.group(1).lower()} but the finger moves {finger}"
    return None


def _drag_path(calls: Sequence[Call]) -> list[Any]:
    """Start and end of every drag: the move before a ``left_click_drag`` and the drag's point."""
    return [
        (calls[i - 1].get("coordinate"), c.get("coordinate"))
        for i, c in enumerate(calls)
        if c.get("action") == "left_click_drag"
        and i > 0
        and calls[i - 1].get("action") == "mouse_move"
    ]


def _drag_reversed(expert: Sequence[Call], bad: Sequence[Call]) -> bool:
    """Whether some drag of ``bad`` runs from the expert's end point to its start."""
    return any(
        b == (e[1], e[0]) and e[0] != e[1]
        for e, b in zip(_drag_path(expert), _drag_path(bad), strict=False)
    )


def _calls(bad: BadStep) -> list[Call]:
    return list(bad.calls or ())


def _copied(view: StepView, bad: BadStep) -> str | None:
    if bad.intent.strip() and bad.intent.strip() in {i.strip() for i in view.earlier_intents}:
        return "the intent repeats an earlier step's words (the history would give it away)"
    return None


def _consistent(view: StepView, bad: BadStep) -> str | None:
    return intent_contradiction(bad.intent, _calls(bad)) or _copied(view, bad)


def parameter_vector(view: StepView, bad: BadStep) -> str | None:
    """Same action kinds as the expert, only a scroll/swipe/drag vector changed, and not
    against a direction the intent states (that contradiction would be Misalignment)."""
    calls = _calls(bad)
    why = _direction_contradiction(bad.intent, calls)
    if why is not None:
        return why
    if [c.get("action") for c in calls] != [c.get("action") for c in view.calls]:
        return "the action kinds differ from the expert's"
    if _drag_reversed(view.calls, calls) and states_destination(bad.intent):
        return "the drag runs backwards against where its intent says it goes (Misalignment)"
    vectors = {"scroll", "hscroll", "swipe", "left_click_drag", "mouse_move"}
    if not any(c.get("action") in vectors for c in calls) or calls == list(view.calls):
        return "no vector changed"
    return None


def action_formulation(view: StepView, bad: BadStep) -> str | None:
    """The call text does not parse (that is the error), and the intent is the expert's."""
    if bad.calls is not None:
        return "the Bad call parses"
    if bad.intent != view.intent:
        return "the intent is not the expert's"
    return None


def termination(view: StepView, bad: BadStep) -> str | None:
    """Ends too early or wrongly, or acts after a successful end; no borrowed wording."""
    names = [c.get("action") for c in _calls(bad)]
    expert = [c.get("action") for c in view.calls]
    if bad.intent.strip():
        return "a Termination Bad carries words (the future, a copy, or a contradiction)"
    if bad.method == "action_after_completion":
        ends = [c.get("status") for c in view.calls if c.get("action") == "terminate"]
        if "success" not in ends:
            return "a redundant action 'after the goal was met' on a step that did not succeed"
        return None if names and names[0] in POINT_TARGETS else "no action after completion"
    if names != ["terminate"]:
        return "the Bad step is not a terminate"
    if "answer" in expert:
        return None
    if view.is_final or view.answered_before:
        return "terminating at the end, or after an answer, is not premature"
    return None


def timing(view: StepView, bad: BadStep) -> str | None:
    """Acts where the expert waited, and only on what the loading screen already shows."""
    if not any(c.get("action") == "wait" for c in view.calls):
        return "the expert did not wait"
    if any(c.get("action") == "wait" for c in _calls(bad)):
        return "the Bad step waits too"
    if any(c.get("action") == "answer" for c in _calls(bad)):
        return "an answer from a loading screen reports what only a later screen shows"
    if view.elements and not busy_indicators(view.elements):
        return "the current screen shows no loading state"
    for point in points_of(_calls(bad)):
        later, now = target_at(view.next_elements, *point), target_at(view.elements, *point)
        if later is None or now is None or now.label != later.label:
            return "its target is not on the current screen yet (Visual Hallucination)"
    return _consistent(view, bad)


def prerequisite(view: StepView, bad: BadStep) -> str | None:
    """Types without the focus click the expert makes now; the next step has no own click."""
    if primary_point(view.calls) is None:
        return "the expert step is not a focus click"
    if points_of(list(view.next_calls)):
        return "the next step has its own focus click"
    if "type" not in {c.get("action") for c in _calls(bad)} or points_of(_calls(bad)):
        return "the Bad step does not type without focus"
    if view.elements:
        field = _expert_target(view)
        if field is None or field.role not in TEXT_ROLES:
            return "the expert's click does not focus a text field visible on this screen"
    return _consistent(view, bad)


def _point_of(bad: BadStep) -> tuple[int, int] | None:
    hit = primary_point(_calls(bad))
    return None if hit is None else tuple(hit[1]["coordinate"])  # type: ignore[return-value]


def misalignment(view: StepView, bad: BadStep) -> str | None:
    """The expert's intent, the point on a different element than the expert's."""
    if not bad.intent.strip() or bad.intent != view.intent:
        return "the intent is not the expert's"
    hit, point = primary_point(view.calls), _point_of(bad)
    if hit is None or point is None:
        return "no point action"
    if view.elements:
        here = target_at(view.elements, *hit[1]["coordinate"])
        there = target_at(view.elements, *point)
        if there is None or (here is not None and there.label == here.label):
            return "the point is not on another element"
    return None


def grounding(view: StepView, bad: BadStep) -> str | None:
    """The expert's intent, the point in dead space just outside the expert's element."""
    hit, point = primary_point(view.calls), _point_of(bad)
    if hit is None or point is None:
        return "no point action"
    if bad.intent != view.intent:
        return "the intent is not the expert's"
    if view.elements and target_at(view.elements, *point) is not None:
        return "the point lands on an element, not next to it"
    return None


def named_labels(intent: str, elements: Sequence[Element]) -> list[Element]:
    """Elements of ``elements`` whose label the intent names."""
    return [e for e in elements if e.is_target and e.label and mentions(e.label, intent)]


def hallucination(view: StepView, bad: BadStep) -> str | None:
    """Acts on an element this screen does not show: the intent names no element of the
    (complete) current screen, the point is dead space here and not on the expert's target,
    and the named ghost, where the generator knows it, is absent from this screen."""
    point = _point_of(bad)
    if point is None:
        return "no point action"
    if not bad.intent.strip():
        return "the intent names no element (a ghost needs a name)"
    if view.elements and not view.partial_screens:
        if target_at(view.elements, *point) is not None:
            return "the point lands on an element of this screen"
        shown = named_labels(bad.intent, view.elements)
        if shown:
            return f"the named target '{shown[0].label}' is visible on this screen"
        hit = primary_point(view.calls)
        real = None if hit is None else target_at(view.elements, *hit[1]["coordinate"])
        if real is not None and real.contains(*point):
            return "the point is on the real target"
    ghost = str(bad.extra.get("ghost", ""))
    if ghost and ghost.strip().lower() in on_screen_labels(view.elements):
        return f"the ghost '{ghost}' is on this screen"
    return _consistent(view, bad)


def _annotator_check(view: StepView, bad: BadStep) -> str | None:
    """Semantic dimensions: a real, different step with consistent words."""
    if bad.calls is None:
        return "the Bad call does not parse"
    if list(bad.calls) == list(view.calls):
        return "the Bad step equals the expert's"
    return _consistent(view, bad)


def _known(view: StepView) -> bool:
    return bool(view.elements) and not view.partial_screens


def _expert_target(view: StepView) -> Element | None:
    hit = primary_point(view.calls)
    return None if hit is None else target_at(view.elements, *hit[1]["coordinate"])


def _bad_target(view: StepView, bad: BadStep) -> Element | None:
    point = _point_of(bad)
    return None if point is None else target_at(view.elements, *point)


def observation_neglect(view: StepView, bad: BadStep) -> str | None:
    """Searches (scrolls or swipes) a scrollable region that already shows the expert's
    target."""
    names = {c.get("action") for c in _calls(bad)}
    if not names & {"scroll", "hscroll", "swipe"}:
        return "the Bad step does not search"
    if primary_point(view.calls) is None:
        return "the expert's target is not visible on this screen"
    if view.elements:
        target = _expert_target(view)
        if target is None:
            return "the expert's target is not visible on this screen"
        if scroll_region(view, target) is None:
            return "no scrollable region on this screen holds the target (nothing to scroll)"
    return _annotator_check(view, bad)


def constraint_neglect(view: StepView, bad: BadStep) -> str | None:
    """Takes a visible element of the same kind as the expert's whose name breaks what the
    goal states explicitly (an attribute the goal does not state is not Constraint Neglect)."""
    if _point_of(bad) is None or primary_point(view.calls) is None:
        return "no point action"
    if view.elements:
        right, wrong = _expert_target(view), _bad_target(view, bad)
        if right is None or wrong is None:
            return "the step does not select a visible element"
        if not stated_in_goal(right.label, view.task):
            return "the goal states no attribute of the expert's element"
        if wrong.role != right.role or label_core(wrong.label) == label_core(right.label):
            return "the Bad element is not a sibling of the same kind"
        if stated_in_goal(wrong.label, view.task):
            return "the Bad element is one the goal names"
    return _annotator_check(view, bad)


def semantic_error(view: StepView, bad: BadStep) -> str | None:
    """Hits a real, clickable element precisely whose meaning is not what the goal needs."""
    if view.elements and _point_of(bad) is not None:
        right, wrong = _expert_target(view), _bad_target(view, bad)
        if wrong is None:
            return "the point hits no element (not a precise hit)"
        if wrong.role not in INTERACTIVE_ROLES:
            return f"a {wrong.role} does nothing when clicked (no meaning to misread)"
        if right is not None and wrong.label == right.label:
            return "the Bad element is the expert's"
        if right is not None and constraint_neglect(view, bad) is None:
            return "a same-kind sibling against the goal's words is Constraint Neglect"
    return _annotator_check(view, bad)


CHECKS: dict[str, Check] = {
    PARAMETER_VECTOR.name: parameter_vector,
    ACTION_FORMULATION.name: action_formulation,
    TERMINATION.name: termination,
    TIMING.name: timing,
    PREREQUISITE.name: prerequisite,
    MISALIGNMENT.name: misalignment,
    GROUNDING.name: grounding,
    HALLUCINATION.name: hallucination,
    dimension_by_key("semantic_error").name: semantic_error,
    dimension_by_key("constraint_neglect").name: constraint_neglect,
    dimension_by_key("suboptimal_path").name: _annotator_check,
    dimension_by_key("observation_neglect").name: observation_neglect,
}
"""The property check of every dimension, by exact name."""


def violation(view: StepView, bad: BadStep) -> str | None:
    """Why ``bad`` is not true to its dimension, or ``None`` (see the module docstring)."""
    return CHECKS[bad.dimension](view, bad)
