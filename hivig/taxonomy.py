"""The 12 error dimensions of the critic: the single source of truth.

Prompts, perturbation generators, output parsers, data reports and evaluation all read the
dimensions from here. Names are the exact strings of the HiViG taxonomy; ``DIMENSIONS`` keeps the
order in which the critic's system prompt lists them.

Masking decision (intent masking hides the ``Action:`` line of the proposed step):

- Action-Operation Misalignment is never masked: it *is* a contradiction between the intent and
  the tool call, so without the intent the label cannot be derived from the input.
- Visual Hallucination is not masked either: the error is acting on an element that is not on
  screen, and only the intent names that element. Without it a click on a ghost element reads
  like an ordinary dead click, so the label would be a guess the critic cannot ground.
- Grounding/Spatial Error stays maskable: the near miss (the marker just outside a visible element,
  in dead space) is what the marked screenshot shows, and judging it without the intent is exactly
  the visual grounding that masking is meant to train.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Group = Literal["visual_spatial", "cognitive"]
Generator = Literal["programmatic", "annotator"]

_BOTH: tuple[Generator, ...] = ("programmatic", "annotator")
_ANNOTATOR: tuple[Generator, ...] = ("annotator",)


@dataclass(frozen=True)
class Dimension:
    """One error dimension of the taxonomy.

    Attributes:
        name: Exact name as the critic writes it after ``Error Dimension:``.
        key: Stable snake_case identifier for configs, reports and file names.
        group: ``visual_spatial`` (perception/grounding) or ``cognitive`` (reasoning/execution).
        definition: The definition shown to annotators (perturbation, judge, rationales), with
            the exclusion clauses that separate it from its neighbours.
        brief: The one-sentence definition the critic's system prompt lists (every training
            sample and every served request carries it, so it stays short).
        consequence: What executing such an action does; Bad rationales must predict this.
        requires_intent: The error is only observable when the verbal intent is shown.
        maskable: Samples of this dimension may have their intent masked.
        generators: Generator families able to produce negatives of this dimension.
        cuadebug_family: The CUADebug L2 code this dimension maps to (for root-cause diagnosis).
    """

    name: str
    key: str
    group: Group
    definition: str
    brief: str
    consequence: str
    requires_intent: bool
    maskable: bool
    generators: tuple[Generator, ...]
    cuadebug_family: str


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension(
        name="Grounding/Spatial Error",
        key="grounding_spatial_error",
        group="visual_spatial",
        definition=(
            "The intent names the right element but the point misses it: it lands just outside "
            "the element, in dead space or on a neighbouring element. Where the marker lies "
            "decides it, not a fixed offset: a point inside the element's box is no grounding "
            "error, and a point far from any plausible target is Visual Hallucination rather "
            "than a near miss."
        ),
        brief=(
            "The intent is right but the coordinates are imprecise: the action lands just "
            "outside the intended element, in dead space or on a neighbouring element."
        ),
        consequence=(
            "Nothing happens because the point hits dead space, or the adjacent element fires "
            "instead of the intended one."
        ),
        requires_intent=False,
        maskable=True,
        generators=_BOTH,
        cuadebug_family="G1",
    ),
    Dimension(
        name="Procedural Prerequisite Neglect",
        key="procedural_prerequisite_neglect",
        group="cognitive",
        definition=(
            "A state change the action depends on is skipped: typing before the text field has "
            "focus, or acting behind a dialog, menu or overlay that still covers the target. "
            "The unmet prerequisite is visible on the current screen; a step whose own click "
            "gives the focus neglects nothing, and acting while the interface is still loading "
            "is Timing and Latency Neglect."
        ),
        brief=(
            "A required earlier state change is skipped: typing before the field has focus, or "
            "acting behind an overlay or dialog that has to be dismissed first."
        ),
        consequence=(
            "The input fails silently, lands on the blocking overlay, or acts on a state that is "
            "not ready yet."
        ),
        requires_intent=False,
        maskable=True,
        generators=_BOTH,
        cuadebug_family="G3",
    ),
    Dimension(
        name="Semantic Error",
        key="semantic_error",
        group="cognitive",
        definition=(
            "A real, clickable element is hit precisely but its meaning is misread: a label, "
            "icon or interface convention is taken for something it is not (Sign Up taken for "
            "Log In, a read-only counter for a control, an advert for content). Picking a "
            "sibling of the right kind that breaks an attribute the goal states is Constraint "
            "Neglect instead."
        ),
        brief=(
            "A real element is hit precisely but its meaning is misread: a label, icon or UI "
            "convention is confused (for example Sign Up taken for Log In, or a deceptive ad)."
        ),
        consequence=(
            "The wrong action succeeds and the interface moves away from what the goal needs."
        ),
        requires_intent=False,
        maskable=True,
        generators=_ANNOTATOR,
        cuadebug_family="P5",
    ),
    Dimension(
        name="Termination Misjudgment",
        key="termination_misjudgment",
        group="cognitive",
        definition=(
            "Completion is misjudged: the task is terminated while the goal is still unmet, "
            "terminated with a bare terminate where the requested information had to be "
            "reported with answer, or redundant actions follow a goal that is already met. "
            "Ending right after the goal is reached, or after the requested answer was given, "
            "is correct."
        ),
        brief=(
            "Completion is misjudged: the task is terminated before it is done, terminated "
            "where the requested information had to be reported with answer, or redundant "
            "actions follow a goal that is already met."
        ),
        consequence=(
            "The episode stops with the task unfinished, or an extra action disturbs a state that "
            "was already complete."
        ),
        requires_intent=False,
        maskable=True,
        generators=_BOTH,
        cuadebug_family="R10",
    ),
    Dimension(
        name="Constraint Neglect",
        key="constraint_neglect",
        group="cognitive",
        definition=(
            "The goal states an attribute or position explicitly (a name, a time, a value, an "
            "order, a place) and the step ignores it: it takes a visible, plausible element of "
            "the right kind that lacks that attribute (another file, the wrong alarm, 1.25x "
            "where 1.5x was asked). An attribute the goal does not state is not Constraint "
            "Neglect, and a different command or control altogether is Semantic Error."
        ),
        brief=(
            "An attribute or position stated explicitly in the goal is ignored; the chosen "
            "target is visible and plausible but violates that stated constraint."
        ),
        consequence=(
            "The interface reaches a state that looks partly right but breaks the requested "
            "attribute or position."
        ),
        requires_intent=False,
        maskable=True,
        generators=_ANNOTATOR,
        cuadebug_family="R1",
    ),
    Dimension(
        name="Action Formulation Error",
        key="action_formulation_error",
        group="cognitive",
        definition=(
            "The intent is right but the tool call cannot be executed as written: broken JSON "
            "(a missing brace or quote, a trailing comma), a required argument missing, an "
            "action name or enum value outside the action space, or arguments merged into one. "
            "A well-formed call with wrong values belongs to another dimension."
        ),
        brief=(
            "The intent is right but the tool call is invalid: broken JSON, a missing required "
            "argument, an invalid enum value or merged arguments."
        ),
        consequence="The call is rejected by the action parser and the interface does not change.",
        requires_intent=False,
        maskable=True,
        generators=_BOTH,
        cuadebug_family="R6",
    ),
    Dimension(
        name="Observation Neglect",
        key="observation_neglect",
        group="visual_spatial",
        definition=(
            "The agent searches, scrolls or opens menus for something the current screen "
            "already shows clearly. The target is visible before the step and the search moves "
            "the view away from it; scrolling towards content that really is off screen is not "
            "Observation Neglect."
        ),
        brief=(
            "The agent searches, scrolls or opens menus for something that is already visible "
            "on the current screen."
        ),
        consequence=(
            "The view changes for no reason and may push the already visible element out of sight."
        ),
        requires_intent=False,
        maskable=True,
        generators=_ANNOTATOR,
        cuadebug_family="P4",
    ),
    Dimension(
        name="Suboptimal Path",
        key="suboptimal_path",
        group="cognitive",
        definition=(
            "The step heads the right way but by slow micro-steps (one character, one arrow or "
            "backspace press at a time) where a standard, faster method does the whole change "
            "at once, such as typing the full text or a bulk delete. Only the method is "
            "inefficient; a step in the wrong direction is another dimension."
        ),
        brief=(
            "Slow micro-steps such as repeated arrow or backspace presses are used where a "
            "standard, faster method exists, such as direct text entry or a bulk delete."
        ),
        consequence="Only a tiny local change happens where one global change was available.",
        requires_intent=False,
        maskable=True,
        generators=_ANNOTATOR,
        cuadebug_family="R4",
    ),
    Dimension(
        name="Parameter Vector Miscalibration",
        key="parameter_vector_miscalibration",
        group="visual_spatial",
        definition=(
            "The interaction type is right (scroll, hscroll, swipe or drag) but its vector is "
            "wrong: the direction or sign is reversed, the start and end points are swapped, or "
            "the magnitude is far too small to move anything noticeably. A vector against a "
            "direction the intent states in words is Action-Operation Misalignment."
        ),
        brief=(
            "The interaction type is right (scroll, hscroll, swipe or drag) but its vector is "
            "wrong: the direction or sign is reversed, the start and end points are swapped, or "
            "the magnitude is far too small to matter."
        ),
        consequence="The content moves the opposite way or by an imperceptible amount.",
        requires_intent=False,
        maskable=True,
        generators=_BOTH,
        cuadebug_family="R7",
    ),
    Dimension(
        name="Visual Hallucination",
        key="visual_hallucination",
        group="visual_spatial",
        definition=(
            "The action targets an element that is not on the current screen: a ghost from an "
            "earlier state that is gone, an element that only appears after a step the agent "
            "skipped, or a position guessed from layout habits instead of what is visible. The "
            "named element is absent from this screenshot; a near miss of an element that is "
            "visible is Grounding/Spatial Error."
        ),
        brief=(
            "The action targets an element that is not on the current screen: a ghost from an "
            "earlier state or a position guessed from layout habits instead of what is visible."
        ),
        consequence="The point hits nothing that matches and the action fails silently.",
        requires_intent=False,
        maskable=False,
        generators=_BOTH,
        cuadebug_family="P1",
    ),
    Dimension(
        name="Timing and Latency Neglect",
        key="timing_and_latency_neglect",
        group="cognitive",
        definition=(
            "The agent acts while the interface is visibly busy or changing: spinners, progress "
            "bars, loading messages, opening animations or buttons that are still disabled. The "
            "busy state is on the current screen; acting on an element that is not shown at all "
            "is Visual Hallucination."
        ),
        brief=(
            "The agent acts while the interface is busy or changing: spinners, progress bars, "
            "opening animations or buttons that are still disabled."
        ),
        consequence="The input is ignored or dropped because the interface is not ready for it.",
        requires_intent=False,
        maskable=True,
        generators=_BOTH,
        cuadebug_family="S2",
    ),
    Dimension(
        name="Action-Operation Misalignment",
        key="action_operation_misalignment",
        group="visual_spatial",
        definition=(
            "The stated intent and the emitted tool call disagree: the intent names one element "
            "or action while the call does another (its coordinates point at a different "
            "element, or its action type or direction differs from the words). The intent may "
            "be sensible; the contradiction between words and call is the error."
        ),
        brief=(
            "The stated intent and the emitted tool call disagree: the intent names one element "
            "while the coordinates point at another."
        ),
        consequence=(
            "An unexpected transition happens that matches neither the intent nor the goal."
        ),
        requires_intent=True,
        maskable=False,
        generators=_BOTH,
        cuadebug_family="R5",
    ),
)

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> str:
    # Case, markdown emphasis, slashes, hyphens and other punctuation carry no meaning in a
    # dimension name; the sequence of words does. "&" reads as "and".
    return " ".join(_WORD.findall(text.lower().replace("&", " and ")))


_BY_WORDS: dict[str, Dimension] = {}
for _dim in DIMENSIONS:
    _BY_WORDS[_words(_dim.name)] = _dim
    _BY_WORDS[_words(_dim.key.replace("_", " "))] = _dim


def lookup_dimension(text: str) -> Dimension | None:
    """Resolve a dimension name as a model or annotator wrote it.

    Tolerant of case, markdown emphasis, quotes, punctuation, separators and whitespace
    (``**grounding / spatial error**``, ``Action Operation Misalignment.``, the snake_case key);
    strict about the words themselves: a near miss such as ``Grounding Error`` or a name outside
    the taxonomy (``Memory & State Tracking Error``) gives ``None``, never a guess.

    Args:
        text: The candidate name.

    Returns:
        The matching dimension, or ``None``.
    """
    if not isinstance(text, str):
        return None
    return _BY_WORDS.get(_words(text))


def dimension_by_key(key: str) -> Dimension:
    """Return the dimension with this snake_case key.

    Args:
        key: A ``Dimension.key`` such as ``visual_hallucination`` (exact, case-sensitive; use
            ``lookup_dimension`` for free text).

    Returns:
        The dimension.

    Raises:
        KeyError: No dimension has this key.
    """
    for dim in DIMENSIONS:
        if dim.key == key:
            return dim
    raise KeyError(f"unknown dimension key {key!r}; known: {[d.key for d in DIMENSIONS]}")
