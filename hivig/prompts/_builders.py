"""Message builders for the critic tasks and the annotator stages.

Each builder fills one versioned template (``_template.py``) and returns ``PromptMessages``: a list
of ``ChatMessage`` (system, then user with screenshots first and per-step text last) that also
carries the id of the template it used, so every sample and response can record it.

Step texts come from ``format_step`` (``format_raw_step`` for calls given as text) and trajectories
from ``format_trajectory``; these are the only places the ``Action:`` line and the ``Step k:``
layout are written, for data_gen, train and serve.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hivig.actions import Action, action_space, render_tool_calls, space_for_platform
from hivig.messages import ChatMessage, ImageRef
from hivig.prompts._template import PromptError, PromptTemplate, load_prompt
from hivig.taxonomy import DIMENSIONS, Dimension

if TYPE_CHECKING:  # hivig.profiles reads templates through this package
    from hivig.profiles import Profile


class PromptMessages(list[ChatMessage]):
    """Chat messages built from one template; ``prompt_id`` names it (``critic_critique_v1``)."""

    def __init__(self, messages: Sequence[ChatMessage], prompt_id: str) -> None:
        """Wrap ``messages`` built from the template ``prompt_id``."""
        super().__init__(messages)
        self.prompt_id = prompt_id


# ---------------------------------------------------------------------------------------------
# Text fragments shared by all prompts


def format_step(
    intent: str | None, actions: Sequence[Action], space: str, mask_intent: bool = False
) -> str:
    """Render a proposed or executed step: ``Action: <intent>`` line, then its tool calls.

    Args:
        intent: The verbal intent (the ``Action:`` sentence); ``None`` or blank means none.
        actions: The step's calls, all of them kept, in order.
        space: ``computer_use`` or ``mobile_use``.
        mask_intent: Drop the ``Action:`` line (intent masking); the tool calls stay complete.

    Returns:
        The step text.

    Raises:
        PromptError: ``actions`` is empty (every step has at least one call).
    """
    if not actions:
        raise PromptError("a step needs at least one action")
    return format_raw_step(intent, render_tool_calls(list(actions), space), mask_intent)


def format_raw_step(intent: str | None, raw_tool_calls: str, mask_intent: bool = False) -> str:
    """Render a step whose tool calls are given as text: ``Action: <intent>`` line, then the calls.

    For steps whose calls cannot go through the action model, such as an Action Formulation
    Error (broken JSON, an unknown action name); ``format_step`` renders valid actions through
    this function, so both write the ``Action:`` line identically.

    Args:
        intent: The verbal intent (the ``Action:`` sentence); ``None`` or blank means none.
        raw_tool_calls: The ``<tool_call>`` blocks as text, kept verbatim.
        mask_intent: Drop the ``Action:`` line (intent masking); the tool calls stay complete.

    Returns:
        The step text.

    Raises:
        PromptError: ``raw_tool_calls`` is blank (every step has at least one call).
    """
    if not raw_tool_calls.strip():
        raise PromptError("a step needs at least one tool call")
    if mask_intent or intent is None or not intent.strip():
        return raw_tool_calls
    return f"Action: {' '.join(intent.split())}\n{raw_tool_calls}"


def format_intent_step(intent: str) -> str:
    """A proposed step stated in words only (the ``Action:`` line without tool calls).

    For the judge's other candidate against a real Bad: the correction a root-cause diagnosis
    proposes is a sentence, not a call.

    Args:
        intent: The step in words.

    Returns:
        ``Action: <intent>`` with its whitespace collapsed.
    """
    return f"Action: {' '.join(intent.split())}"


def format_trajectory(steps: Sequence[str]) -> str:
    """Number past step texts (``Step 1:`` ...) and separate them by blank lines.

    Args:
        steps: Step texts from ``format_step``, oldest first; past steps keep their intents.

    Returns:
        The trajectory text; empty at the first step.
    """
    return "\n\n".join(f"Step {k}:\n{text}" for k, text in enumerate(steps, start=1))


@functools.cache  # one string per platform, asked for by every prompt
def action_space_text(platform: str) -> str:
    """The platform's tool definition as JSON, shown inside ``<tools>`` in every system prompt.

    Args:
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.

    Returns:
        The ``computer_use`` or ``mobile_use`` tool definition as one line of UTF-8 JSON.

    Raises:
        ActionError: ``unknown_platform`` for a platform outside the five supported ones.
    """
    return json.dumps(action_space(space_for_platform(platform)), ensure_ascii=False)


def taxonomy_text(dimensions: Sequence[Dimension] = DIMENSIONS, *, brief: bool = False) -> str:
    """One ``- Name: definition`` line per dimension, in the given order.

    Args:
        dimensions: The dimensions to list; the training-prompt order by default.
        brief: The critic's one-sentence definitions (``Dimension.brief``) instead of the
            annotators' full ones with their exclusion clauses.

    Returns:
        The lines joined by newlines (no trailing newline).
    """
    return "\n".join(f"- {d.name}: {d.brief if brief else d.definition}" for d in dimensions)


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


def ascii_tool_calls(text: str) -> str:
    r"""``text`` with every non-ASCII character inside its ``<tool_call>`` blocks escaped.

    What ``json.dumps`` writes by default (``ensure_ascii``): ``é`` becomes ``\u00e9`` and a
    character outside the BMP a surrogate pair. Text outside the blocks (the ``Action:`` line)
    is left as it is. A profile trained on such calls (``render.tool_call_ascii``) reads them so.

    Args:
        text: A step or trajectory text.

    Returns:
        The text with its tool calls escaped.
    """
    return _TOOL_CALL_BLOCK.sub(_escaped_block, text)


def _escaped_block(block: re.Match[str]) -> str:
    return "".join(c if c < "\x80" else json.dumps(c)[1:-1] for c in block.group(0))


def first_tool_call(step_text: str) -> str:
    """A step text cut to its first ``<tool_call>`` block (unchanged without a complete one).

    How the released HiViG critic's intent-masked proposals were written: the first call only.

    Args:
        step_text: A proposed step's text without an ``Action:`` line.

    Returns:
        Its first ``<tool_call>`` block.
    """
    match = _TOOL_CALL_BLOCK.search(step_text)
    return match.group(0) if match else step_text


def _build(
    name: str,
    version: int | None,
    platform: str,
    template: PromptTemplate | None = None,
    profile: Profile | None = None,
    **values: str | ImageRef,
) -> PromptMessages:
    if profile is not None:
        # A profile is the whole interface: its template and its texts, never the package's.
        template = profile.templates[name]
        step = values.get("step")
        masked = isinstance(step, str) and not step.startswith("Action: ")
        if name == "critic_critique" and profile.render.masked_calls == "first" and masked:
            values["step"] = first_tool_call(str(step))
        if profile.render.tool_call_ascii:
            for key in ("step", "history"):
                if isinstance(values.get(key), str):
                    values[key] = ascii_tool_calls(str(values[key]))
        values["action_space"] = profile.action_space(space_for_platform(platform))
        if "taxonomy" in template.placeholders:
            values["taxonomy"] = profile.taxonomy
        return PromptMessages(template.render(**values), template.id)
    template = template or load_prompt(name, version)
    if "action_space" in template.placeholders:
        values["action_space"] = action_space_text(platform)
    return PromptMessages(template.render(**values), template.id)


# ---------------------------------------------------------------------------------------------
# Critic tasks (training and serving use exactly these)


def build_history_messages(
    task: str,
    platform: str,
    previous_summary: str,
    before: ImageRef,
    after: ImageRef,
    step_text: str,
    *,
    version: int | None = None,
    template: PromptTemplate | None = None,
    profile: Profile | None = None,
) -> PromptMessages:
    """Critic history task: update the rolling summary from one before/after pair.

    Args:
        task: The user's goal.
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.
        previous_summary: The summary written after the step before (or the initial sentence).
        before: Clean screenshot before the executed step.
        after: Clean screenshot after it.
        step_text: ``format_step`` of the executed step (intent + calls, or calls when masked).
        version: Template version; the latest by default.
        template: A template of the same name loaded from a prompt profile
            (``load_prompt_dir``); overrides ``version``.
        profile: A critic profile (``hivig.profiles``): its template, action-space text and
            taxonomy text; overrides ``version`` and ``template``.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    return _build(
        "critic_history",
        version,
        platform,
        template,
        profile,
        task=task,
        previous_summary=previous_summary,
        before=before,
        after=after,
        step=step_text,
    )


def build_critique_messages(
    task: str,
    platform: str,
    history: str,
    screenshot: ImageRef,
    step_text: str,
    *,
    version: int | None = None,
    template: PromptTemplate | None = None,
    profile: Profile | None = None,
) -> PromptMessages:
    """Critic critique task: judge one proposed step on the marked current screenshot.

    Args:
        task: The user's goal.
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.
        history: ``format_trajectory`` of the past steps, or the history summary; may be empty.
        screenshot: Current screenshot carrying the marks of the proposed step.
        step_text: ``format_step`` of the proposed step.
        version: Template version; the latest by default.
        template: A template of the same name loaded from a prompt profile
            (``load_prompt_dir``); overrides ``version``.
        profile: A critic profile (``hivig.profiles``): its template, action-space text and
            taxonomy text; overrides ``version`` and ``template``.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    return _build(
        "critic_critique",
        version,
        platform,
        template,
        profile,
        # The critic's prompt lists the brief definitions: it is in every sample and request.
        taxonomy=taxonomy_text(brief=True),
        task=task,
        history=history,
        screenshot=screenshot,
        step=step_text,
    )


# ---------------------------------------------------------------------------------------------
# Annotator stages


def build_transition_messages(
    task: str,
    platform: str,
    before: ImageRef,
    after: ImageRef,
    step_text: str,
    *,
    version: int | None = None,
) -> PromptMessages:
    """State-transition annotation: what the executed step changed (real after-screenshot).

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        before: Clean screenshot before the executed step.
        after: Clean screenshot after it (the real outcome the annotator describes).
        step_text: ``format_step`` of the executed step, with its intent.
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    return _build(
        "annotator_transition",
        version,
        platform,
        task=task,
        before=before,
        after=after,
        step=step_text,
    )


def build_grounding_messages(
    task: str, platform: str, screen: ImageRef, step_text: str, *, version: int | None = None
) -> PromptMessages:
    """Grounding annotation: the UI element under the executed step's point.

    Gives element boxes for data without an accessibility sidecar.

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        screen: The screenshot, marked at the step's point.
        step_text: ``format_step`` of the executed step.
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    return _build(
        "annotator_grounding", version, platform, task=task, screen=screen, step=step_text
    )


def build_history_annotation_messages(
    task: str,
    platform: str,
    previous_summary: str,
    before: ImageRef,
    after: ImageRef,
    step_text: str,
    *,
    version: int | None = None,
) -> PromptMessages:
    """Macro-history annotation: the annotator variant of the critic history prompt.

    The annotator variant spells out the literal-description and no-planning rules that the
    trained critic has learned from the data; inputs and output contract are identical.

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        previous_summary: The summary written after the step before (or the initial sentence).
        before: Clean screenshot before the executed step.
        after: Clean screenshot after it.
        step_text: ``format_step`` of the executed step.
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    return _build(
        "annotator_history",
        version,
        platform,
        task=task,
        previous_summary=previous_summary,
        before=before,
        after=after,
        step=step_text,
    )


def build_perturbation_messages(
    task: str,
    platform: str,
    history: str,
    screenshot: ImageRef,
    chosen_thought: str,
    chosen_step: str,
    candidates: Sequence[Dimension],
    *,
    version: int | None = None,
) -> PromptMessages:
    """Annotator perturbation: write one Bad step for one of the candidate dimensions.

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        history: ``format_trajectory`` of the past steps.
        screenshot: Clean current screenshot.
        chosen_thought: The ground-truth step's thought; blank becomes an explicit "none"
            (navigation files record no thought, and an empty line reads as a lost field).
        chosen_step: ``format_step`` of the ground-truth step (with intent).
        candidates: Dimensions the annotator may pick from, in the order shown.
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.

    Raises:
        PromptError: ``candidates`` is empty.
    """
    if not candidates:
        raise PromptError("perturbation needs at least one candidate dimension")
    return _build(
        "annotator_perturbation",
        version,
        platform,
        task=task,
        history=history,
        screenshot=screenshot,
        chosen_thought=chosen_thought.strip() or "none",
        chosen_step=chosen_step,
        candidates=taxonomy_text(candidates),
    )


def build_judge_messages(
    task: str,
    platform: str,
    history: str,
    screenshot: ImageRef,
    candidate_a: str,
    candidate_b: str,
    *,
    dimension_order: Sequence[Dimension] = DIMENSIONS,
    version: int | None = None,
) -> PromptMessages:
    """Double-blind judge: two candidate steps in the given A/B order.

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        history: ``format_trajectory`` of the past steps.
        screenshot: Clean current screenshot.
        candidate_a: Step text shown as candidate A.
        candidate_b: Step text shown as candidate B.
        dimension_order: Order of the listed dimensions (callers shuffle it per sample seed to
            avoid position bias); must contain all 12. The list sits in the user text, so the
            system prompt stays identical across requests and prefix caches keep hitting.
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.

    Raises:
        PromptError: ``dimension_order`` is not a permutation of the 12 dimensions.
    """
    if sorted(d.key for d in dimension_order) != sorted(d.key for d in DIMENSIONS):
        raise PromptError("dimension_order must list each of the 12 dimensions once")
    return _build(
        "annotator_judge",
        version,
        platform,
        taxonomy=taxonomy_text(dimension_order),
        task=task,
        history=history,
        screenshot=screenshot,
        candidate_a=candidate_a,
        candidate_b=candidate_b,
    )


def build_rationale_good_messages(
    task: str,
    platform: str,
    history: str,
    screenshot: ImageRef,
    step_text: str,
    mechanism: str,
    effect: str,
    next_state: str,
    *,
    version: int | None = None,
) -> PromptMessages:
    """Good rationale: the critic's reasoning for a step known to succeed.

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        history: ``format_trajectory`` of the past steps.
        screenshot: Current screenshot with the step's marks.
        step_text: ``format_step`` of the step (masked or not, as the sample will be).
        mechanism: The transition's action mechanism (hidden context).
        effect: The transition's structural effect (hidden context).
        next_state: The transition's next state (hidden context).
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    return _build(
        "annotator_rationale_good",
        version,
        platform,
        task=task,
        history=history,
        screenshot=screenshot,
        step=step_text,
        mechanism=mechanism,
        effect=effect,
        next_state=next_state,
    )


def build_rationale_bad_messages(
    task: str,
    platform: str,
    history: str,
    screenshot: ImageRef,
    step_text: str,
    dimension: Dimension,
    reference_intent: str,
    mechanism: str,
    effect: str,
    *,
    version: int | None = None,
) -> PromptMessages:
    """Bad rationale: the critic's reasoning for a step known to carry ``dimension``.

    Args:
        task: The user's goal.
        platform: The trajectory's platform.
        history: ``format_trajectory`` of the past steps.
        screenshot: Current screenshot with the Bad step's marks.
        step_text: ``format_step`` of the Bad step (masked or not, as the sample will be).
        dimension: The injected error dimension (its definition and consequence are shown).
        reference_intent: The ground-truth step's intent only (its words, never its tool
            call: the call's parameters would leak into the rationale as facts the critic
            cannot see); an explicit "none stated" where the step has none.
        mechanism: The ground-truth transition's action mechanism.
        effect: The ground-truth transition's structural effect.
        version: Template version; the latest by default.

    Returns:
        ``[system, user]`` messages tagged with their prompt id.
    """
    template = load_prompt("annotator_rationale_bad", version)
    # v1 named the slot for the whole correct step; v2 shows the intent only. Either way only
    # the words are passed.
    slot = "reference_intent" if "reference_intent" in template.placeholders else "correct_step"
    return _build(
        "annotator_rationale_bad",
        version,
        platform,
        template,
        task=task,
        history=history,
        screenshot=screenshot,
        step=step_text,
        dimension=dimension.name,
        definition=dimension.definition,
        consequence=dimension.consequence,
        mechanism=mechanism,
        effect=effect,
        **{slot: " ".join(reference_intent.split()) or "none stated"},
    )
