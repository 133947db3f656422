"""R3 inertia breaking (Reset, Reroute, Restore) as the guard's rescue strategy.

When the gateway's recurrence detector fires, the policy proposes from a fresh context (task and
current screen only), each proposal is executed and the first that changes the screen is kept.
The policy's history afterwards is the history before the loop plus the kept step; the gateway's
macro history is rebuilt the same way (the session re-seeded with the echo from before the loop,
the kept step observed again), or, when that fails, the policy is shown the pre-loop text plus
the results since (the restored text) until the gateway writes a newer history.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serve.client import ActionInput, ImageInput, Observation, Verdict
from serve.guard.config import Mode
from serve.guard.decisions import PolicyContext, Review
from serve.guard.state import StepState

if TYPE_CHECKING:
    from serve.guard.core import CriticGuard

log = logging.getLogger(__name__)

ECHOES_KEPT = 32
"""Recent echoes kept (the one from before a loop re-seeds the gateway on Restore)."""

RESTORED_RESULTS_KEPT = 8
"""After a Restore the policy sees the pre-loop history plus at most this many later results."""


@dataclass
class _Loop:
    """One reroute: the context saved at the trigger and the reroute attempts so far."""

    saved_history: list[str]
    saved_text: str
    trigger_step: int
    loop_start: int
    saved_echo: dict[str, Any] | None = None
    attempts: int = 0
    executed: list[str] = field(default_factory=list)
    executed_actions: list[ActionInput] = field(default_factory=list)

    def facts(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "trigger_step": self.trigger_step,
            "loop_start": self.loop_start,
        }


class Reroute:
    """R3 for one episode: the running reroute, the restored text and the events so far.

    Its settings are read from ``guard.config.r3`` at each call.
    """

    mode: Mode = "reroute"

    def __init__(self) -> None:
        self.loop: _Loop | None = None
        self.terminate = False
        """R3 gave up under ``on_failure: terminate``: the next decision stops the episode."""
        self.events: list[dict[str, Any]] = []
        """One entry per restore or give-up (the guard's ``r3_events``)."""
        self.echoes: dict[int, dict[str, Any]] = {}
        # The restored text: the pre-loop history text while the gateway's own still holds the
        # loop (``None`` when the policy sees the gateway's text).
        self.text_base: str | None = None
        self.text_base_version = 0
        self.since_restore: list[str] = []

    @property
    def active(self) -> bool:
        """Whether a reroute runs now."""
        return self.loop is not None

    # -- every observation ----------------------------------------------------------------

    def observed(self, guard: CriticGuard, idx: int, obs: Observation) -> None:
        """Keep the step's echo; follow the gateway's history after a Restore."""
        for old in [k for k in self.echoes if k <= idx - ECHOES_KEPT]:
            del self.echoes[old]
        if isinstance(obs.body.get("echo"), dict):
            self.echoes[idx] = obs.body["echo"]
        if self.text_base is not None and self._history_advanced(obs):
            # The gateway wrote a new history after the restored step: from here on the policy
            # sees the gateway's own text again instead of a frozen pre-loop summary.
            self.text_base, self.since_restore = None, []
            guard.events["r3_text_released"] += 1
        if self.text_base is not None and obs.ok and obs.history.last_action_result:
            # After a Restore the policy sees the restored history plus each new result.
            self.since_restore.append(
                f"Result of the last action: {obs.history.last_action_result}"
            )
            del self.since_restore[:-RESTORED_RESULTS_KEPT]

    def _history_advanced(self, obs: Observation) -> bool:
        """Whether ``obs`` brings a fresh gateway history newer than the one of the restore."""
        fresh = obs.ok and not obs.history.stale and obs.status == "ok"
        return fresh and obs.history.version > self.text_base_version

    def history_text(self, guard: CriticGuard, idx: int) -> str:
        """The macro history the policy sees at guard step ``idx`` outside a reroute."""
        if self.text_base is not None:
            return "\n".join([self.text_base, *self.since_restore]).strip()
        return guard.notes.texts.get(idx, "")

    def take_terminate(self) -> bool:
        """Whether R3 gave up and ends the episode now (the flag is cleared)."""
        terminate, self.terminate = self.terminate, False
        return terminate

    # -- the rescue -----------------------------------------------------------------------

    def critiques(self, guard: CriticGuard) -> bool:
        """Whether reroute proposals are critiqued (``r3.critique_reroutes``)."""
        return guard.config.r3.critique_reroutes

    def start(self, guard: CriticGuard, st: StepState, obs: Observation, record: dict) -> bool:
        """Begin a reroute when the gateway's recurrence detector fired."""
        if not (obs.r3_trigger and guard.config.r3.enabled):
            return False
        run = obs.recurrence.get("same_key_no_effect_run")
        run = run if isinstance(run, int) and run > 0 else 1
        run = min(run, len(guard.history))
        first = st.idx - run  # the first step of the loop
        if self.text_base is None:
            saved_text = guard.notes.texts.get(first, "")
        else:  # a loop after an earlier Restore: that history without the loop's results
            kept = self.since_restore[: max(len(self.since_restore) - run, 0)]
            saved_text = "\n".join([self.text_base, *kept]).strip()
        saved = guard.history[: len(guard.history) - run]
        self.loop = _Loop(
            saved, saved_text, st.idx, loop_start=first, saved_echo=self.echoes.get(first)
        )
        key = obs.recurrence.get("action_key")
        record["r3"] = {"event": "trigger", "loop_steps": run, "action_key": key}
        guard.events["r3_trigger"] += 1
        log.info("R3 triggered at step %s (loop of %d steps)", record["step_idx"], run)
        return True

    def check(
        self,
        guard: CriticGuard,
        st: StepState,
        obs: Observation,
        screenshot: ImageInput,
        record: dict,
    ) -> None:
        """After a reroute proposal ran: restore on a changed screen, give up after N."""
        loop = self.loop
        if loop is None or not loop.executed:
            return
        if obs.no_effect is False or not obs.ok:
            # The screen changed (or the gateway cannot tell: fail open and keep the step).
            self._restore(guard, st, loop, obs, record)
        elif loop.attempts >= guard.config.r3.reroute_attempts:
            self._failed(guard, st, loop, record)

    def context(self, guard: CriticGuard, st: StepState) -> PolicyContext:
        """Reset: task and current screen only (plus the critic's word on this screen)."""
        fb = tuple(st.feedback)
        return PolicyContext(guard.task, st.idx, st.screenshot, feedback=fb, mode="reroute")

    def rejected(
        self,
        guard: CriticGuard,
        st: StepState,
        proposal: Any,
        action: ActionInput,
        verdict: Verdict,
    ) -> Review | None:
        """A ``bad`` reroute proposal is not executed but uses one of the N attempts."""
        loop = self.loop
        if loop is None:
            return None
        loop.attempts += 1
        text = guard.feedback_text(proposal, action, verdict)
        st.feedback.append(text)
        if loop.attempts >= guard.config.r3.reroute_attempts:
            self._failed(guard, st, loop, st.record)
            if self.terminate:
                return Review(False, None, None, verdict, "stopped")
            # continue: this step is decided afresh in normal mode with the restored history.
            st.attempts.clear()
            st.feedback.clear()
        return Review(False, proposal, action, verdict, "rejected", feedback=text)

    def commit(self, guard: CriticGuard, text: str, action: ActionInput | None) -> None:
        """An executed reroute proposal: the next observation tells whether it changed the
        screen."""
        if self.loop is None:
            return
        self.loop.executed.append(text)
        self.loop.executed_actions.append(action)  # type: ignore[arg-type]
        self.loop.attempts += 1

    # -- endings --------------------------------------------------------------------------

    def _restore(
        self, guard: CriticGuard, st: StepState, loop: _Loop, obs: Observation, record: dict
    ) -> None:
        accepted = loop.executed[-1]
        guard.history = [*loop.saved_history, accepted]
        self.loop = None
        rebuilt = self._rebuild_gateway_history(guard, st, loop, record)
        if rebuilt is None:
            # The policy still gets the restored history; the gateway's keeps the loop.
            result = obs.history.last_action_result
            self.text_base = loop.saved_text
            self.text_base_version = obs.history.version
            self.since_restore = [f"Result of the last action: {result}"] if result else []
        else:
            self.text_base, self.since_restore = None, []
        event = {"event": "restored", **loop.facts(), "gateway_rebuilt": bool(rebuilt)}
        record["r3"] = event
        self.events.append({**event, "accepted": accepted})
        guard.events["r3_rerouted"] += 1

    def _rebuild_gateway_history(
        self, guard: CriticGuard, st: StepState, loop: _Loop, record: dict
    ) -> Observation | None:
        """Re-seed the session with the pre-loop echo and observe the accepted step again.

        Returns the new observation, or ``None`` when it is off or any call failed.
        """
        echo = loop.saved_echo
        if not guard.config.r3.rebuild_gateway_history or echo is None:
            return None
        start = echo.get("step_idx")
        session = guard.session
        if not isinstance(start, int) or session is None or not loop.executed_actions:
            return None
        status = _reseed(session, echo)
        if status != "rebuilt":
            # untouched: the gateway still holds the loop, numbering unchanged. lost: the
            # session was closed; the client re-creates it from its current echo (the loop
            # included) at the next call, so the numbering stays the same and nothing is
            # force-replayed across a gap.
            guard.events["r3_rebuild_failed" if status == "untouched" else "r3_rebuild_lost"] += 1
            return None
        gw = start + 1
        obs = session.observe(gw, st.screenshot, loop.executed_actions[-1])
        if not obs.ok:
            # The gateway now stands at the echo's step: number from there anyway, so the next
            # observe follows on (its screen is replayed for this step if it is missing).
            guard.events["r3_rebuild_failed"] += 1
            st.gw = gw
            guard.notes.guard_of[gw] = st.idx
            return None
        # From here on the gateway numbers steps without the loop.
        st.gw, st.observation = gw, obs
        guard.notes.note(st.idx, gw, obs)
        if isinstance(obs.body.get("echo"), dict):
            self.echoes[st.idx] = obs.body["echo"]
        record["gateway_step"] = gw
        record["observe"]["history"] = obs.history.text()
        return obs

    def _failed(self, guard: CriticGuard, st: StepState, loop: _Loop, record: dict) -> None:
        guard.history = list(loop.saved_history)
        self.text_base = loop.saved_text
        obs = st.observation
        self.text_base_version = obs.history.version if obs is not None else 0
        self.since_restore = []
        self.loop = None
        event = {"event": "failed", **loop.facts()}
        record["r3"] = event
        self.events.append(event)
        guard.events["r3_failed"] += 1
        if guard.config.r3.on_failure == "terminate":
            record["r3"]["terminate"] = True
            self.terminate = True
        else:
            # Fail open: nothing is made up for the harness; the policy's next proposal runs and
            # the log says R3 gave up here.
            record["gave_up"] = "r3_failed"
            guard.events["gave_up"] += 1
            log.info("R3 gave up at step %s; the policy's proposal runs", record["step_idx"])


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
