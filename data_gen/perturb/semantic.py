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
import re
from collections.abc import Callable

from data_gen.perturb.base import StepView
from data_gen.perturb.calls import Call, primary_point
from data_gen.perturb.elements import Element, target_at
from data_gen.perturb.programmatic import mentions
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
# down, Qwen3-VL computer_use); the phone swipe moves the finger up over half the list.
SEARCH_SCROLL_PIXELS = (300, 500, 800)


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


INTERACTIVE_ROLES = frozenset(
    {"button", "link", "menuitem", "menu", "icon", "tab", "checkbox", "dock", "taskbar"}
    | {"navigation", "folder"}
)
"""Roles whose meaning an agent can misread and still click precisely (Semantic Error); a
clock, a status line or a title bar does nothing when clicked, so it is no plausible misreading."""

SCROLLABLE_ROLES = frozenset({"list"})
"""Containers that scroll: Observation Neglect searches one that already shows its target."""

LISTED_ROLES = frozenset({"file", "listitem", "contact", "alarm", "link", "folder", "row"})
"""Entries of a scrolling list (a menu entry floats over the page: scrolling never finds it)."""


def label_core(label: str) -> str:
    """The part of a label a goal states ("7:45 AM" of "7:45 AM  Gym", the product of
    "Desk Lamp LED: 18 sold")."""
    return re.split(r"\s{2,}|:\s", label.strip())[0].strip()


def stated_in_goal(label: str, task: str) -> bool:
    """Whether the goal names the element (its label's core) explicitly."""
    core = label_core(label)
    return len(core) >= 2 and mentions(core, task)


def _pick(rng: random.Random, options: tuple[str, ...], **values: str) -> str:
    return options[rng.randrange(len(options))].format(**values)


_SEMANTIC_THOUGHTS = (
    "The '{wrong}' {role} is what carries out this part of the task, so I will use it.",
    "Reading the labels on this screen, '{wrong}' is the control that does what the goal "
    "needs next.",
    "'{wrong}' matches the next thing the goal asks for; selecting it moves the task on.",
    "The {role} '{wrong}' is the way forward here, so I will select it now.",
)


def semantic_error(view: StepView, rng: random.Random) -> Draft | None:
    """Hit another real, clickable element precisely, misreading it as the one the goal needs.

    Never a sibling that breaks a stated attribute of the goal (that is Constraint Neglect)
    and never a non-interactive element (clicking a clock misreads nothing).
    """
    found = _on_target(view)
    if found is None:
        return None
    index, _, el = found
    others = [
        e
        for e in _clean_targets(view, el)
        if e.role in INTERACTIVE_ROLES
        # The same kind of control (Save for Save As..., Cancel for Save): the confusion a
        # misread label makes, and the expert's phrase still reads right with the new label.
        and e.role == el.role
        and not stated_in_goal(e.label, view.task)
    ]
    if not others:
        return None
    wrong = rng.choice(others)
    intent = _reworded(view, el.label, wrong.label)
    thought = _pick(rng, _SEMANTIC_THOUGHTS, wrong=wrong.label, role=wrong.role)
    note = f"{wrong.described()} read as the control the goal needs"
    return intent, _moved(view, index, wrong, rng), thought, note


_CONSTRAINT_THOUGHTS = (
    "'{wrong}' is right here in the list, so I will take it.",
    "The {role} entries are visible; '{wrong}' is the one I need.",
    "I can see '{wrong}' on the screen, which is what the task asks for.",
    "'{wrong}' is the {role} to act on, and it is already visible.",
)


def constraint_neglect(view: StepView, rng: random.Random) -> Draft | None:
    """Pick a visible sibling of the same kind whose name breaks what the goal states.

    The goal names the expert's element (a file, a contact, an alarm time, a product); the
    Bad step takes another element of the same role that the goal does not name, so the one
    attribute the goal states explicitly is ignored.
    """
    found = _on_target(view)
    if found is None:
        return None
    index, _, el = found
    if el.role in INTERACTIVE_ROLES - {"folder"} or not stated_in_goal(el.label, view.task):
        return None
    siblings = [
        e
        for e in _clean_targets(view, el)
        if e.role == el.role
        and not stated_in_goal(e.label, view.task)
        and label_core(e.label) != label_core(el.label)
    ]
    if not siblings:
        return None
    wrong = rng.choice(siblings)
    intent = _reworded(view, label_core(el.label), label_core(wrong.label))
    thought = _pick(rng, _CONSTRAINT_THOUGHTS, wrong=label_core(wrong.label), role=el.role)
    note = f"took '{label_core(wrong.label)}', which the goal does not name"
    return intent, _moved(view, index, wrong, rng), thought, note


def scroll_region(view: StepView, el: Element) -> Element | None:
    """The smallest scrollable container on the screen that holds ``el``'s centre, where
    ``el`` is an entry such a list shows (``None`` otherwise)."""
    if el.role not in LISTED_ROLES:
        return None
    holders = [e for e in view.elements if e.role in SCROLLABLE_ROLES and e.contains(*el.centre)]
    return min(holders, key=lambda e: (e.area, e.box)) if holders else None


_SEARCH_INTENTS = {
    "mobile_use": ("Swipe up on the list to scroll down",),
    "web": ("Scroll down the results page",),
    "desktop": ("Scroll down the file list to reveal more files",),
}

_SEARCH_THOUGHTS = (
    "'{label}' is not in view yet; it must be further down, so I will scroll.",
    "I need '{label}', and the rest of the list is below, so scrolling comes first.",
    "Before choosing, I will move the list to find '{label}'.",
)


def observation_neglect(view: StepView, rng: random.Random) -> Draft | None:
    """Scroll a list that already shows the target, pushing it out of view."""
    found = _on_target(view)
    if found is None:
        return None
    _, _, el = found
    region = scroll_region(view, el)
    if region is None:
        return None
    calls: list[Call]
    x1, y1, x2, y2 = region.box
    if view.space == "mobile_use":
        x = (x1 + x2) // 2 + rng.randint(-20, 20)
        start = [x, y1 + (y2 - y1) * 3 // 4]
        end = [x, y1 + (y2 - y1) // 4 + rng.randint(-10, 10)]
        calls = [{"action": "swipe", "coordinate": start, "coordinate2": end}]
        intent = _SEARCH_INTENTS["mobile_use"][0]
    else:
        calls = [{"action": "scroll", "pixels": -rng.choice(SEARCH_SCROLL_PIXELS)}]
        intent = _SEARCH_INTENTS["web" if view.platform == "web" else "desktop"][0]
        if el.role != ("link" if view.platform == "web" else "file"):
            # The corpus' phrases speak of results (web) and files (desktop); any other list
            # is "the list".
            intent = "Scroll down the list"
        if view.platform != "web":
            # Desktop experts move the pointer over the list before the wheel turns (the wheel
            # scrolls what is under the pointer); a bare scroll only in Bad samples is a label.
            inside = Element(region.label, "listitem", region.box)
            calls.insert(0, {"action": "mouse_move", "coordinate": list(_inside_box(inside, rng))})
    if intent in view.earlier_intents:
        return None
    thought = _pick(rng, _SEARCH_THOUGHTS, label=el.label)
    note = f"scrolled away although {el.described()} was already visible"
    return intent, calls, thought, note


def _inside_box(el: Element, rng: random.Random) -> tuple[int, int]:
    x1, y1, x2, y2 = el.box
    return (
        rng.randint(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4),
        rng.randint(y1 + (y2 - y1) // 4, y2 - (y2 - y1) // 4),
    )


_SLOW_THOUGHTS = (
    "Entering the first character now and the rest after it keeps each change easy to check.",
    "I will start the text with its first letter and continue from there.",
    "Typing the beginning first lets me see the field respond before the rest.",
)


def suboptimal_path(view: StepView, rng: random.Random) -> Draft | None:
    """Type one character where the whole text could be entered at once (the expert's own
    wording and calls, with the text cut to its first character)."""
    for i, call in enumerate(view.calls):
        text = call.get("text")
        if call.get("action") == "type" and isinstance(text, str) and len(text.strip()) >= 2:
            first = text.strip()[0]
            # The calls after the text (an Enter that submits) would act on the cut text: a
            # different error. The micro-step ends with its one character.
            calls = copy.deepcopy(list(view.calls[: i + 1]))
            calls[i]["text"] = first
            intent = view.intent.strip()
            intent = intent.replace(text.strip(), first) if text.strip() in intent else ""
            intent = re.sub(r"\s+and press .*$", "", intent, flags=re.IGNORECASE)
            if not intent:
                intent = f"Type {first}"
            thought = _pick(rng, _SLOW_THOUGHTS)
            note = f"typed only {first!r} where the whole text could go in at once"
            return intent, calls, thought, note
    return None


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
