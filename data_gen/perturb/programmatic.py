"""Programmatic Bad-step generators: errors that can be constructed exactly and verified.

One function per dimension. Each returns ``None`` when the step offers no honest instance of the
error (a sign flip needs a scroll; a near miss needs a verified element box), so planning can ask
every generator "could you?" with the same call that later produces the sample.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from data_gen.perturb.base import BadStep, StepView
from data_gen.perturb.calls import (
    Call,
    break_json,
    primary_point,
    render_calls,
    render_invalid,
)
from data_gen.perturb.elements import HABIT_DISTANCE, Element, box_gap, target_at
from hivig.taxonomy import DIMENSIONS, Dimension, dimension_by_key

# The dimensions constructed here, from the taxonomy by key (an unknown key fails at import).
PARAMETER_VECTOR = dimension_by_key("parameter_vector_miscalibration")
ACTION_FORMULATION = dimension_by_key("action_formulation_error")
TERMINATION = dimension_by_key("termination_misjudgment")
TIMING = dimension_by_key("timing_and_latency_neglect")
PREREQUISITE = dimension_by_key("procedural_prerequisite_neglect")
MISALIGNMENT = dimension_by_key("action_operation_misalignment")
GROUNDING = dimension_by_key("grounding_spatial_error")
HALLUCINATION = dimension_by_key("visual_hallucination")


@dataclass(frozen=True)
class GenParams:
    """Numeric knobs of the generators (from ``PerturbConfig``)."""

    near_miss_margin: int = 12
    """Least grid units outside the target box for a Grounding/Spatial near miss (the distance
    is drawn from [margin, 1.5 x margin] per sample)."""
    scroll_shrink: float = 0.05
    """Magnitude factor for a miscalibrated scroll, swipe or drag."""


Generator = Callable[[StepView, random.Random, GenParams], "BadStep | None"]


def _bad(
    view: StepView, dim: Dimension, method: str, calls: list[Call], intent: str, note: str
) -> BadStep:
    return BadStep(
        dimension=dim.name,
        method=method,
        generator="programmatic",
        intent=intent,
        text=render_calls(calls, view.space),
        calls=tuple(calls),
        note=note,
    )


def _clamp(v: float) -> int:
    return max(0, min(1000, round(v)))


def _shrunk(start: list[int], end: list[int], factor: float) -> list[int]:
    return [_clamp(s + (e - s) * factor) for s, e in zip(start, end, strict=True)]


# --------------------------------------------------------------------------------------------
# Parameter Vector Miscalibration


def parameter_vector(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Reverse or shrink the vector of a scroll, hscroll, swipe or drag."""
    dim = PARAMETER_VECTOR
    calls = copy.deepcopy(list(view.calls))
    for i, call in enumerate(calls):
        name = call.get("action")
        if name in ("scroll", "hscroll") and isinstance(call.get("pixels"), int) and call["pixels"]:
            px = call["pixels"]
            small = int(px * p.scroll_shrink) or (1 if px > 0 else -1)
            # "Scroll down" over an upward wheel contradicts its own words (Misalignment), so
            # where the intent states a direction only the magnitude is miscalibrated.
            flip = [] if _states_direction(view.intent) else ["sign_flip"]
            methods = flip + (["shrink"] if abs(small) < abs(px) else [])
            if not methods:
                continue
            method = rng.choice(methods)
            call["pixels"] = -px if method == "sign_flip" else small
            # Words only: the expert's magnitude is not in the critic's input (privileged).
            note = _VECTOR_NOTES[method].format(kind="wheel scroll" if name == "scroll" else name)
            return _bad(view, dim, f"{name}_{method}", calls, view.intent, note)
        if name == "swipe" and call.get("coordinate") != call.get("coordinate2"):
            method = "shrink" if _states_direction(view.intent) else rng.choice(["swap", "shrink"])
            a, b = call["coordinate"], call["coordinate2"]
            if method == "swap":
                call["coordinate"], call["coordinate2"] = b, a
            else:
                call["coordinate2"] = _shrunk(a, b, p.scroll_shrink)
                if call["coordinate2"] == a:
                    continue
            note = _VECTOR_NOTES["swap" if method == "swap" else "shrink"].format(kind="swipe")
            return _bad(view, dim, f"swipe_{method}", calls, view.intent, note)
        if name == "left_click_drag" and i > 0 and calls[i - 1].get("action") == "mouse_move":
            start, end = calls[i - 1]["coordinate"], call["coordinate"]
            if start == end:
                continue
            # A drag whose intent says where it goes ("onto the folder", "to the right") run
            # backwards contradicts those words: Action-Operation Misalignment, not a vector.
            reversible = not states_destination(view.intent)
            method = rng.choice(["reverse", "shrink"]) if reversible else "shrink"
            if method == "reverse":
                calls[i - 1]["coordinate"], call["coordinate"] = end, start
            else:
                call["coordinate"] = _shrunk(start, end, p.scroll_shrink)
                if call["coordinate"] == start:
                    continue
            note = _VECTOR_NOTES["swap" if method == "reverse" else "shrink"].format(kind="drag")
            return _bad(view, dim, f"drag_{method}", calls, view.intent, note)
    return None


_VECTOR_NOTES = {
    "sign_flip": "the {kind} turns the opposite way to where the content has to move",
    "swap": "the {kind} runs backwards, from its end point to its start",
    "shrink": "the {kind} is far too short to move the content noticeably",
}


_DESTINATION = re.compile(
    r"\b(?:onto|into|towards?|over|to the|left|right|up|down|upwards?|downwards?)\b",
    re.IGNORECASE,
)
"""Words that say where a drag goes: a place ("onto the folder", "to the trash") or a direction
("to the left", "up"); "drag to select" says how, not where."""


def states_destination(intent: str) -> bool:
    """Whether a drag's intent says in words where it goes (a place or a direction)."""
    return bool(_DESTINATION.search(intent))


def _states_direction(intent: str) -> bool:
    """Whether the intent names a direction (up, down), which a reversed vector would break."""
    return bool(re.search(r"\b(up|down|upward|downward)s?\b", intent, re.IGNORECASE))


# --------------------------------------------------------------------------------------------
# Action Formulation Error

_REQUIRED_KEYS = ("coordinate", "coordinate2", "text", "keys", "pixels", "time", "status", "button")
_BAD_ENUMS = {
    "left_click": "leftclick",
    "click": "tap",
    "type": "type_text",
    "key": "press_key",
    "scroll": "scroll_down",
    "hscroll": "scroll_right",
    "swipe": "swipe_up",
    "wait": "sleep",
    "terminate": "finish",
    "answer": "reply",
    "double_click": "doubleclick",
    "right_click": "rightclick",
    "long_press": "longpress",
    "system_button": "press_button",
    "mouse_move": "move_mouse",
    "left_click_drag": "drag",
    "open": "open_app",
    "triple_click": "tripleclick",
    "middle_click": "middleclick",
}


def action_formulation(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Keep the intent, break the call: unbalanced JSON, a missing argument or a bad enum."""
    dim = ACTION_FORMULATION
    calls = list(view.calls)
    if not calls:
        return None
    index = next((i for i, c in enumerate(calls) if set(c) & set(_REQUIRED_KEYS)), 0)
    call = calls[index]
    missing = [k for k in _REQUIRED_KEYS if k in call]
    methods = ["broken_json", "bad_enum"] + (["missing_argument"] if missing else [])
    method = rng.choice(sorted(methods))
    if method == "broken_json":
        text = break_json(render_calls(calls, view.space), index)
        note = "the JSON of the call lost its closing brace"
    elif method == "missing_argument":
        key = missing[0]
        args = {k: v for k, v in call.items() if k != key}
        text = render_invalid(calls, view.space, index, args)
        note = f"{call['action']} without its required {key!r}"
    else:
        wrong = _BAD_ENUMS.get(str(call.get("action")), f"{call.get('action')}_action")
        text = render_invalid(calls, view.space, index, {**call, "action": wrong})
        note = f"action name {wrong!r} is not in the action space"
    return BadStep(dim.name, method, "programmatic", view.intent, text, None, note=note)


# --------------------------------------------------------------------------------------------
# Termination Misjudgment

_TERMINAL = ("terminate", "answer")


def termination(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Premature terminate, terminate instead of answer, or an action after completion.

    Property (``properties.termination``): the Bad step ends the episode too early or in the
    wrong form, or acts after a *successful* end; its intent is empty, so the plan shows the
    pair (Good and Bad) as tool calls only. Any wording would lie: the step's own intent
    (reporting an answer, clicking a field) contradicts a bare ``terminate`` (that contradiction
    is Action-Operation Misalignment), the episode's closing words are future information, and
    an earlier step's words are a copy the critic could spot in the history.

    A terminate after an answer is the correct ending, never an error; its Bad counterpart is a
    redundant action instead. Once the expert has answered, ending early is not an error either,
    so no premature terminate is built after an answer.
    """
    dim = TERMINATION
    actions = [c.get("action") for c in view.calls]
    stop = {"action": "terminate", "status": "success"}
    if "answer" in actions:
        note = "ended with terminate where the task asks for an answer"
        return _bad(view, dim, "terminate_instead_of_answer", [stop], "", note)
    if "terminate" in actions:
        # "After the goal was met" is only true where the expert ended with success.
        if not any(
            c.get("status") == "success" for c in view.calls if c.get("action") == "terminate"
        ):
            return None
        present = [e for e in _targets(view.elements) if e.label]
        if not present:
            return None
        el = rng.choice(present)
        name = "click" if view.space == "mobile_use" else "left_click"
        call = {"action": name, "coordinate": list(_inside_point(view.elements, el, rng))}
        note = f"a redundant click on {el.described()} after the goal was met"
        return _bad(view, dim, "action_after_completion", [call], "", note)
    if view.is_final or view.answered_before:
        return None
    note = "terminated while the task was still unfinished"
    return _bad(view, dim, "premature_terminate", [stop], "", note)


# --------------------------------------------------------------------------------------------
# Timing and Latency Neglect


BUSY_ROLES = frozenset({"progress", "spinner", "button_disabled"})
"""Roles of busy indicators: a progress bar, a spinner, a control still disabled."""

TEXT_ROLES = frozenset({"textbox", "searchbox", "combobox", "textarea", "field"})
"""Roles that take typed text once focused."""


def busy_indicators(elements: Sequence[Element]) -> list[Element]:
    """The loading-state elements of a screen."""
    return [e for e in elements if e.role in BUSY_ROLES or "loading" in e.label.lower()]


def timing(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Act before the interface is ready: where the expert waited, act at once.

    The Bad step is the action the expert took after the wait, with the expert's words for it.
    Property (``properties.timing``): every point the Bad step acts on already shows, on the
    current (loading) screen, the element the next screen has there. A next step whose target
    is not on the current screen yet is Visual Hallucination's definition, not Timing's, so
    such steps are left to the hallucination generator.
    """
    if not any(c.get("action") == "wait" for c in view.calls):
        return None
    # An answer read off the still-loading screen is acting while busy too; a terminate is not.
    nxt = [c for c in view.next_calls if c.get("action") not in ("wait", "terminate")]
    if not nxt or not view.next_intent.strip() or not busy_indicators(view.elements):
        return None
    if any(c.get("action") == "answer" for c in nxt):
        # The value an answer reports shows only once loading is over: the words would state
        # a fact the loading screen does not show.
        return None
    if not all(_shown_already(view, point) for point in points_of(nxt)):
        return None
    note = "acted while the interface was still loading instead of waiting"
    return _bad(view, TIMING, "act_instead_of_wait", nxt, view.next_intent, note)


def _shown_already(view: StepView, point: tuple[int, int]) -> bool:
    """Whether the element the next screen has at ``point`` is on the current screen there."""
    later = target_at(view.next_elements, *point)
    now = target_at(view.elements, *point)
    return later is not None and now is not None and now.label == later.label


# --------------------------------------------------------------------------------------------
# Procedural Prerequisite Neglect


def prerequisite(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Where the expert's focus click comes before a typing step, type without it.

    Property (``properties.prerequisite``): the current step is a point action (the focus
    click), the next step types and has no point action of its own (had it one, skipping the
    current click would neglect nothing), and the Bad step is that next step with its own
    words, so intent and calls agree.
    """
    if primary_point(view.calls) is None or not view.next_intent.strip():
        return None
    nxt = list(view.next_calls)
    if not any(c.get("action") == "type" for c in nxt) or points_of(nxt):
        return None
    field = target_at(view.elements, *primary_point(view.calls)[1]["coordinate"])  # type: ignore[index]
    if view.elements and (field is None or field.role not in TEXT_ROLES):
        # The prerequisite skipped is focusing a field this screen shows.
        return None
    note = "typed before the text field received focus"
    return _bad(view, PREREQUISITE, "type_without_focus", nxt, view.next_intent, note)


# --------------------------------------------------------------------------------------------
# Element-based: Action-Operation Misalignment, Grounding/Spatial Error, Visual Hallucination


def _targets(elements: tuple[Element, ...]) -> list[Element]:
    return sorted((e for e in elements if e.is_target), key=lambda e: (e.box, e.label, e.role))


def _moved(view: StepView, index: int, point: tuple[int, int]) -> list[Call]:
    calls = copy.deepcopy(list(view.calls))
    calls[index]["coordinate"] = list(point)
    return calls


MISALIGNMENT_NEIGHBOURS = 4
"""Action-Operation Misalignment points at one of this many elements nearest the expert's."""


def misalignment(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Keep the intent, put the coordinates on another element (needs a visible intent)."""
    hit = primary_point(view.calls)
    if hit is None or not view.intent.strip():
        return None
    index, call = hit
    x, y = call["coordinate"]
    here = target_at(view.elements, x, y)
    others = [
        e
        for e in _targets(view.elements)
        if not e.contains(x, y)
        and (here is None or e.label != here.label)
        and target_at(view.elements, *e.centre) == e
        and e.role not in NOT_CLICKED
    ]
    if not others:
        return None
    # One of the elements nearest the expert's point: a slip to a neighbour is the plausible
    # mismatch, and points drawn over the whole screen would land on the window and browser
    # chrome (present on every screen, rarely the expert's target) so often that their
    # coordinates alone would mark the Bad samples.
    others.sort(key=lambda e: (box_gap(e.box, (x, y)), e.box, e.label))
    el = rng.choice(others[:MISALIGNMENT_NEIGHBOURS])
    note = f"the call lands on {el.described()}, not on what the intent names"
    point = _inside_point(view.elements, el, rng)
    return _bad(view, MISALIGNMENT, "other_element", _moved(view, index, point), view.intent, note)


def grounding(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """A near miss just outside the verified target box, in dead space."""
    hit = primary_point(view.calls)
    if hit is None:
        return None
    index, call = hit
    x, y = call["coordinate"]
    el = target_at(view.elements, x, y)
    if el is None or el.role in NOT_CLICKED:
        # A document's listed box is its text, but the whole editor takes the click: a point
        # "just outside" it still lands in the editor.
        return None
    x1, y1, x2, y2 = el.box
    # At least the margin outside, up to half again: a fixed offset from a box that recurs
    # across episodes would put the same numbers into every near miss of that screen.
    m = p.near_miss_margin + rng.randint(0, p.near_miss_margin // 2)
    # Along the edge the point scatters like an expert's click; across it, it is m outside.
    cx = rng.randint(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4)
    cy = rng.randint(y1 + (y2 - y1) // 4, y2 - (y2 - y1) // 4)
    candidates = [(x1 - m, cy), (x2 + m, cy), (cx, y1 - m), (cx, y2 + m)]
    valid = [
        (px, py)
        for px, py in candidates
        # Keep the marker on screen: a point on the very edge would draw a clipped X.
        if m <= px <= 1000 - m and m <= py <= 1000 - m and target_at(view.elements, px, py) is None
    ]
    if not valid:
        return None
    point = rng.choice(valid)
    note = f"the point lies just outside {el.described()}, on nothing clickable"
    return _bad(view, GROUNDING, "near_miss", _moved(view, index, point), view.intent, note)


def mentions(label: str, text: str) -> bool:
    """Whether ``text`` names ``label`` as a whole phrase (case-insensitive)."""
    return bool(label.strip()) and _phrase(label).search(text) is not None


def _phrase(label: str) -> re.Pattern[str]:
    """``label`` as a whole phrase, any case."""
    return re.compile(rf"(?<![\w]){re.escape(label.strip())}(?![\w])", re.IGNORECASE)


def on_screen_labels(elements: tuple[Element, ...]) -> set[str]:
    """Lower-case labels of the clickable elements of a screen."""
    return {e.label.strip().lower() for e in elements if e.is_target and e.label.strip()}


def hallucination(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Act on an element that is not on the current screen: a *layout-habit* ghost.

    The ghost is an item of the same kind as the expert's target (a contact, a file, an alarm)
    that the same kind of screen shows in another episode and this one does not, clicked where
    it sits there or where the next item of this screen's list would be. The intent is the
    expert's own with the ghost's name in place of the target's, so the pair differs in what
    it names and where it points, never in form: the words of the Bad are those of a real step
    elsewhere in the corpus, and only the screen tells them apart (the taxonomy's "a position
    guessed from layout habits instead of what is visible").

    The taxonomy's other two kinds (an element of an earlier screen, one that appears only
    after a skipped step) are not built here: their words are an earlier or a later step's,
    which tells a text-only reader which of the pair is the Bad (a paired probe read 0.92
    AUC on them).

    Property (``properties.hallucination``): the element the intent names is on no part of
    the (complete) current element list, and the point is dead space here, far from the
    expert's target.

    Terminal steps get none: a click where the expert ended the task is Termination
    Misjudgment's "action after completion".
    """
    if view.partial_screens or any(c.get("action") in _TERMINAL for c in view.calls):
        # A partial element list cannot show that the ghost is absent from this screen.
        return None
    hit = primary_point(view.calls)
    if hit is None or not view.elements:
        return None
    real = target_at(view.elements, *hit[1]["coordinate"])
    if real is None:
        return None
    options = [
        o
        for o in _habit_ghosts(view, real, rng) + _habit_steps(view, real)
        # Words that also name an element of this screen would not be about an absent
        # element alone.
        if not any(e.is_target and e.label and mentions(e.label, o[1]) for e in view.elements)
    ]
    if not options:
        return None
    method, intent, calls, label = options[rng.randrange(len(options))]
    note = f"acted on '{label}', which this screen does not show"
    bad = _bad(view, HALLUCINATION, method, calls, intent, note)
    return dataclasses.replace(bad, extra={"ghost": label})


def _far_dead_point(view: StepView, real: Element, point: tuple[int, int]) -> bool:
    return target_at(view.elements, *point) is None and box_gap(real.box, point) >= HABIT_DISTANCE


def _habit_ghosts(
    view: StepView, real: Element, rng: random.Random
) -> list[tuple[str, str, list[Call], str]]:
    """Targets of similar screens that this one lacks, of the expert target's own kind; the
    words are the expert's intent with the ghost's label in place of the real one."""
    if not real.label or not mentions(real.label, view.intent) or real.role in NOT_CLICKED:
        return []
    here = on_screen_labels(view.elements)
    index, _ = primary_point(view.calls)  # type: ignore[misc]
    slot = _next_slot(view.elements, real)
    out = []
    for label, role, *box in view.habit_ghosts:
        if role != real.role or label.strip().lower() in here or not _same_column(box, real.box):
            continue
        # Where it sits on the similar screen, else where the next item of this screen's list
        # of its kind would be: both positions guessed from layout, not from what is shown.
        # Scattered over the box as expert clicks scatter over theirs.
        for where in (tuple(box), slot):
            point = None if where is None else _scatter(where, rng)
            if point is not None and _far_dead_point(view, real, point):
                intent = _named_instead(view.intent, real.label, label)
                out.append(("habit_ghost", intent, _moved(view, index, point), label))
                break
    return out


def _habit_steps(view: StepView, real: Element) -> list[tuple[str, str, list[Call], str]]:
    """Expert steps of similar screens in other episodes whose element this screen lacks
    (``ElementIndex.habit_steps``), proposed here as they are: their words and their point
    are a real step's."""
    out = []
    for label, intent, text in view.habit_steps:
        calls = json.loads(text)
        hit = primary_point(calls)
        if hit is None or intent.strip() == view.intent.strip() or intent in view.earlier_intents:
            continue
        if _far_dead_point(view, real, tuple(hit[1]["coordinate"])):  # type: ignore[arg-type]
            out.append(("habit_step", intent, calls, label))
    return out


def _named_instead(intent: str, label: str, other: str) -> str:
    """``intent`` with its first whole-word mention of ``label`` (any case) naming ``other``."""
    return _phrase(label).sub(lambda _: other, intent, count=1)


def _same_column(box: list[int] | tuple[int, ...], other: tuple[int, int, int, int]) -> bool:
    """Whether two boxes are rows of one list: the same left edge and width, near enough."""
    width, other_width = box[2] - box[0], other[2] - other[0]
    return abs(box[0] - other[0]) <= COLUMN_SLACK and abs(width - other_width) <= COLUMN_SLACK


COLUMN_SLACK = 12
"""Grid units two rows of one list may differ by in left edge and width."""


def _next_slot(elements: tuple[Element, ...], real: Element) -> tuple[int, int, int, int] | None:
    """The box of the row after the last element of ``real``'s list (its role, its column),
    the same step below it as between its last two rows, or ``None`` off the grid or without
    a list."""
    rows = sorted(
        (
            e.box
            for e in elements
            if e.is_target and e.role == real.role and _same_column(e.box, real.box)
        ),
        key=lambda b: b[1],
    )
    if len(rows) < 2:
        return None
    (_, prev_top, _, _), (x1, top, x2, bottom) = rows[-2], rows[-1]
    step = top - prev_top
    if step <= 0 or bottom + step > 1000:
        return None
    return x1, top + step, x2, bottom + step


def _scatter(box: tuple[int, int, int, int], rng: random.Random) -> tuple[int, int]:
    """A point in the inner half of ``box``."""
    x1, y1, x2, y2 = box
    return (
        rng.randint(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4),
        rng.randint(y1 + (y2 - y1) // 4, y2 - (y2 - y1) // 4),
    )


NOT_CLICKED = frozenset({"clock", "status", "titlebar", "progress", "document", "addressbar"})
"""Roles nobody clicks to make progress (a clock, a status line): no plausible ghost."""


def points_of(calls: list[Call] | tuple[Call, ...]) -> list[tuple[int, int]]:
    """Every grid point a list of calls acts on or moves to (clicks, moves, drags, swipes)."""
    out = []
    for c in calls:
        for key in ("coordinate", "coordinate2"):
            v = c.get(key)
            if isinstance(v, list) and len(v) == 2:
                out.append((int(v[0]), int(v[1])))
    return out


def _inside_point(
    elements: tuple[Element, ...], el: Element, rng: random.Random
) -> tuple[int, int]:
    """A point in the inner half of ``el``'s box that still hits ``el`` (its centre otherwise).

    Expert clicks scatter over their element; a Bad point always on the exact centre would let
    the coordinates alone tell the samples apart on screens that recur across episodes.
    """
    x1, y1, x2, y2 = el.box
    for _ in range(8):
        x = rng.randint(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4)
        y = rng.randint(y1 + (y2 - y1) // 4, y2 - (y2 - y1) // 4)
        if not elements or target_at(elements, x, y) == el:
            return x, y
    return el.centre


_GENERATORS: dict[Dimension, Generator] = {
    PARAMETER_VECTOR: parameter_vector,
    ACTION_FORMULATION: action_formulation,
    TERMINATION: termination,
    TIMING: timing,
    PREREQUISITE: prerequisite,
    MISALIGNMENT: misalignment,
    GROUNDING: grounding,
    HALLUCINATION: hallucination,
}

PROGRAMMATIC: dict[str, Generator] = {
    d.name: _GENERATORS[d] for d in DIMENSIONS if "programmatic" in d.generators
}
"""Programmatic generator per exact dimension name, for every dimension the taxonomy marks as
programmatically generable (in taxonomy order; a missing generator fails at import)."""
