"""``CriticGuard``: observe -> review -> commit per step, best-of-N, and the fixed points where
its rescues (``serve.guard.reroute``, ``serve.guard.recovery``) act."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from serve.client import (
    ActionInput,
    CriticClient,
    ImageInput,
    Observation,
    Ranking,
    Session,
    Verdict,
    abstain,
    rank_verdicts,
)
from serve.guard.config import GuardConfig, Mode
from serve.guard.decisions import Decision, PolicyContext, Review, default_to_action, describe
from serve.guard.recovery import Recovery
from serve.guard.reroute import Reroute
from serve.guard.state import GatewayNotes, Rescue, StepState, verdict_dict

log = logging.getLogger(__name__)


class CriticGuard:
    """Wraps a policy callable with the critic (see the ``serve.guard`` docstring).

    Args:
        client: A ``CriticClient``.
        policy: ``policy(ctx: PolicyContext) -> proposal`` (any object; a list of N under
            best-of-N is allowed).
        task: The task instruction.
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.
        screen: Screen size ``(w, h)`` in pixels.
        coord_space: How the policy writes coordinates (the session default).
        config: Rejection, R3 and recovery settings.
        to_action: Proposal -> API action object (an adapter's converter).
        session_kwargs: Extra ``CriticClient.start`` arguments (``frame``, ``action_format``,
            ``policy_id``, ``volatile_regions``).
        describe: Proposal -> short text for the policy's history and the feedback (default:
            the action's intent or raw text).
    """

    def __init__(
        self,
        client: CriticClient,
        policy: Callable[[PolicyContext], Any],
        *,
        task: str,
        platform: str,
        screen: tuple[int, int],
        coord_space: str = "screen_px",
        config: GuardConfig | None = None,
        to_action: Callable[[Any], ActionInput] = default_to_action,
        session_kwargs: dict[str, Any] | None = None,
        describe: Callable[[Any], str] | None = None,
    ) -> None:
        self.client = client
        self.describe = describe
        self.policy = policy
        self.config = config or GuardConfig()
        self.to_action = to_action
        self.platform = platform
        self.screen = screen
        self.coord_space = coord_space
        self.session_kwargs = dict(session_kwargs or {})
        self.session: Session | None = None
        self.log: list[dict[str, Any]] = []
        self.events: Counter[str] = Counter()
        self.reset(task)

    # -- episode ------------------------------------------------------------------------

    def reset(self, task: str | None = None) -> None:
        """Start a new episode (a new gateway session on the next observe)."""
        if self.session is not None:
            self.session.close()
        self.session = None
        if task is not None:
            self.task = task
        self.log = []
        self.events = Counter()
        self.history: list[str] = []
        """The executed steps as text, oldest first (R3 leaves its loops out)."""
        self.notes = GatewayNotes()
        self._rejections: Counter[str] = Counter()
        self._next_idx = 0
        self._gw_next = 0
        self._pending: ActionInput | None = None
        self._step: StepState | None = None
        # The rescues, in the order they are tried on a new screen; each owns its state.
        self._r3 = Reroute()
        self._recovery = Recovery()
        self._rescues: tuple[Rescue, ...] = (self._r3, self._recovery)

    def close(self, outcome: str | None = None) -> None:
        """End the episode's gateway session.

        Args:
            outcome: ``success`` / ``failure`` when the runner's evaluator has scored the task:
                recorded in the session's trace (what ``data_gen ingest-runs`` reads).
        """
        if self.session is not None:
            self.session.close(outcome) if outcome else self.session.close()
            self.session = None

    @property
    def step_idx(self) -> int:
        """The step being decided (after ``observe``), else the next one."""
        return self._step.idx if self._step is not None else self._next_idx

    @property
    def mode(self) -> Mode:
        """``normal``, ``reroute`` or ``recovery``."""
        rescue = self._rescue()
        return rescue.mode if rescue is not None else "normal"

    @property
    def r3_events(self) -> list[dict[str, Any]]:
        """R3's restores and give-ups of the episode, in order."""
        return self._r3.events

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """The episode's ended recoveries: ``target_step``, ``reached``, ``steps``."""
        return self._recovery.outcomes

    def _rescue(self) -> Rescue | None:
        """The rescue running now (at most one runs at a time)."""
        return next((r for r in self._rescues if r.active), None)

    def _session(self) -> Session:
        if self.session is None:
            self.session = self.client.start(
                self.task, self.platform, self.screen, self.coord_space, **self.session_kwargs
            )
        return self.session

    # -- observe ------------------------------------------------------------------------

    def observe(self, screenshot: ImageInput) -> Observation:
        """Begin the next step: send the screen (and the action executed before it)."""
        idx, gw = self._next_idx, self._gw_next
        prev = self._pending if idx > 0 else None
        obs = self._session().observe(gw, screenshot, prev)
        self._recovery.keep_screen(self, idx, screenshot)
        self.notes.note(idx, gw, obs)
        self._r3.observed(self, idx, obs)
        record: dict[str, Any] = {
            "step_idx": idx,
            "observe": {
                "status": obs.status,
                "reason": obs.reason,
                "history": obs.history.text(),
                "image_ref": obs.image_ref,
                "no_effect": obs.no_effect,
                "r3_trigger": obs.r3_trigger,
            },
            "proposals": [],
        }
        if gw != idx:
            record["gateway_step"] = gw
        st = self._step = StepState(idx, screenshot, obs, gw=gw, record=record)
        self.log.append(record)
        if not obs.ok:
            self.events[f"observe_{obs.reason}"] += 1
        rescue = self._rescue()
        if rescue is not None:
            # A rescue that ends on this screen does not start another one here.
            rescue.check(self, st, obs, screenshot, record)
        else:
            for candidate in self._rescues:
                if candidate.start(self, st, obs, record):
                    break
        record["mode"] = self.mode
        return obs

    # -- proposing and reviewing --------------------------------------------------------

    def context(self) -> PolicyContext:
        """The policy's context for the current step and mode."""
        st = self._require_step()
        rescue = self._rescue()
        if rescue is not None:
            return rescue.context(self, st)
        return self.history_context(st, n=self.config.candidates)

    def history_context(
        self, st: StepState, *, mode: Mode = "normal", brief: str | None = None, n: int = 1
    ) -> PolicyContext:
        """The policy's context with the episode's history (normal and recovery modes)."""
        text = self._r3.history_text(self, st.idx) if self.config.inject_history else ""
        return PolicyContext(
            self.task,
            st.idx,
            st.screenshot,
            history_text=text,
            history=tuple(self.history),
            feedback=tuple(st.feedback),
            mode=mode,
            brief=brief,
            n=n,
        )

    def _require_step(self) -> StepState:
        if self._step is None:
            raise RuntimeError("call observe() before proposing")
        return self._step

    def _critique(self, idx: int, action: ActionInput) -> Verdict:
        try:
            v = self._session().critique(idx, action)
        except Exception as exc:  # noqa: BLE001 - a critic problem never stops the agent
            log.warning("critique failed: %s", exc)
            return self._fail_open("client_error")
        return v if isinstance(v, Verdict) else self._fail_open("bad_response")

    def _fail_open(self, reason: str) -> Verdict:
        """A guard-level abstention (the session gave no verdict), counted in ``events``."""
        self.events[f"critique_{reason}"] += 1
        return abstain(reason)

    def _text_of(self, proposal: Any, action: ActionInput | None) -> str:
        if self.describe is not None and proposal is not None:
            try:
                return self.describe(proposal)
            except Exception as exc:  # noqa: BLE001 - a converter bug must not stop the agent
                log.warning("describe failed: %s", exc)
        return describe(action)

    def _action_of(self, proposal: Any) -> ActionInput:
        """The API action of a proposal; a converter error falls back to the raw text."""
        try:
            return self.to_action(proposal)
        except Exception as exc:  # noqa: BLE001 - the proposal is still judged, as text
            log.warning("to_action failed (%s); sending the proposal as raw text", exc)
            return default_to_action(str(proposal))

    def feedback_text(self, proposal: Any, action: ActionInput, verdict: Verdict) -> str:
        """The feedback the policy gets on a rejected proposal (``feedback_template``)."""
        return self.config.feedback_template.format(
            action=self._text_of(proposal, action),
            dimension=verdict.error_dimension or "incorrect",
            explanation=verdict.explanation or "no explanation given.",
        )

    def review(self, proposal: Any) -> Review:
        """Rule on one proposal at the current step (critique, K, exhaustion, escalation)."""
        st = self._require_step()
        action = self._action_of(proposal)
        screen = st.screen_key
        rescue = self._rescue()
        if rescue is None and self._rejections[screen] >= self.config.escalate_after:
            self._rejections[screen] = 0
            self.events["escalation"] += 1
            log.warning(
                "critic escalation: %s rejections at one screen", self.config.escalate_after
            )
            st.attempts.append((proposal, action, None))
            return self._log_review(st, Review(True, proposal, action, None, "escalated"))
        critique = rescue is None or rescue.critiques(self)
        verdict = self._critique(st.gw, action) if critique else None
        st.attempts.append((proposal, action, verdict))
        if verdict is None or not verdict.is_bad:
            fail_open = verdict is not None and verdict.abstained
            outcome = "fail_open" if fail_open else "accepted"
            return self._log_review(st, Review(True, proposal, action, verdict, outcome))
        self._rejections[screen] += 1
        ruling = rescue.rejected(self, st, proposal, action, verdict) if rescue else None
        if ruling is not None:
            return self._log_review(st, ruling)
        if len(st.attempts) <= self.config.max_reproposals:
            text = self.feedback_text(proposal, action, verdict)
            st.feedback.append(text)
            return self._log_review(
                st, Review(False, proposal, action, verdict, "rejected", feedback=text)
            )
        return self._log_review(st, self._exhausted(st))

    def _exhausted(self, st: StepState) -> Review:
        how = self.config.on_exhausted
        self.events["critic_overridden" if how != "stop" else "critic_stopped"] += 1
        if how == "stop":
            last = st.attempts[-1]
            return Review(False, None, None, last[2], "stopped")
        proposal, action, verdict = st.attempts[0] if how == "execute_first" else st.attempts[-1]
        return Review(True, proposal, action, verdict, "critic_overridden")

    def _log_review(self, st: StepState, rv: Review) -> Review:
        last = st.attempts[-1] if st.attempts else (None, None, None)
        st.record["proposals"].append(
            {"action": last[1], "verdict": verdict_dict(last[2]), "ruling": rv.outcome}
        )
        if rv.feedback:
            st.record.setdefault("feedback", []).append(rv.feedback)
        return rv

    def commit(self, review: Review) -> Decision:
        """Mark ``review.proposal`` as executed: it becomes the next observe's prev_action."""
        st = self._require_step()
        self._pending = review.action
        text = self._text_of(review.proposal, review.action)
        st.record["outcome"] = review.outcome
        st.record["executed"] = review.action
        rescue = self._rescue()
        if rescue is not None:
            rescue.commit(self, text, review.action)
        else:
            self.history.append(text)
        self._next_idx, self._gw_next = st.idx + 1, st.gw + 1
        self._step = None
        return Decision(
            st.idx, review.proposal, review.action, review.verdict, review.outcome, record=st.record
        )

    @property
    def terminating(self) -> bool:
        """R3 gave up and is configured to end the episode (the next decision stops)."""
        return self._r3.terminate

    def abandon(self, outcome: str = "stopped") -> Decision:
        """End the current step without executing anything (the episode stops)."""
        if self._r3.take_terminate():
            outcome = "r3_failed"
        return self._stop(outcome)

    def _stop(self, outcome: str, verdict: Verdict | None = None) -> Decision:
        st = self._require_step()
        st.record["outcome"] = outcome
        self._step = None
        return Decision(st.idx, None, None, verdict, outcome, stop=True, record=st.record)

    # -- whole steps --------------------------------------------------------------------

    def decide(self) -> Decision:
        """Propose, critique and re-propose at the observed step; returns what to execute."""
        if self._r3.take_terminate():
            return self._stop("r3_failed")
        ctx = self.context()
        if ctx.n > 1:
            return self._best_of_n(ctx)
        while True:
            review = self.review(self.policy(ctx))
            if review.accept:
                return self.commit(review)
            if review.stop:
                outcome = "r3_failed" if self._r3.take_terminate() else "stopped"
                return self._stop(outcome, review.verdict)
            ctx = self.context()

    def step(self, screenshot: ImageInput) -> Decision:
        """Observe ``screenshot`` and decide the next action (the harness executes it)."""
        self.observe(screenshot)
        return self.decide()

    def run(
        self,
        execute: Callable[[Any], ImageInput | None],
        screenshot: ImageInput,
        max_steps: int,
        *,
        is_done: Callable[[Decision], bool] | None = None,
    ) -> list[Decision]:
        """Drive an episode: ``execute(proposal)`` runs an action and returns the next screen
        (``None`` when the episode ended)."""
        decisions: list[Decision] = []
        for _ in range(max_steps):
            decision = self.step(screenshot)
            decisions.append(decision)
            if decision.stop or (is_done is not None and is_done(decision)):
                break
            nxt = execute(decision.proposal)
            if nxt is None:
                break
            screenshot = nxt
        return decisions

    def _best_of_n(self, ctx: PolicyContext) -> Decision:
        st = self._require_step()
        proposals = self._candidates(ctx)
        actions = [self._action_of(p) for p in proposals]
        screen = st.screen_key
        if self._rejections[screen] >= self.config.escalate_after:
            # As in ``review``: after enough rejections at one screen the critic stands aside.
            self._rejections[screen] = 0
            self.events["escalation"] += 1
            st.attempts.append((proposals[0], actions[0], None))
            st.record["proposals"].append({"action": actions[0], "verdict": None, "rank": 0})
            return self.commit(Review(True, proposals[0], actions[0], None, "escalated"))
        ranked = self._session().critique(st.gw, candidates=actions)
        if isinstance(ranked, Ranking) and len(ranked.results) == len(actions):
            verdicts = list(ranked.results)
        else:
            verdicts = [self._fail_open("bad_response") for _ in actions]
        order = rank_verdicts(verdicts)
        for i, (p, a, v) in enumerate(zip(proposals, actions, verdicts, strict=True)):
            st.attempts.append((p, a, v))
            st.record["proposals"].append(
                {"action": a, "verdict": verdict_dict(v), "rank": order.index(i)}
            )
        best = order[0]
        if all(v.is_bad for v in verdicts):
            # Every candidate was rejected: the exhaustion policy decides, as for K proposals.
            self._rejections[screen] += len(verdicts)
            if self.config.on_exhausted == "stop":
                self.events["critic_stopped"] += 1
                return self._stop("stopped", verdicts[best])
            self.events["critic_overridden"] += 1
            outcome = "critic_overridden"
        else:
            outcome = "fail_open" if all(v.abstained for v in verdicts) else "ranked"
        return self.commit(Review(True, proposals[best], actions[best], verdicts[best], outcome))

    def _candidates(self, ctx: PolicyContext) -> list[Any]:
        """``ctx.n`` proposals: the policy's lists flattened, the policy called again (at most
        ``n`` calls in all) while there are fewer."""
        proposals: list[Any] = []
        for _ in range(ctx.n):
            proposals.extend(_flatten(self.policy(ctx)))
            if len(proposals) >= ctx.n:
                break
        return proposals[: ctx.n] or [None]


def _flatten(value: Any) -> list[Any]:
    """A policy's answer as a flat list of proposals (nested lists unpacked)."""
    if not isinstance(value, list):
        return [value]  # a tuple is one proposal (a predict() output pair)
    out: list[Any] = []
    for item in value:
        out.extend(_flatten(item))
    return out
