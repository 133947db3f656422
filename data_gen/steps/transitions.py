"""Stage 2: state transitions, conditioned on the real after-screenshot.

Unit: one executed step. The annotator sees the before and after screenshots and describes, in
future tense and structural terms, what the step changed. Steps whose two screenshots are
identical are kept and labelled ``no_change`` (silent failures and waits are real data). A final
step that ends the episode gets the transition "the task ends" without an annotator call; a
final step that does not (a truncated trajectory) has no after-screenshot and is dropped.
"""

from __future__ import annotations

from typing import Any

from data_gen.annotator import AnnotatorRequest, Rejected
from data_gen.executor import StageStats
from data_gen.perturb.calls import primary_point
from data_gen.perturb.elements import target_at
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
    """Contract check of a transition answer (separate reasoning is passed on, never scanned)."""
    parsed = parse_next_state(text, reasoning)
    if isinstance(parsed, ContractError):
        return Rejected(parsed.reason, parsed.message)
    return parsed


def target_oracle(ctx: Context, screenshot: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """What the marker points at, from the element boxes (offline annotator ground truth)."""
    hit = primary_point(calls)
    out: dict[str, Any] = {"has_point": hit is not None}
    if hit is not None:
        el = target_at(ctx.elements.get(screenshot), *hit[1]["coordinate"])
        if el is not None:
            out.update(target_label=el.label, target_role=el.role)
    return out


class TransitionsStep:
    """State-transition annotation of every executed step."""

    name = "transitions"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, items: list[Work], stats: StageStats) -> list[Work]:
        """Annotate all steps of the shard concurrently."""
        jobs = [self._one(w, k, stats) for w in items for k in range(len(w.trajectory.steps))]
        self.ctx.run_all(jobs)
        return items

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
            unit["transition"] = {
                "next_state": TERMINAL_STATE,
                "mechanism": None,
                "effect": None,
                "think": None,
                "no_change": True,
                "terminal": True,
                "request_hashes": [],
            }
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
            **target_oracle(self.ctx, before, calls),
        }
        request = AnnotatorRequest(self.name, list(messages), oracle)
        result = await self.ctx.annotate_or_drop(stats, sid, request, validate_transition)
        if not result.ok:
            return
        out = result.value
        unit["transition"] = {
            "next_state": out.next_state,
            "mechanism": out.mechanism,
            "effect": out.effect,
            "think": out.think,
            "no_change": no_change,
            "terminal": False,
            "prompt_version": messages.prompt_id,
            "request_hashes": result.request_hashes,
        }
        if no_change:
            stats.add("no_change")
        stats.kept()
