"""Programmatic Bad-step generators: errors that can be constructed exactly and verified.

One function per dimension. Each returns ``None`` when the step offers no honest instance of the
error (a sign flip needs a scroll; a near miss needs a verified element box), so planning can ask
every generator "could you?" with the same call that later produces the sample.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from data_gen.perturb.base import BadStep, StepView
from data_gen.perturb.calls import (
    Call,
    break_json,
    primary_point,
    render_calls,
    render_invalid,
)
from data_gen.perturb.elements import Element, target_at
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
    """Grid units outside the target box for a Grounding/Spatial near miss."""
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
            methods = ["sign_flip"] + (["shrink"] if abs(small) < abs(px) else [])
            method = rng.choice(methods)
            call["pixels"] = -px if method == "sign_flip" else small
            note = f"{name} of {px} px became {call['pixels']} px"
            return _bad(view, dim, f"{name}_{method}", calls, view.intent, note)
        if name == "swipe" and call.get("coordinate") != call.get("coordinate2"):
            method = rng.choice(["swap", "shrink"])
            a, b = call["coordinate"], call["coordinate2"]
            if method == "swap":
                call["coordinate"], call["coordinate2"] = b, a
            else:
                call["coordinate2"] = _shrunk(a, b, p.scroll_shrink)
                if call["coordinate2"] == a:
                    continue
            note = f"swipe {a}->{b} became {call['coordinate']}->{call['coordinate2']}"
            return _bad(view, dim, f"swipe_{method}", calls, view.intent, note)
        if name == "left_click_drag" and i > 0 and calls[i - 1].get("action") == "mouse_move":
            start, end = calls[i - 1]["coordinate"], call["coordinate"]
            if start == end:
                continue
            method = rng.choice(["reverse", "shrink"])
            if method == "reverse":
                calls[i - 1]["coordinate"], call["coordinate"] = end, start
            else:
                call["coordinate"] = _shrunk(start, end, p.scroll_shrink)
                if call["coordinate"] == start:
                    continue
            note = f"drag {start}->{end} became {calls[i - 1]['coordinate']}->{call['coordinate']}"
            return _bad(view, dim, f"drag_{method}", calls, view.intent, note)
    return None


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
        note = f"the JSON of call {index + 1} lost its closing brace"
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

    A terminate after an answer is the correct ending, never an error; its Bad counterpart is a
    redundant action instead.
    """
    dim = TERMINATION
    actions = [c.get("action") for c in view.calls]
    stop = {"action": "terminate", "status": "success"}
    if "answer" in actions:
        note = "ended with terminate where the task asks for an answer"
        intent = "The requested information is visible, so the task is complete; ending now."
        return _bad(view, dim, "terminate_instead_of_answer", [stop], intent, note)
    if "terminate" in actions:
        targets = sorted((e for e in view.elements if e.is_target), key=lambda e: (e.box, e.label))
        if not targets:
            return None
        el = rng.choice(targets)
        name = "click" if view.space == "mobile_use" else "left_click"
        call = {"action": name, "coordinate": list(el.centre)}
        intent = f"Click '{el.label}' once more to make sure the change is applied."
        note = f"a redundant click on '{el.label}' after the goal was met"
        return _bad(view, dim, "action_after_completion", [call], intent, note)
    if view.is_final:
        return None
    intent = "The goal looks achieved on this screen, so the task can be finished."
    note = "terminated while the task was still unfinished"
    return _bad(view, dim, "premature_terminate", [stop], intent, note)


# --------------------------------------------------------------------------------------------
# Timing and Latency Neglect


def timing(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Act before the interface is ready.

    Where the expert waited, act at once with the action the expert took after the wait.
    Otherwise, where the next step targets an element that only appears once this step's effect
    has rendered, chain that action into this step: it fires while the screen is still changing.
    """
    dim = TIMING
    if any(c.get("action") == "wait" for c in view.calls):
        nxt = [c for c in view.next_calls if c.get("action") not in ("wait",) + _TERMINAL]
        if not nxt:
            return None
        note = "acted while the interface was still loading instead of waiting"
        return _bad(view, dim, "act_instead_of_wait", nxt, view.next_intent or view.intent, note)
    if any(c.get("action") in _TERMINAL for c in (*view.calls, *view.next_calls)):
        return None
    hit = primary_point(view.next_calls)
    if hit is None:
        return None
    upcoming = target_at(view.next_elements, *hit[1]["coordinate"])
    if upcoming is None or upcoming.label in {e.label for e in view.elements}:
        return None
    calls = [*view.calls, *view.next_calls]
    first = view.intent.rstrip(". ") or "Do this step"
    then = view.next_intent.rstrip(". ") or f"use '{upcoming.label}'"
    intent = f"{first}, and straight away {then[:1].lower()}{then[1:]}."
    note = f"chained a click on '{upcoming.label}' into the step before the screen had updated"
    return _bad(view, dim, "chained_before_render", calls, intent, note)


# --------------------------------------------------------------------------------------------
# Procedural Prerequisite Neglect


def prerequisite(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Where the expert clicks a field before typing, type without the focus click."""
    if primary_point(view.calls) is None:
        return None
    typed = [c for c in view.next_calls if c.get("action") == "type"]
    if not typed:
        return None
    note = "typed before the text field received focus"
    return _bad(
        view,
        PREREQUISITE,
        "type_without_focus",
        typed,
        view.next_intent or view.intent,
        note,
    )


# --------------------------------------------------------------------------------------------
# Element-based: Action-Operation Misalignment, Grounding/Spatial Error, Visual Hallucination


def _targets(elements: tuple[Element, ...]) -> list[Element]:
    return sorted((e for e in elements if e.is_target), key=lambda e: (e.box, e.label, e.role))


def _moved(view: StepView, index: int, point: tuple[int, int]) -> list[Call]:
    calls = copy.deepcopy(list(view.calls))
    calls[index]["coordinate"] = list(point)
    return calls


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
    ]
    if not others:
        return None
    el = rng.choice(others)
    note = f"the intent is kept but the call targets '{el.label}' ({el.role})"
    return _bad(
        view,
        MISALIGNMENT,
        "other_element",
        _moved(view, index, el.centre),
        view.intent,
        note,
    )


def grounding(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """A near miss just outside the verified target box, in dead space."""
    hit = primary_point(view.calls)
    if hit is None:
        return None
    index, call = hit
    x, y = call["coordinate"]
    el = target_at(view.elements, x, y)
    if el is None:
        return None
    x1, y1, x2, y2 = el.box
    m = p.near_miss_margin
    cx, cy = el.centre
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
    note = f"landed at {list(point)}, just outside '{el.label}' {list(el.box)}"
    return _bad(view, GROUNDING, "near_miss", _moved(view, index, point), view.intent, note)


def hallucination(view: StepView, rng: random.Random, p: GenParams) -> BadStep | None:
    """Act on an element from an earlier screen that is no longer on this one."""
    present = {e.label for e in view.elements}
    ghosts = [
        e
        for screen in view.earlier_elements
        for e in _targets(screen)
        if e.label and e.label not in present and target_at(view.elements, *e.centre) is None
    ]
    if not ghosts:
        return None
    ghost = rng.choice(sorted(set(ghosts), key=lambda e: (e.box, e.label)))
    hit = primary_point(view.calls)
    if hit is not None:
        calls = _moved(view, hit[0], ghost.centre)
        calls = [calls[hit[0]]]
    else:
        name = "click" if view.space == "mobile_use" else "left_click"
        calls = [{"action": name, "coordinate": list(ghost.centre)}]
    intent = f"Click the '{ghost.label}' {ghost.role} to continue with the task."
    note = f"'{ghost.label}' was on an earlier screen and is not on this one"
    return _bad(view, HALLUCINATION, "stale_target", calls, intent, note)


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
