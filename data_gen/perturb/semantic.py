"""The annotator family: semantic dimensions, requested from the annotator model.

A model writes these (Semantic Error, Constraint Neglect, Observation Neglect, Suboptimal Path)
because they depend on meaning: which label is a plausible confusion, which attribute of the goal
is violated. The offline annotator has no model, so the functions below construct the same kinds
of errors deterministically from the ground truth and the element boxes, and the offline writer
renders them in the perturbation contract; the pipeline then treats them exactly like a model's
answer (parsed, validated, judged).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

from data_gen.perturb.base import StepView
from data_gen.perturb.calls import Call, primary_point
from data_gen.perturb.elements import Element, target_at
from hivig.taxonomy import DIMENSIONS, dimension_by_key

ANNOTATOR_DIMENSIONS: tuple[str, ...] = tuple(
    d.name for d in DIMENSIONS if "programmatic" not in d.generators
)
"""Dimensions only the annotator generates (semantic, not constructible exactly), by exact name
in taxonomy order."""

# (intent, calls, rejected thought, note) of an offline semantic perturbation.
Draft = tuple[str, list[Call], str, str]
Drafter = Callable[[StepView, random.Random], "Draft | None"]

# Observation Neglect: a downward search gesture. Desktop wheel amounts are in pixels (negative =
# down, Qwen3-VL computer_use); the phone swipe moves the finger up by 45 % of the screen height.
SEARCH_SCROLL_PIXELS = (300, 500, 800)
SEARCH_SWIPE = ([500, 750], [500, 300])

_LIST_ROLES = frozenset({"listitem", "menuitem", "option", "row", "tab", "checkbox", "radio"})


def _on_target(view: StepView) -> tuple[int, Call, Element] | None:
    hit = primary_point(view.calls)
    if hit is None:
        return None
    index, call = hit
    el = target_at(view.elements, *call["coordinate"])
    return None if el is None else (index, call, el)


def _moved(view: StepView, index: int, el: Element, rng: random.Random) -> list[Call]:
    # Every call of the step stays (a click-then-type step types into the wrong field), so the
    # drafted intent, which keeps the expert's wording, still agrees with the calls.
    calls = copy.deepcopy(list(view.calls))
    calls[index]["coordinate"] = list(_inside(view, el, rng))
    return calls


def _inside(view: StepView, el: Element, rng: random.Random) -> tuple[int, int]:
    # Scattered over the inner half of the box like an expert click, never the exact centre
    # alone (recurring screens would make the centre's numbers a label).
    x1, y1, x2, y2 = el.box
    for _ in range(8):
        x = rng.randint(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4)
        y = rng.randint(y1 + (y2 - y1) // 4, y2 - (y2 - y1) // 4)
        if target_at(view.elements, x, y) == el:
            return x, y
    return el.centre


def _verb(view: StepView) -> str:
    return "Tap" if view.space == "mobile_use" else "Click"


def _reworded(view: StepView, old: str, new: str) -> str:
    """The expert's own intent with the target's label swapped, in the corpus' style.

    Drafted intents must read like the corpus' (no added final period, no template phrase
    naming the element's role): where the expert's wording names its target, only the label
    changes; otherwise the plain "<verb> <label>" form the corpus uses.
    """
    intent = view.intent.strip()
    if old and old in intent:
        return intent.replace(old, new)
    return f"{_verb(view)} {new}"


def _clean_targets(view: StepView, exclude: Element) -> list[Element]:
    out = [
        e
        for e in view.elements
        if e.is_target
        and e.label
        and e.label != exclude.label
        and target_at(view.elements, *e.centre) == e
    ]
    return sorted(out, key=lambda e: (e.box, e.label, e.role))


def semantic_error(view: StepView, rng: random.Random) -> Draft | None:
    """Hit another real element precisely, misreading it as the one the goal needs."""
    found = _on_target(view)
    if found is None:
        return None
    index, _, el = found
    others = [e for e in _clean_targets(view, el) if e.role != el.role or e.role == "button"]
    if not others:
        return None
    wrong = rng.choice(others)
    intent = _reworded(view, el.label, wrong.label)
    thought = (
        f"The screen shows a '{wrong.label}' {wrong.role}. Its label matches what the task "
        f"needs, so clicking it moves the task forward."
    )
    note = (
        f"'{wrong.label}' ({wrong.role}) read as the control for the goal instead of '{el.label}'"
    )
    return intent, _moved(view, index, wrong, rng), thought, note


def constraint_neglect(view: StepView, rng: random.Random) -> Draft | None:
    """Pick a visible sibling of the same kind that violates the goal's stated attribute."""
    found = _on_target(view)
    if found is None:
        return None
    index, _, el = found
    siblings = [e for e in _clean_targets(view, el) if e.role == el.role and e.role in _LIST_ROLES]
    if not siblings:
        return None
    wrong = rng.choice(siblings)
    intent = _reworded(view, el.label, wrong.label)
    thought = (
        f"Several {el.role} entries are visible; '{wrong.label}' is one of them and fits the "
        f"request well enough, so I will select it."
    )
    note = f"chose '{wrong.label}' although the goal asks for '{el.label}'"
    return intent, _moved(view, index, wrong, rng), thought, note


def observation_neglect(view: StepView, rng: random.Random) -> Draft | None:
    """Scroll to search for a target that is already visible."""
    found = _on_target(view)
    if found is None:
        return None
    _, _, el = found
    calls: list[Call]
    if view.space == "mobile_use":
        start, end = SEARCH_SWIPE
        calls = [{"action": "swipe", "coordinate": list(start), "coordinate2": list(end)}]
        intent = "Swipe up to see more of the list"
    else:
        calls = [{"action": "scroll", "pixels": -rng.choice(SEARCH_SCROLL_PIXELS)}]
        intent = "Scroll down the list"
        if view.platform != "web":
            # Desktop experts move the pointer over the list before the wheel turns (the wheel
            # scrolls what is under the pointer); a bare scroll only in Bad samples is a label.
            calls.insert(0, {"action": "mouse_move", "coordinate": list(_inside(view, el, rng))})
    thought = f"'{el.label}' is probably further down the page, so I need to scroll to find it."
    note = f"scrolled away although '{el.label}' was already visible"
    return intent, calls, thought, note


def suboptimal_path(view: StepView, rng: random.Random) -> Draft | None:
    """Type one character where the whole text could be entered at once."""
    for call in view.calls:
        text = call.get("text")
        if call.get("action") == "type" and isinstance(text, str) and len(text.strip()) >= 2:
            first = text.strip()[0]
            intent = f"Type {first}"
            thought = "Entering the text one character at a time keeps each change easy to check."
            note = f"typed {first!r} alone instead of the whole text {text!r}"
            return intent, [{"action": "type", "text": first}], thought, note
    found = _on_target(view)
    if found is None or view.space == "mobile_use" or found[2].role not in _LIST_ROLES:
        return None
    el = found[2]
    intent = f"Press Down to move to {el.label}"
    thought = "The arrow key moves the selection one entry at a time until it reaches the item."
    note = f"pressed Down once instead of clicking '{el.label}' directly"
    return intent, [{"action": "key", "keys": ["down"]}], thought, note


_DRAFTERS_BY_KEY: dict[str, Drafter] = {
    "semantic_error": semantic_error,
    "constraint_neglect": constraint_neglect,
    "observation_neglect": observation_neglect,
    "suboptimal_path": suboptimal_path,
}

DRAFTERS: dict[str, Drafter] = {
    dimension_by_key(key).name: drafter for key, drafter in _DRAFTERS_BY_KEY.items()
}
"""Offline drafter per annotator-family dimension, by exact name (keys resolved through the
taxonomy; an unknown key fails at import)."""
