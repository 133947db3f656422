"""Stage 6: critic rationales for Good and Bad steps, with intent masking decided beforehand.

Unit: a critique sample (the Good sample of every step with a transition, and each Bad step the
judge accepted). Masking was decided by the corpus-wide plan before any annotation (so nothing is
annotated twice), hides only the ``Action:`` line (every tool call stays), and never applies to a
dimension whose diagnosis needs the intent. The annotator sees the marked screenshot and the true
outcome (the transition for Good, the dimension's consequence for Bad); its answer must carry the
expected verdict and dimension.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from data_gen.annotator import AnnotatorRequest, Rejected
from data_gen.executor import StageStats
from data_gen.flywheel import REAL_METHOD
from data_gen.perturb.calls import parse_calls
from data_gen.steps.transitions import target_oracle
from data_gen.steps.work import (
    RECORD_INVALID,
    Context,
    Work,
    calls_of,
    image,
    past_trajectory,
    render_or_reject,
    sample_id,
    step_marks,
    step_text,
)
from hivig.contracts import ContractError, CritiqueOutput, parse_critique, render_critique_target
from hivig.prompts import (
    build_critique_messages,
    build_rationale_bad_messages,
    build_rationale_good_messages,
    format_raw_step,
)
from hivig.records import Labels, RecordError, SFTRecord
from hivig.taxonomy import DIMENSIONS, Dimension, dimension_by_key, lookup_dimension

_UI_RULES_BY_KEY: dict[str, str] = {
    "grounding_spatial_error": "the point lands inside the clickable box of the element",
    "procedural_prerequisite_neglect": "the required earlier state (focus, a dismissed overlay) "
    "is in place first",
    "semantic_error": "the element's label and meaning match what the goal needs",
    "termination_misjudgment": "the episode ends exactly when the goal is met, with an answer "
    "where one is requested",
    "constraint_neglect": "every attribute the goal states is respected by the chosen element",
    "action_formulation_error": "the call is well-formed JSON with a valid action name and all "
    "required arguments",
    "observation_neglect": "elements already on screen are used directly",
    "suboptimal_path": "the direct, standard method performs the whole change at once",
    "parameter_vector_miscalibration": "the scroll, swipe or drag vector points the right way "
    "with enough magnitude",
    "visual_hallucination": "the element acted on is actually present on the current screen",
    "timing_and_latency_neglect": "the interface has finished loading before new input arrives",
    "action_operation_misalignment": "the coordinates hit the element that the stated intent names",
}

_CONSEQUENCES_BY_KEY = {
    "procedural_prerequisite_neglect": "The typed text has no focused field to go into, so "
    "nothing on the screen takes it in.",
    "observation_neglect": "The view moves away although what the step needs is already in "
    "sight on this screen.",
}

SAMPLE_CONSEQUENCES: dict[Dimension, str] = {
    dimension_by_key(key): text for key, text in _CONSEQUENCES_BY_KEY.items()
}
"""What the generated Bads of a dimension do, where the taxonomy's general consequence names
something these samples' screens do not show (a blocking overlay; a list that would scroll);
the offline explanations state this instead."""

UI_RULES: dict[Dimension, str] = {
    dimension_by_key(key): rule for key, rule in _UI_RULES_BY_KEY.items()
}
"""The interface rule each dimension breaks (offline explanations state it descriptively); keyed
by the taxonomy's dimensions (``dimension_by_key`` fails at import on a key it does not know)."""


_COORDINATES = re.compile(r"[\[(]\s*\d{1,4}\s*,\s*\d{1,4}\s*[\])]|\b[xy]\s*=\s*\d")
_DIMENSION_NAMES = re.compile(
    "|".join(re.escape(d.name) for d in sorted(DIMENSIONS, key=lambda d: -len(d.name))),
    re.IGNORECASE,
)
ECHO_MIN_CHARS = 12
"""Shorter intents ("Click OK") are too generic to count as an echo when they reappear."""


def echoes(text: str, hidden: str | None) -> bool:
    """Whether ``text`` quotes an intent that was masked from the sample's input."""
    if not hidden or len(hidden.strip()) < ECHO_MIN_CHARS:
        return False
    squash = " ".join(hidden.lower().rstrip(".").split())
    return squash in " ".join(text.lower().split())


FORBIDDEN_WORDS = re.compile(r"\b(reference|target|ideal|optimal|flawed|should have)\b", re.I)
"""Words the rationale prompts forbid (they betray a hidden answer key or prescribe a fix)."""

_DIGITS = re.compile(r"\d+")


def privileged_numbers(text: str, visible: str) -> list[str]:
    """Numbers ``text`` states that ``visible`` (what the critic is shown) does not contain.

    A critic's input is the goal, the trajectory, the proposed step and the screenshot; a
    number outside them (the expert's real scroll amount, an element box from the sidecar, a
    value only a later screen shows) is a fact the trained critic would learn to assert
    without seeing it.
    """
    seen = set(_DIGITS.findall(visible))
    return sorted({n for n in _DIGITS.findall(text) if n not in seen})


SIDECAR_TOKENS = re.compile(r"\b(?:button_disabled|listitem|menuitem)\b", re.IGNORECASE)
"""The element sidecar's role tokens that are no English word (``button_disabled``,
``listitem``): the sidecar's, which no screenshot shows."""

PROVENANCE = re.compile(
    r"\b(?:intent|step|call) (?:is|was) kept\b|\bexpert\b|\bperturb\w*|\bgenerator\b"
    r"|\binjected\b",
    re.IGNORECASE,
)
"""How a sample was made ("the intent is kept", "the expert", "perturbed"): facts of the data
generator, not of the screen; a critic trained on them would assert what it cannot see."""


@dataclass(frozen=True)
class ScreenFacts:
    """What a rationale may say about the critic's screenshot."""

    undrawn: tuple[str, ...] = ()
    """Element names the screenshot does not draw (a bare icon's name, a bar's label) and the
    critic's text does not give either."""
    marked: bool = True
    """Whether a marker is drawn on the screenshot."""
    visible: str = ""
    """The critic's input text: a phrase copied from it (a task about an "expert mode") is no
    fact of the generator's."""


def screen_facts(elements: Any, visible: str, marked: bool, later: Any = ()) -> ScreenFacts:
    """``ScreenFacts`` of a screenshot's elements, given the critic's visible text and the
    elements of the screen the step leads to (a rationale predicts what appears there: a name
    that screen draws is no undrawn name)."""
    drawn = {e.shown for e in later}
    undrawn = {e.label for e in elements if e.text is not None and e.label.strip()} - drawn
    undrawn_names = tuple(sorted(x for x in undrawn if x not in visible))
    return ScreenFacts(undrawn_names, marked, visible.lower())


def unseen_problem(text: str, facts: ScreenFacts) -> Rejected | None:
    """A fact ``text`` states that the critic's input does not show (see ``ScreenFacts``)."""
    for name in facts.undrawn:
        if re.search(rf"['\"]{re.escape(name)}['\"]", text):
            return Rejected(UNDRAWN_LABEL, f"the rationale quotes {name!r}, which is not drawn")
    token = _unseen_match(SIDECAR_TOKENS, text, facts)
    if token is not None:
        return Rejected("sidecar_token", f"the rationale uses the role token {token!r}")
    found = _unseen_match(PROVENANCE, text, facts)
    if found is not None:
        return Rejected("provenance_phrase", f"the rationale says {found!r}")
    if not facts.marked and _MARKER_CLAIM.search(text):
        return Rejected(
            "marker_not_drawn", "the rationale places something at a marker none is drawn"
        )
    return None


_MARKER_CLAIM = re.compile(
    r"\b(?:under|below|beneath|at|on|beside|near|by) the (?:red )?marker\b"
    r"|\bthe (?:red )?marker (?:sits|lies|points|is on|is placed|marks)\b",
    re.IGNORECASE,
)
"""A rationale placing something at a marker (not one saying that none is drawn)."""


def _unseen_match(pattern: re.Pattern[str], text: str, facts: ScreenFacts) -> str | None:
    """The first match of ``pattern`` in ``text`` that the critic's input does not hold."""
    for m in pattern.finditer(text):
        if m.group().lower() not in facts.visible:
            return m.group()
    return None


UNDRAWN_LABEL = "undrawn_label"
"""Reason of a rationale that names an element by a label its screenshot does not draw."""


def rationale_problem(
    parsed: CritiqueOutput,
    hidden_intent: str | None,
    visible: str | None = None,
    facts: ScreenFacts | None = None,
) -> Rejected | None:
    """The checks every annotator's rationale must pass (retried, then dropped with a reason).

    The explanation is what the policy reads, so it gives no coordinates (describe, do
    not dictate) and names no dimension (the verdict line does that); and no part of the
    target may quote an intent that the sample's input masked (the critic would learn to
    answer from what it was not shown). The reasoning (a Thinking model's separate
    reasoning included: it becomes the training ``<think>``) passes the same word and fact
    checks as the explanation: no forbidden word, and, given ``visible`` (the critic's input
    text and the labels its screenshot shows), no number the critic cannot see.
    """
    whole = f"{parsed.think or ''}\n{parsed.explanation}"
    word = FORBIDDEN_WORDS.search(whole)
    if word is not None:
        return Rejected("forbidden_word", f"the rationale uses {word.group()!r}")
    if visible is not None:
        extra = privileged_numbers(whole, visible)
        if extra:
            return Rejected(
                PRIVILEGED_FACT, f"the rationale states {extra[:3]}, absent from the input"
            )
    if _COORDINATES.search(parsed.explanation):
        return Rejected("explanation_coordinates", "the explanation gives coordinates")
    found = _DIMENSION_NAMES.search(parsed.explanation)
    if found is not None:
        return Rejected("explanation_dimension", f"the explanation names {found.group()!r}")
    if echoes(whole, hidden_intent):
        return Rejected("echoes_masked_intent", "the rationale quotes the masked intent")
    return None if facts is None else unseen_problem(whole, facts)


PRIVILEGED_FACT = "privileged_fact"
"""Reason of a rationale stating a number the critic's input does not show."""


def critique_validator(
    verdict: str,
    dimension: str | None,
    hidden_intent: str | None = None,
    visible: str | None = None,
    facts: ScreenFacts | None = None,
) -> Callable[[str, str | None], tuple[CritiqueOutput, str] | Rejected]:
    """Validator requiring the known verdict (and dimension), reasoning, and a renderable target.

    The answer becomes a training target, so reasoning is required (``missing_think``) and the
    target must render (``unrenderable_target``); both are retried like any contract failure,
    and so are the ``rationale_problem`` checks (``hidden_intent``: the masked intent, if any).
    """

    def validate(text: str, reasoning: str | None) -> tuple[CritiqueOutput, str] | Rejected:
        parsed = parse_critique(text, reasoning, require_think=True)
        if isinstance(parsed, ContractError):
            return Rejected(parsed.reason, parsed.message)
        if parsed.verdict != verdict:
            return Rejected("wrong_verdict", f"expected {verdict}, got {parsed.verdict}")
        got = None if parsed.dimension is None else parsed.dimension.name
        if got != dimension:
            return Rejected("wrong_dimension", f"expected {dimension}, got {got}")
        problem = rationale_problem(parsed, hidden_intent, visible, facts)
        if problem is not None:
            return problem
        target = render_or_reject(
            render_critique_target, parsed.think or "", verdict, dimension, parsed.explanation
        )
        if isinstance(target, Rejected):
            return target
        return parsed, target

    return validate


def critic_visible_text(user_text: str, elements: Any) -> str:
    """What the critic can read: its input text plus the texts drawn on its screenshot."""
    return user_text + "\n" + "\n".join(e.shown for e in elements)


class RationaleStep:
    """Good and Bad rationales, producing the critique samples."""

    name = "rationale"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, items: list[Work], stats: StageStats) -> list[Work]:
        """Annotate every critique sample of the shard."""
        self.ctx.run_all([self.step(w, k, stats) for w in items for k in range(len(w.units))])
        return items

    async def step(self, work: Work, k: int, stats: StageStats) -> None:
        """The Good and Bad critique samples of step ``k`` (``unit.critique``, by id)."""
        unit = work.units[k]
        if work.failed_run:
            # Only the real Bad at the root cause; its steps before are history only.
            if unit.bad is None:
                return
        elif unit.transition is None:
            return
        critique: list[SFTRecord] = []
        unit.critique = critique
        jobs = [] if work.failed_run else [self._good(work, k, stats)]
        if unit.bad is not None and unit.judge is not None and unit.judge.accepted:
            jobs.append(self._bad(work, k, stats))
        await asyncio.gather(*jobs)
        critique.sort(key=lambda s: s.id)

    async def _good(self, work: Work, k: int, stats: StageStats) -> None:
        ctx, traj = self.ctx, work.trajectory
        unit = work.units[k]
        sid = sample_id(traj.id, k)
        stats.seen()
        plan = ctx.plan.get(sid)
        if plan is not None and plan.repeat_of is not None:
            stats.drop(f"{sid}:good", "repeated_step", f"same step as {plan.repeat_of}")
            return
        if plan is None or not plan.critique:
            stats.drop(f"{sid}:good", "platform_balance", traj.platform)
            return
        if not plan.good:
            stats.drop(f"{sid}:good", "good_bad_ratio", "beyond perturb.good_bad_ratio")
            return
        if unit.judge is not None and unit.judge.vetoes_good:
            stats.drop(f"{sid}:good", "judge_vetoed", "the judge preferred the perturbed step")
            return
        calls = calls_of(traj, k)
        text = step_text(traj, k, mask_intent=plan.good_masked)
        shot = image(
            traj,
            traj.steps[k].screenshot,
            step_marks(traj, k, step_text(traj, k, True), self.ctx.drag_arrows),
        )
        tr = unit.transition
        assert tr is not None  # step() writes samples only for steps with a transition
        history = past_trajectory(traj, k)
        args = (traj.task, traj.platform, history, shot, text)
        messages = build_rationale_good_messages(
            *args, tr.mechanism or "None", tr.effect or "None", tr.next_state
        )
        oracle = {
            "task": traj.task,
            "calls_text": step_text(traj, k, mask_intent=True),
            "intent": None if plan.good_masked else traj.steps[k].intent,
            "next_state": tr.next_state,
            "marked": bool(shot.marks),
            **target_oracle(ctx, traj.steps[k].screenshot, calls),
        }
        await self._annotate(
            work,
            k,
            f"{sid}:good",
            "rationale_good",
            messages,
            oracle,
            args,
            ("Good", None, plan.good_masked, None),
            stats,
            traj.steps[k].intent if plan.good_masked else None,
        )

    async def _bad(self, work: Work, k: int, stats: StageStats) -> None:
        ctx, traj = self.ctx, work.trajectory
        unit = work.units[k]
        sid = sample_id(traj.id, k)
        stats.seen()
        plan = ctx.plan.get(sid)  # a real Bad has no plan entry: never masked
        bad = unit.bad
        assert bad is not None  # step() asks for a Bad sample only where there is a Bad step
        dim = lookup_dimension(bad.dimension)
        assert dim is not None
        # The plan never masks an intent-dependent dimension; checked again here on purpose.
        masked = plan is not None and plan.bad_masked and dim.maskable
        text = format_raw_step(bad.intent, bad.text, masked)
        shot = image(traj, traj.steps[k].screenshot, step_marks(traj, k, bad.text, ctx.drag_arrows))
        args = (traj.task, traj.platform, past_trajectory(traj, k), shot, text)
        if bad.method == REAL_METHOD:
            # The executed step is the Bad one: no correct step ran, so the hidden reference is
            # diagnose's correction and there is no correct transition to describe.
            reference, mechanism, effect = bad.extra.get("correction") or "", None, None
        else:
            tr = unit.transition
            assert tr is not None  # a planned Bad follows its step's transition
            reference, mechanism, effect = traj.steps[k].intent, tr.mechanism, tr.effect
        messages = build_rationale_bad_messages(
            *args, dim, reference or "", mechanism or "None", effect or "None"
        )
        parsed = parse_calls(bad.text)
        oracle = {
            "task": traj.task,
            "calls_text": bad.text,
            "syntax_valid": not isinstance(parsed, Exception),
            "intent": None if masked else bad.intent,
            "dimension": dim.name,
            "consequence": SAMPLE_CONSEQUENCES.get(dim, dim.consequence),
            "note": bad.note,
            "rule": UI_RULES[dim],
            "marked": bool(shot.marks),
            **target_oracle(
                ctx, traj.steps[k].screenshot, [] if isinstance(parsed, Exception) else parsed
            ),
        }
        await self._annotate(
            work,
            k,
            f"{sid}:bad",
            "rationale_bad",
            messages,
            oracle,
            args,
            ("Bad", dim.name, masked, bad.generator),
            stats,
            bad.intent if masked else None,
        )

    async def _annotate(
        self,
        work: Work,
        k: int,
        sid: str,
        stage: str,
        messages: Any,
        oracle: dict[str, Any],
        critic_args: tuple[Any, ...],
        label: tuple[str, str | None, bool, str | None],
        stats: StageStats,
        hidden_intent: str | None = None,
    ) -> None:
        ctx = self.ctx
        verdict, dimension, masked, generator = label
        request = AnnotatorRequest(stage, list(messages), oracle)
        critic = build_critique_messages(*critic_args, profile=ctx.critic_profile)
        steps = work.trajectory.steps
        elements = ctx.elements.get(steps[k].screenshot)
        later = ctx.elements.get(steps[k + 1].screenshot) if k + 1 < len(steps) else ()
        visible = critic_visible_text(critic[1].text(), elements)
        facts = screen_facts(elements, visible, bool(critic_args[3].marks), later)
        validate = critique_validator(verdict, dimension, hidden_intent, visible, facts)
        result = await ctx.annotate_or_drop(stats, sid, request, validate)
        if not result.ok:
            return
        _, target = result.value
        hashes = list(result.request_hashes)
        unit = work.units[k]
        if verdict == "Bad" and unit.bad is not None:
            hashes = list(unit.bad.extra.get("request_hashes", [])) + hashes
        try:
            sample = ctx.sample(
                work,
                k,
                critic,
                target,
                id=sid,
                labels=Labels(verdict, dimension, masked, generator),  # type: ignore[arg-type]
                hashes=hashes,
            )
        except RecordError as e:
            stats.drop(sid, RECORD_INVALID, str(e))
            return
        assert unit.critique is not None  # step() set it before asking for samples
        unit.critique.append(sample)
        if masked:
            stats.add("intent_masked")
        stats.kept()
