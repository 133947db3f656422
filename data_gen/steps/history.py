"""Stage 3: macro history, a rolling summary per trajectory.

Unit: one consecutive pair (step k, step k + 1). Inside a trajectory the pairs run in order,
because each summary is the next pair's input; trajectories run concurrently. When a pair fails
after its retries it is dropped with its reason and the chain goes on from the last good summary,
as the reference pipeline does: the next summary then also covers the failed step (its screens
are in that pair's input), and losing the rest of a trajectory to one bad answer would cost every
later sample; the pair that resumes a chain is counted as ``chain_resumed``. A failure that may
pass (an outage past ``annotator.outage_wait_s``) ends the chain instead, its later pairs dropped
as ``chain_broken`` unpaid: the stage is not committed then, and the rerun, with the failed
pair's answer, writes the chain as it should be.

The annotator writes with the annotator variant of the history prompt; the training sample uses
the critic prompt with the same inputs and the annotator's answer as its target.
"""

from __future__ import annotations

from data_gen.annotator import TRANSIENT_REASONS, AnnotatorRequest, Rejected
from data_gen.executor import StageStats, unit_float
from data_gen.steps.rationale import echoes
from data_gen.steps.work import (
    INITIAL_SUMMARY,
    RECORD_INVALID,
    Context,
    Work,
    image,
    render_or_reject,
    sample_id,
    step_text,
)
from hivig.contracts import ContractError, HistoryOutput, parse_history, render_history_target
from hivig.prompts import build_history_annotation_messages, build_history_messages
from hivig.records import Labels, RecordError
from hivig.trajectory import Trajectory

_TRANSIENT = object()
"""``_pair``'s answer for a pair dropped for a reason that may pass (see the module docstring)."""


def history_validator(hidden_intent: str | None):
    """``validate_history`` plus the masked-intent check: a history sample whose input hid the
    step's intent must not quote it in its target (any annotator, retried then dropped)."""

    def validate(text: str, reasoning: str | None) -> tuple[HistoryOutput, str] | Rejected:
        got = validate_history(text, reasoning)
        if isinstance(got, Rejected):
            return got
        out, target = got
        if echoes(target, hidden_intent):
            return Rejected("echoes_masked_intent", "the summary quotes the masked intent")
        return got

    return validate


def validate_history(text: str, reasoning: str | None) -> tuple[HistoryOutput, str] | Rejected:
    """Contract check and the training target rendered from the answer.

    The answer becomes a training target, so its reasoning is required (``missing_think``) and
    must render (``unrenderable_target``); both are retried like any contract failure.
    Reasoning delivered separately (``Generation.reasoning``) is passed on as is, never wrapped
    back into tags.
    """
    parsed = parse_history(text, reasoning, require_think=True)
    if isinstance(parsed, ContractError):
        return Rejected(parsed.reason, parsed.message)
    target = render_or_reject(
        render_history_target, parsed.think or "", parsed.progress, parsed.last_result
    )
    if isinstance(target, Rejected):
        return target
    return parsed, target


def action_names(traj: Trajectory, k: int) -> str:
    """The step's action names joined, for a summary that may not quote the step's intent."""
    return " + ".join(str(a.to_arguments()["action"]) for a in traj.steps[k].actions)


class HistoryStep:
    """Rolling macro-history annotation and history samples."""

    name = "history"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, items: list[Work], stats: StageStats) -> list[Work]:
        """Run every trajectory's chain; chains run concurrently."""
        self.ctx.run_all([self.chain(w, stats) for w in items])
        return items

    async def chain(self, work: Work, stats: StageStats) -> None:
        """The trajectory's summaries in order, up to the last pair a planned sample needs."""
        # A failed run's summaries would describe a failing agent's steps as the way forward.
        if work.failed_run:
            return
        traj = work.trajectory
        wanted = self.ctx.history_pairs.get(work.id, len(traj.steps) - 1)
        if wanted < len(traj.steps) - 1:
            stats.add("skipped_history_critique_ratio", len(traj.steps) - 1 - wanted)
        pairs = range(wanted)
        stats.seen(len(pairs))
        # The first pair reads the profile's opening summary (hivig's own: INITIAL_SUMMARY).
        summary = (
            INITIAL_SUMMARY if self.ctx.critic_profile is None else self.ctx.profile.initial_summary
        )
        done: list[str] = []
        stale = False
        for k in pairs:
            out = await self._pair(work, k, summary, done, stats, len(pairs) - k - 1)
            if out is _TRANSIENT:
                sid = sample_id(traj.id, k)
                for later in range(k + 1, len(pairs)):
                    stats.drop(sample_id(traj.id, later), "chain_broken", f"pair {sid} failed")
                return
            if out is None:  # dropped with its reason by _pair; the summary stays the last good
                stale = True
                continue
            if stale:
                stats.add("chain_resumed")
                stale = False
            summary = out.summary
            if work.units[k].history is not None:  # else dropped as RECORD_INVALID
                stats.kept()

    async def _pair(
        self, work: Work, k: int, previous: str, done: list[str], stats: StageStats, following: int
    ) -> HistoryOutput | object | None:
        """The pair's summary; ``None`` when dropped, ``_TRANSIENT`` when dropped for now."""
        ctx, traj = self.ctx, work.trajectory
        sid = sample_id(traj.id, k)
        before, after = traj.steps[k].screenshot, traj.steps[k + 1].screenshot
        digest = ctx.annotator.digest
        d0, d1 = await ctx.annotator.file_digests(before, after)
        if not digest.readable(before) or not digest.readable(after):
            missing = after if digest.readable(before) else before
            stats.drop(sid, "missing_image", f"cannot read {missing}")
            return None
        masked = unit_float(ctx.seed, sid, "history_intent_mask") < ctx.cfg.history.intent_mask_rate
        text = step_text(traj, k, mask_intent=masked)
        args = (traj.task, traj.platform, previous, image(traj, before), image(traj, after), text)
        intent = traj.steps[k].intent or ""
        no_change = d0 == d1
        # A masked step's intent is not in the sample's input, so the target must not quote
        # it: the progress records what the calls did instead.
        if intent and not no_change:
            done.append(
                f"carried out the {action_names(traj, k)} step" if masked else intent.rstrip(".")
            )
        oracle = {
            "task": traj.task,
            "intent": None if masked else intent,
            "no_change": no_change,
            "done": list(done),
        }
        messages = list(build_history_annotation_messages(*args))
        request = AnnotatorRequest(self.name, messages, oracle, following)
        result = await ctx.annotate_or_drop(
            stats, sid, request, history_validator(intent if masked else None)
        )
        if not result.ok:
            return _TRANSIENT if result.reason in TRANSIENT_REASONS else None
        out, target = result.value
        messages = build_history_messages(*args, profile=ctx.critic_profile)
        try:
            work.units[k].history = ctx.sample(
                work,
                k,
                messages,
                target,
                id=f"{sid}:history",
                labels=Labels(intent_masked=masked),
                hashes=result.request_hashes,
            )
        except RecordError as e:
            # The summary is sound and carries the chain on; only the sample is unusable.
            stats.drop(f"{sid}:history", RECORD_INVALID, str(e))
            return out
        if masked:
            stats.add("intent_masked")
        return out
