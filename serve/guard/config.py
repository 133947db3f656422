"""The guard's settings: rejection and re-proposal (``GuardConfig``), R3 (``R3Config``) and
ReTrace recovery (``RecoveryLoopConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

OnExhausted = Literal["execute_last", "execute_first", "stop"]
Mode = Literal["normal", "reroute", "recovery"]

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
