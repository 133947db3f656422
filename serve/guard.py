"""``CriticGuard``: the critic in the agent loop around any policy callable.

Per step: observe the new screen (the macro history comes back and is
handed to the policy), let the policy propose, critique the proposal, and on ``bad`` feed the
explanation back and re-propose, up to ``max_reproposals`` times; then execute. A critic that
abstains, fails or is unreachable never blocks: the proposal is executed as is.

Two loop-level rescues run on top:

* **R3** (Reset, Reroute, Restore) when the gateway's recurrence detector fires (the same
  screen–action pair repeated without effect): the policy proposes from a fresh context (task and
  current screen only), each proposal is executed and the first that changes the screen is kept;
  the policy's history afterwards is the history before the loop plus the kept step, and the
  gateway's macro history is rebuilt the same way (the session re-seeded with the echo from
  before the loop, the kept step observed again), so neither shows a trace of the loop.
* **ReTrace recovery** when the gateway proposes a recovery target (an earlier intact screen): a
  bounded sub-loop gives the policy the gateway's brief until the target screen is back.

The guard is a step-wise state machine, so it fits harnesses that execute actions themselves
(``step(screenshot) -> Decision``; the harness executes ``decision.proposal``) as well as those
where the guard sits inside the agent (``observe`` / ``review`` / ``commit``). ``run`` drives a
whole episode when the caller hands over an ``execute`` function.

Every step leaves one plain dict in ``guard.log`` (observe summary, proposals with verdicts,
outcome, R3/recovery events) for a harness log or a demo page.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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

log = logging.getLogger(__name__)

OnExhausted = Literal["execute_last", "execute_first", "stop"]
Mode = Literal["normal", "reroute", "recovery"]

ECHOES_KEPT = 32
"""Recent echoes kept (the one from before a loop re-seeds the gateway on Restore)."""

RESTORED_RESULTS_KEPT = 8
"""After a Restore the policy sees the pre-loop history plus at most this many later results."""

DEFAULT_FEEDBACK = (
    "A critic judged your proposed action {action} as {dimension}: {explanation} "
    "Propose a different action."
)


@dataclass(frozen=True)
class R3Config:
    """R3 settings.

    Attributes:
        enabled: React to the gateway's ``r3_trigger``.
        reroute_attempts: Proposals from a fresh context (N) before giving up.
        on_failure: What happens when no reroute proposal changes the screen. ``continue``
            (the default) fails open: the give-up is logged (``gave_up`` in the step's log
            record and in ``events``) and the step is decided afresh in normal mode with the
            restored history, so the policy's own proposal runs. ``terminate`` ends the episode
            (``Decision.stop``; adapters turn it into their harness' stop value, e.g. OSWorld's
            ``FAIL``). A stop is a task outcome the guard makes up (OSWorld scores ``FAIL`` 1.0
            on infeasible tasks and 0 elsewhere), so it is an explicit choice, never a default.
        critique_reroutes: Critique reroute proposals; a ``bad`` one is not executed (it still
            uses one of the N).
        rebuild_gateway_history: On Restore, also rebuild the gateway's macro history: the
            session is re-seeded with the echo from before the loop and the accepted step is
            observed again, so later summaries and critique prompts hold no trace of the loop.
            When that fails, only the policy's history is restored.
    """

    enabled: bool = True
    reroute_attempts: int = 3
    on_failure: Literal["terminate", "continue"] = "continue"
    critique_reroutes: bool = True
    rebuild_gateway_history: bool = True

    def __post_init__(self) -> None:
        if self.reroute_attempts < 1 or self.on_failure not in ("terminate", "continue"):
            raise ValueError("r3: reroute_attempts >= 1, on_failure terminate or continue")


@dataclass(frozen=True)
class RecoveryLoopConfig:
    """ReTrace recovery settings.

    Attributes:
        enabled: Run the recovery sub-loop when the gateway proposes a target.
        budget: Steps the policy gets to reach the target screen (r).
        keep_screens: Recent screenshots kept for the frame comparison.

    The target counts as reached when the gateway's image_ref matches, or when the screenshots
    show the same screen by the shared judge (``hivig.screens.same_screen``: the platform's and
    the session's volatile regions masked, sub-threshold noise ignored).
    """

    enabled: bool = True
    budget: int = 3
    keep_screens: int = 16

    def __post_init__(self) -> None:
        if self.budget < 1 or self.keep_screens < 1:
            raise ValueError("recovery: budget >= 1, keep_screens >= 1")


@dataclass(frozen=True)
class GuardConfig:
    """Rejection and re-proposal policy.

    Attributes:
        max_reproposals: Re-proposals after a ``bad`` verdict (K; 1 matches the two policy calls
            per step of the published setup, 2 is the usual ceiling).
        on_exhausted: What to run when the last proposal is still ``bad``: ``execute_last``
            (the default: fail open, logged as ``critic_overridden``), ``execute_first`` or
            ``stop`` (end the episode: an explicit choice, as a stop is a made-up task outcome;
            see ``R3Config.on_failure``).
        escalate_after: Rejections at one screen within an episode after which the next
            proposal is accepted without critique (and an escalation logged).
        candidates: Best-of-N: ask the policy for N candidates and execute the best-ranked
            (verdict, then confidence); 1 turns it off.
        inject_history: Hand the gateway's macro history to the policy.
        feedback_template: Feedback text; ``{action}``, ``{dimension}``, ``{explanation}``.
        r3: R3 settings.
        recovery: Recovery settings.
    """

    max_reproposals: int = 1
    on_exhausted: OnExhausted = "execute_last"
    escalate_after: int = 3
    candidates: int = 1
    inject_history: bool = True
    feedback_template: str = DEFAULT_FEEDBACK
    r3: R3Config = field(default_factory=R3Config)
    recovery: RecoveryLoopConfig = field(default_factory=RecoveryLoopConfig)

    def __post_init__(self) -> None:
        if self.max_reproposals < 0 or self.escalate_after < 1 or self.candidates < 1:
            raise ValueError("max_reproposals >= 0, escalate_after >= 1, candidates >= 1")
        if self.on_exhausted not in ("execute_last", "execute_first", "stop"):
            raise ValueError("on_exhausted must be execute_last, execute_first or stop")


@dataclass(frozen=True)
class PolicyContext:
    """What the policy is called with.

    Attributes:
        task: The task instruction.
        step_idx: The harness step being decided.
        screenshot: The current screen, as the harness gave it.
        history_text: The macro history (empty after an R3 reset or with injection off).
        history: The executed steps as text, oldest first (R3 leaves the loop out).
        feedback: Critic feedback on this step's earlier proposals, oldest first.
        mode: ``normal``, ``reroute`` (R3 fresh context) or ``recovery``.
        brief: The recovery brief (recovery mode only).
        n: Candidates wanted (best-of-N); the policy may return a list of that length.
    """

    task: str
    step_idx: int
    screenshot: ImageInput | None
    history_text: str = ""
    history: tuple[str, ...] = ()
    feedback: tuple[str, ...] = ()
    mode: Mode = "normal"
    brief: str | None = None
    n: int = 1

    @property
    def fresh(self) -> bool:
        """True when the policy must decide without its own history (R3 reset)."""
        return self.mode == "reroute"

    def prompt_addendum(self) -> str:
        """History, recovery brief and feedback as one block to append to a policy prompt."""
        parts = []
        if self.history_text:
            parts.append(self.history_text)
        if self.brief:
            parts.append(f"Recovery: {self.brief}")
        parts.extend(self.feedback)
        return "\n\n".join(parts)


@dataclass(frozen=True)
class Review:
    """The guard's ruling on one proposal.

    Attributes:
        accept: Execute ``proposal`` now.
        proposal: What to execute (may be an earlier proposal under ``execute_first``).
        action: Its API action object.
        verdict: The critic's verdict (``None`` when not critiqued).
        outcome: ``accepted``, ``fail_open``, ``rejected``, ``critic_overridden``,
            ``escalated``, ``ranked``, ``stopped``.
        feedback: The feedback text for the next proposal (rejections only).
    """

    accept: bool
    proposal: Any
    action: ActionInput | None
    verdict: Verdict | None
    outcome: str
    feedback: str | None = None

    @property
    def stop(self) -> bool:
        """The episode should end (``on_exhausted: stop``)."""
        return self.outcome == "stopped"


@dataclass(frozen=True)
class Decision:
    """What a guarded step asks the harness to do.

    Attributes:
        step_idx: The step decided.
        proposal: The policy output to execute (``None`` when stopping).
        action: Its API action object.
        verdict: The verdict of the executed proposal (``None`` when not critiqued).
        outcome: As ``Review.outcome``, plus ``r3_failed``.
        stop: End the episode instead of executing; only when configured so
            (``on_exhausted: stop`` or ``r3.on_failure: terminate``).
        record: This step's entry of ``guard.log``.
    """

    step_idx: int
    proposal: Any
    action: ActionInput | None
    verdict: Verdict | None
    outcome: str
    stop: bool = False
    record: dict[str, Any] = field(default_factory=dict, repr=False)


def default_to_action(proposal: Any) -> ActionInput:
    """Policy output -> API action: dicts as they are, anything else as raw text."""
    if isinstance(proposal, dict):
        return proposal
    return {"raw": str(proposal), "format": "auto"}


def describe(action: ActionInput | None) -> str:
    """Short text of an action for histories and feedback."""
    if action is None:
        return ""
    if isinstance(action, str):
        return action
    if action.get("intent"):
        return str(action["intent"])
    if "raw" in action:
        return str(action["raw"])
    return json.dumps(action, ensure_ascii=False, sort_keys=True)


def _verdict_dict(v: Verdict | None) -> dict[str, Any] | None:
    if v is None:
        return None
    return {
        "verdict": v.verdict,
        "source": v.source,
        "reason": v.reason,
        "error_dimension": v.error_dimension,
        "explanation": v.explanation,
        "confidence": v.confidence,
        "marker": v.marker,
    }


@dataclass
class _Step:
    """State of the step being decided."""

    idx: int
    screenshot: ImageInput | None
    observation: Observation | None
    gw: int = 0
    """The gateway's step index (differs from ``idx`` after a rebuilt Restore)."""
    attempts: list[tuple[Any, ActionInput, Verdict | None]] = field(default_factory=list)
    feedback: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Reroute:
    """R3 state: the context saved at the trigger and the reroute attempts so far."""

    saved_history: list[str]
    saved_text: str
    trigger_step: int
    loop_start: int
    saved_echo: dict[str, Any] | None = None
    attempts: int = 0
    executed: list[str] = field(default_factory=list)
    executed_actions: list[ActionInput] = field(default_factory=list)


@dataclass
class _Recovering:
    """Recovery state: the target screen and the steps spent."""

    target_step: int
    target_image_ref: str
    brief: str
    steps: int = 0


class CriticGuard:
    """Wraps a policy callable with the critic (see the module docstring).

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
        self._texts: dict[int, str] = {}
        self._text_base: str | None = None
        self._text_base_version = 0
        self._since_restore: list[str] = []
        self._screens: dict[int, ImageInput] = {}
        self._echoes: dict[int, dict[str, Any]] = {}
        self._gw_next = 0
        self._guard_of: dict[int, int] = {}
        self._rejections: Counter[str] = Counter()
        self._next_idx = 0
        self._pending: ActionInput | None = None
        self._step: _Step | None = None
        self._mode: Mode = "normal"
        self._reroute: _Reroute | None = None
        self._recovery: _Recovering | None = None
        self._terminate = False
        self._recovered_targets: set[int] = set()
        self.recoveries: list[dict[str, Any]] = []
        self.r3_events: list[dict[str, Any]] = []

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
        return self._mode

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
        self._keep_screen(idx, screenshot)
        self._guard_of[gw] = idx
        if isinstance(obs.body.get("echo"), dict):
            self._echoes[idx] = obs.body["echo"]
        self._texts[idx] = obs.history.text()
        if self._text_base is not None and self._history_advanced(obs):
            # The gateway wrote a new history after the restored step: from here on the policy
            # sees the gateway's own text again instead of a frozen pre-loop summary.
            self._text_base, self._since_restore = None, []
            self.events["r3_text_released"] += 1
        if self._text_base is not None and obs.ok and obs.history.last_action_result:
            # After a Restore the policy sees the restored history plus each new result.
            self._since_restore.append(
                f"Result of the last action: {obs.history.last_action_result}"
            )
            del self._since_restore[:-RESTORED_RESULTS_KEPT]
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
        self._step = _Step(idx, screenshot, obs, gw=gw, record=record)
        self.log.append(record)
        if not obs.ok:
            self.events[f"observe_{obs.reason}"] += 1
        self._after_observe(obs, screenshot, record)
        record["mode"] = self._mode
        return obs

    def _history_advanced(self, obs: Observation) -> bool:
        """Whether ``obs`` brings a fresh gateway history newer than the one of the restore."""
        fresh = obs.ok and not obs.history.stale and obs.status == "ok"
        return fresh and obs.history.version > self._text_base_version

    def _keep_screen(self, idx: int, screenshot: ImageInput) -> None:
        self._screens[idx] = screenshot
        for old in [k for k in self._screens if k <= idx - self.config.recovery.keep_screens]:
            del self._screens[old]
        for old in [k for k in self._echoes if k <= idx - ECHOES_KEPT]:
            del self._echoes[old]

    def _after_observe(self, obs: Observation, screenshot: ImageInput, record: dict) -> None:
        """Mode transitions driven by the new observation (R3 and recovery)."""
        ended = False
        if self._mode == "reroute":
            ended = self._reroute_check(obs, record)
        elif self._mode == "recovery":
            ended = self._recovery_check(obs, screenshot, record)
        if self._mode != "normal" or ended:
            return  # a rescue that ended on this screen does not start another one here
        if obs.r3_trigger and self.config.r3.enabled:
            self._start_reroute(obs, record)
        elif (
            obs.recovery is not None
            and self.config.recovery.enabled
            and obs.recovery.target_step not in self._recovered_targets
        ):
            rec = obs.recovery
            self._recovered_targets.add(rec.target_step)
            self._mode = "recovery"
            self._recovery = _Recovering(rec.target_step, rec.target_image_ref, rec.brief)
            record["recovery"] = {"event": "start", "target_step": rec.target_step}
            self.events["recovery_start"] += 1

    # -- R3 -----------------------------------------------------------------------------

    def _start_reroute(self, obs: Observation, record: dict) -> None:
        run = obs.recurrence.get("same_key_no_effect_run")
        run = run if isinstance(run, int) and run > 0 else 1
        run = min(run, len(self.history))
        first = self._step.idx - run if self._step else 0  # the first step of the loop
        if self._text_base is None:
            saved_text = self._texts.get(first, "")
        else:  # a loop after an earlier Restore: that history without the loop's results
            kept = self._since_restore[: max(len(self._since_restore) - run, 0)]
            saved_text = "\n".join([self._text_base, *kept]).strip()
        trigger = self._step.idx if self._step else 0
        saved = self.history[: len(self.history) - run]
        self._reroute = _Reroute(
            saved, saved_text, trigger, loop_start=first, saved_echo=self._echoes.get(first)
        )
        self._mode = "reroute"
        key = obs.recurrence.get("action_key")
        record["r3"] = {"event": "trigger", "loop_steps": run, "action_key": key}
        self.events["r3_trigger"] += 1
        log.info("R3 triggered at step %s (loop of %d steps)", record["step_idx"], run)

    def _reroute_check(self, obs: Observation, record: dict) -> bool:
        """After a reroute proposal ran: restore on a changed screen, give up after N."""
        rr = self._reroute
        if rr is None or not rr.executed:
            return False
        if obs.no_effect is False or not obs.ok:
            # The screen changed (or the gateway cannot tell: fail open and keep the step).
            self._restore(rr, obs, record)
            return True
        if rr.attempts >= self.config.r3.reroute_attempts:
            self._reroute_failed(rr, record)
            return True
        return False

    def _restore(self, rr: _Reroute, obs: Observation, record: dict) -> None:
        accepted = rr.executed[-1]
        self.history = [*rr.saved_history, accepted]
        self._mode, self._reroute = "normal", None
        rebuilt = self._rebuild_gateway_history(rr, record)
        if rebuilt is None:
            # The policy still gets the restored history; the gateway's keeps the loop.
            result = obs.history.last_action_result
            self._text_base = rr.saved_text
            self._text_base_version = obs.history.version
            self._since_restore = [f"Result of the last action: {result}"] if result else []
        else:
            self._text_base, self._since_restore = None, []
        event = {"event": "restored", **self._reroute_facts(rr), "gateway_rebuilt": bool(rebuilt)}
        record["r3"] = event
        self.r3_events.append({**event, "accepted": accepted})
        self.events["r3_rerouted"] += 1

    def _rebuild_gateway_history(self, rr: _Reroute, record: dict) -> Observation | None:
        """Re-seed the session with the pre-loop echo and observe the accepted step again.

        Returns the new observation, or ``None`` when it is off or any call failed.
        """
        st, echo = self._step, rr.saved_echo
        if not self.config.r3.rebuild_gateway_history or st is None or echo is None:
            return None
        start = echo.get("step_idx")
        if not isinstance(start, int) or self.session is None or not rr.executed_actions:
            return None
        status = _reseed(self.session, echo)
        if status != "rebuilt":
            # untouched: the gateway still holds the loop, numbering unchanged. lost: the
            # session was closed; the client re-creates it from its current echo (the loop
            # included) at the next call, so the numbering stays the same and nothing is
            # force-replayed across a gap.
            self.events["r3_rebuild_failed" if status == "untouched" else "r3_rebuild_lost"] += 1
            return None
        gw = start + 1
        obs = self.session.observe(gw, st.screenshot, rr.executed_actions[-1])
        if not obs.ok:
            # The gateway now stands at the echo's step: number from there anyway, so the next
            # observe follows on (its screen is replayed for this step if it is missing).
            self.events["r3_rebuild_failed"] += 1
            st.gw = gw
            self._guard_of[gw] = st.idx
            return None
        # From here on the gateway numbers steps without the loop.
        st.gw, st.observation = gw, obs
        self._guard_of[gw] = st.idx
        self._texts[st.idx] = obs.history.text()
        if isinstance(obs.body.get("echo"), dict):
            self._echoes[st.idx] = obs.body["echo"]
        record["gateway_step"] = gw
        record["observe"]["history"] = obs.history.text()
        return obs

    def _reroute_failed(self, rr: _Reroute, record: dict) -> None:
        self.history = list(rr.saved_history)
        self._text_base = rr.saved_text
        obs = self._step.observation if self._step is not None else None
        self._text_base_version = obs.history.version if obs is not None else 0
        self._since_restore = []
        self._mode, self._reroute = "normal", None
        event = {"event": "failed", **self._reroute_facts(rr)}
        record["r3"] = event
        self.r3_events.append(event)
        self.events["r3_failed"] += 1
        if self.config.r3.on_failure == "terminate":
            record["r3"]["terminate"] = True
            self._terminate = True
        else:
            # Fail open: nothing is made up for the harness; the policy's next proposal runs and
            # the log says R3 gave up here.
            record["gave_up"] = "r3_failed"
            self.events["gave_up"] += 1
            log.info("R3 gave up at step %s; the policy's proposal runs", record["step_idx"])

    @staticmethod
    def _reroute_facts(rr: _Reroute) -> dict[str, Any]:
        return {
            "attempts": rr.attempts,
            "trigger_step": rr.trigger_step,
            "loop_start": rr.loop_start,
        }

    def _restored(self) -> str:
        return "\n".join([self._text_base or "", *self._since_restore]).strip()

    # -- recovery -----------------------------------------------------------------------

    def _recovery_check(self, obs: Observation, screenshot: ImageInput, record: dict) -> bool:
        """After a recovery step ran: end on the target screen or when the budget is spent."""
        rec = self._recovery
        if rec is None or rec.steps == 0:
            return False
        reached = self._same_screen(obs, screenshot, rec)
        if not reached and rec.steps < self.config.recovery.budget:
            return False
        outcome = {"target_step": rec.target_step, "reached": reached, "steps": rec.steps}
        self.recoveries.append(outcome)
        record["recovery"] = {"event": "end", **outcome}
        self.events["recovery_reached" if reached else "recovery_failed"] += 1
        self._mode, self._recovery = "normal", None
        return True

    def _same_screen(self, obs: Observation, screenshot: ImageInput, rec: _Recovering) -> bool:
        """Whether the screen is the recovery target (ReTrace's arrival test, by fingerprint)."""
        if obs.image_ref is not None and obs.image_ref == rec.target_image_ref:
            return True
        # Different references only mean different bytes: a ticking clock changes them, so the
        # frames themselves are judged.
        target = self._screens.get(self._guard_of.get(rec.target_step, rec.target_step))
        if target is None:
            return False
        regions = self.session_kwargs.get("volatile_regions") or ()
        return target == screenshot or _frames_match(target, screenshot, self.platform, regions)

    # -- proposing and reviewing --------------------------------------------------------

    def context(self) -> PolicyContext:
        """The policy's context for the current step and mode."""
        st = self._require_step()
        n = self.config.candidates if self._mode == "normal" else 1
        if self._mode == "reroute":
            # Reset: task and current screen only (plus the critic's word on this screen).
            fb = tuple(st.feedback)
            return PolicyContext(self.task, st.idx, st.screenshot, feedback=fb, mode="reroute")
        text = ""
        if self.config.inject_history:
            text = self._restored() if self._text_base is not None else self._texts.get(st.idx, "")
        brief = self._recovery.brief if self._mode == "recovery" and self._recovery else None
        return PolicyContext(
            self.task,
            st.idx,
            st.screenshot,
            history_text=text,
            history=tuple(self.history),
            feedback=tuple(st.feedback),
            mode=self._mode,
            brief=brief,
            n=n,
        )

    def _require_step(self) -> _Step:
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

    def _feedback(self, proposal: Any, action: ActionInput, verdict: Verdict) -> str:
        return self.config.feedback_template.format(
            action=self._text_of(proposal, action),
            dimension=verdict.error_dimension or "incorrect",
            explanation=verdict.explanation or "no explanation given.",
        )

    def review(self, proposal: Any) -> Review:
        """Rule on one proposal at the current step (critique, K, exhaustion, escalation)."""
        st = self._require_step()
        action = self._action_of(proposal)
        screen = _screen_key(st)
        skip_critic = self._mode == "reroute" and not self.config.r3.critique_reroutes
        if self._mode == "normal" and self._rejections[screen] >= self.config.escalate_after:
            self._rejections[screen] = 0
            self.events["escalation"] += 1
            log.warning(
                "critic escalation: %s rejections at one screen", self.config.escalate_after
            )
            st.attempts.append((proposal, action, None))
            return self._log_review(st, Review(True, proposal, action, None, "escalated"))
        verdict = None if skip_critic else self._critique(st.gw, action)
        st.attempts.append((proposal, action, verdict))
        if verdict is None or not verdict.is_bad:
            fail_open = verdict is not None and verdict.abstained
            outcome = "fail_open" if fail_open else "accepted"
            return self._log_review(st, Review(True, proposal, action, verdict, outcome))
        self._rejections[screen] += 1
        if self._mode == "reroute":
            return self._log_review(st, self._reroute_rejected(st, proposal, action, verdict))
        if len(st.attempts) <= self.config.max_reproposals:
            text = self._feedback(proposal, action, verdict)
            st.feedback.append(text)
            return self._log_review(
                st, Review(False, proposal, action, verdict, "rejected", feedback=text)
            )
        return self._log_review(st, self._exhausted(st))

    def _reroute_rejected(
        self, st: _Step, proposal: Any, action: ActionInput, verdict: Verdict
    ) -> Review:
        rr = self._reroute
        if rr is None:
            return Review(True, proposal, action, verdict, "critic_overridden")
        rr.attempts += 1
        text = self._feedback(proposal, action, verdict)
        st.feedback.append(text)
        if rr.attempts >= self.config.r3.reroute_attempts:
            self._reroute_failed(rr, st.record)
            if self._terminate:
                return Review(False, None, None, verdict, "stopped")
            # continue: this step is decided afresh in normal mode with the restored history.
            st.attempts.clear()
            st.feedback.clear()
        return Review(False, proposal, action, verdict, "rejected", feedback=text)

    def _exhausted(self, st: _Step) -> Review:
        how = self.config.on_exhausted
        self.events["critic_overridden" if how != "stop" else "critic_stopped"] += 1
        if how == "stop":
            last = st.attempts[-1]
            return Review(False, None, None, last[2], "stopped")
        proposal, action, verdict = st.attempts[0] if how == "execute_first" else st.attempts[-1]
        return Review(True, proposal, action, verdict, "critic_overridden")

    def _log_review(self, st: _Step, rv: Review) -> Review:
        last = st.attempts[-1] if st.attempts else (None, None, None)
        st.record["proposals"].append(
            {"action": last[1], "verdict": _verdict_dict(last[2]), "ruling": rv.outcome}
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
        if self._mode == "reroute" and self._reroute is not None:
            self._reroute.executed.append(text)
            self._reroute.executed_actions.append(review.action)  # type: ignore[arg-type]
            self._reroute.attempts += 1
        elif self._mode == "recovery" and self._recovery is not None:
            self._recovery.steps += 1
            self.history.append(text)
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
        return self._terminate

    def abandon(self, outcome: str = "stopped") -> Decision:
        """End the current step without executing anything (the episode stops)."""
        if self._terminate:
            self._terminate = False
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
        if self._terminate:
            self._terminate = False
            return self._stop("r3_failed")
        ctx = self.context()
        if ctx.n > 1:
            return self._best_of_n(ctx)
        while True:
            review = self.review(self.policy(ctx))
            if review.accept:
                return self.commit(review)
            if review.stop:
                if self._terminate:
                    self._terminate = False
                    return self._stop("r3_failed", review.verdict)
                return self._stop("stopped", review.verdict)
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
        screen = _screen_key(st)
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
                {"action": a, "verdict": _verdict_dict(v), "rank": order.index(i)}
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


def _screen_key(st: _Step) -> str:
    """The screen a step's rejections are counted under."""
    return (st.observation.screen_key if st.observation else None) or f"step{st.idx}"


def _reseed(session: Any, echo: dict[str, Any]) -> str:
    """``session.reseed_status(echo)``; a session with only ``reseed`` (True/False) reads as
    ``rebuilt``/``untouched``."""
    try:
        status = getattr(session, "reseed_status", None)
        if callable(status):
            got = status(echo)
            return got if got in ("rebuilt", "untouched", "lost") else "untouched"
        return "rebuilt" if session.reseed(echo) else "untouched"
    except Exception as exc:  # noqa: BLE001 - a critic problem never stops the agent
        log.warning("reseed failed: %s", exc)
        return "untouched"


def _frames_match(
    a: ImageInput, b: ImageInput, platform: str | None, regions: Sequence[Sequence[int]] = ()
) -> bool:
    """Whether two screenshots show the same screen (``hivig.screens.same_screen``, with the
    platform's and the session's volatile regions masked)."""
    if not isinstance(a, (bytes, bytearray)) or not isinstance(b, (bytes, bytearray)):
        return False
    try:
        # Deferred: the image stack is only needed for frame comparisons, and a runner that
        # merely imports the guard must not load it.
        from hivig.screens import Screen, same_screen, volatile_boxes
        from hivig.vision import load_image

        boxes = volatile_boxes(platform, regions)
        return same_screen(Screen.of(load_image(bytes(a))), Screen.of(load_image(bytes(b))), boxes)
    except Exception as exc:  # noqa: BLE001 - an undecodable frame is simply not a match
        log.warning("cannot compare frames: %s", exc)
        return False


__all__ = [
    "CriticGuard",
    "Decision",
    "GuardConfig",
    "PolicyContext",
    "R3Config",
    "RecoveryLoopConfig",
    "Review",
    "default_to_action",
    "describe",
]
