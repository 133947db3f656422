"""Stage 2: state transitions, conditioned on the real after-screenshot.

Unit: one executed step. The annotator sees the before and after screenshots and describes, in
future tense and structural terms, what the step changed. Steps whose two screenshots are
identical are kept and labelled ``no_change`` (silent failures and waits are real data). A final
step that ends the episode gets the transition "the task ends" without an annotator call; a
final step that does not (a truncated trajectory) has no after-screenshot and is dropped.
"""

from __future__ import annotations

import re
from typing import Any

from data_gen.annotator import AnnotatorRequest, Rejected
from data_gen.executor import StageStats
from data_gen.perturb import StepPlan
from data_gen.perturb.calls import primary_point
from data_gen.perturb.elements import target_at
from data_gen.step_unit import Transition
from data_gen.steps.work import (
    Context,
    Work,
    calls_of,
    image,
    is_terminal,
    sample_id,
    step_text,
)
from hivig.contracts import ContractError, TransitionOutput, parse_next_state
from hivig.prompts import build_transition_messages

TERMINAL_STATE = "The task will end here and the screen will keep its current layout."


def validate_transition(text: str, reasoning: str | None) -> TransitionOutput | Rejected:
    """Contract check of a transition answer.

    Both labelled parts must be there: the mechanism and the effect become hidden context of
    the rationale prompts, and a missing one would silently read "None" there. A missing label
    is retried like any contract failure, then the step is dropped (quarantined) with its
    reason.
    """
    parsed = parse_next_state(text, reasoning)
    if isinstance(parsed, ContractError):
        return Rejected(parsed.reason, parsed.message)
    missing = [
        name
        for name, part in (
            ("[Action Mechanism]", parsed.mechanism),
            ("[Structural Effect]", parsed.effect),
        )
        if not (part or "").strip()
    ]
    if missing:
        return Rejected(MISSING_LABELS, f"the reasoning lacks {' and '.join(missing)}")
    return parsed


MISSING_LABELS = "missing_transition_labels"
"""Reason of a transition answer without its ``[Action Mechanism]`` / ``[Structural Effect]``."""


def target_oracle(ctx: Context, screenshot: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """What the marker points at, from the element boxes (offline annotator ground truth)."""
    hit = primary_point(calls)
    out: dict[str, Any] = {"has_point": hit is not None}
    if hit is not None:
        el = target_at(ctx.elements.get(screenshot), *hit[1]["coordinate"])
        if el is not None:
            out.update(target=el.described())
    return out


_UNDESCRIBED = frozenset({"clock", "status", "titlebar", "addressbar", "document", "list"})
"""Roles whose change says nothing about the step (the clock ticks every step)."""


def screen_change(before: Any, after: Any) -> dict[str, list[list[str]]]:
    """Elements that appear and disappear between two screens, as ``[label, role]`` pairs.

    The offline annotator describes the real next state from these (a dialog opens, a menu's
    entries appear, a loading bar goes away). Labels with digits that the first screen does
    not show are left out: a number only the next screen shows is not for a prediction.
    """

    # By the text each screen draws: a bare icon or a bar is named by its kind alone.
    def described(elements: Any) -> dict[str, str]:
        return {e.shown: e.role for e in elements if e.shown.strip() and e.role not in _UNDESCRIBED}

    old, new = described(before), described(after)
    shown = set(re.findall(r"\d+", " ".join(e.shown for e in before)))
    appeared = [[label, role] for label, role in new.items() if label not in old]
    vanished = [[label, role] for label, role in old.items() if label not in new]
    return {"appeared": _structural(appeared, shown), "vanished": _structural(vanished, shown)}


CONTENT_ROLES = frozenset({"file", "link", "listitem", "contact", "alarm", "folder"})
"""Roles whose labels are content (names, values): a transition names them by kind only."""


def _structural(pairs: list[list[str]], shown: set[str]) -> list[list[str]]:
    """Controls by label, content by kind ("file entries"), nothing with an unseen number."""
    out: list[list[str]] = []
    kinds: list[str] = []
    for label, role in pairs:
        if role in CONTENT_ROLES:
            if role not in kinds:
                kinds.append(role)
        elif set(re.findall(r"\d+", label)) <= shown:
            out.append([label, role])
    out = out[:3] + [["", role] for role in kinds[:2]]
    return out


def unplanned_reason(plan: dict[str, StepPlan], work: Work, k: int) -> str | None:
    """Why step ``k`` has no planned sample that reads its transition, or ``None``.

    A planned Bad reads it, and so does a Good the plan keeps. The reasons: ``repeated_step``
    (an instruction variant's step on the same screen), ``platform_balance`` (no critique
    sample planned for the step), ``good_bad_ratio`` (a Good beyond
    ``perturb.good_bad_ratio``), ``no_sample`` (a final step that does not end the episode).
    """
    step = plan.get(sample_id(work.id, k))
    if step is not None and step.repeat_of is not None:
        return "repeated_step"
    if step is None:
        return "no_sample"  # a final step that does not end the episode: nothing to judge
    if not step.critique:
        return "platform_balance"
    return None if step.dimension is not None or step.good else "good_bad_ratio"


class TransitionsStep:
    """State-transition annotation of every executed step."""

    name = "transitions"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, items: list[Work], stats: StageStats) -> list[Work]:
        """Annotate all steps of the shard concurrently."""
        self.ctx.run_all([self.step(w, k, stats) for w in items for k in range(len(w.units))])
        return items

    async def step(self, work: Work, k: int, stats: StageStats) -> None:
        """The transition of step ``k``, where a planned sample needs it."""
        # A failed run's steps are only the history of its real Bad, which needs no transition.
        if work.failed_run:
            return
        unplanned = unplanned_reason(self.ctx.plan, work, k)
        if unplanned is not None:
            # Paying for it would buy nothing: the rationale prompts are its only reader.
            stats.add(f"skipped_{unplanned}")
            return
        await self._one(work, k, stats)

    async def _one(self, work: Work, k: int, stats: StageStats) -> None:
        traj = work.trajectory
        unit = work.units[k]
        sid = sample_id(traj.id, k)
        stats.seen()
        calls = calls_of(traj, k)
        if k + 1 >= len(traj.steps):
            if not is_terminal(calls):
                stats.drop(sid, "no_after_screenshot", "final step does not end the episode")
                return
            unit.transition = Transition(TERMINAL_STATE, no_change=True, terminal=True)
            stats.add("terminal")
            stats.kept()
            return
        before, after = traj.steps[k].screenshot, traj.steps[k + 1].screenshot
        digest = self.ctx.annotator.digest
        d0, d1 = await self.ctx.annotator.file_digests(before, after)
        if not digest.readable(before) or not digest.readable(after):
            missing = after if digest.readable(before) else before
            stats.drop(sid, "missing_image", f"cannot read {missing}")
            return
        no_change = d0 == d1
        messages = build_transition_messages(
            traj.task, traj.platform, image(traj, before), image(traj, after), step_text(traj, k)
        )
        oracle = {
            "no_change": no_change,
            "terminal": False,
            "calls": [str(c.get("action")) for c in calls],
            **screen_change(self.ctx.elements.get(before), self.ctx.elements.get(after)),
            **target_oracle(self.ctx, before, calls),
        }
        request = AnnotatorRequest(self.name, list(messages), oracle)
        result = await self.ctx.annotate_or_drop(stats, sid, request, validate_transition)
        if not result.ok:
            return
        out = result.value
        unit.transition = Transition(
            next_state=out.next_state,
            mechanism=out.mechanism,
            effect=out.effect,
            think=out.think,
            no_change=no_change,
            prompt_version=messages.prompt_id,
            request_hashes=tuple(result.request_hashes),
        )
        if no_change:
            stats.add("no_change")
        stats.kept()
