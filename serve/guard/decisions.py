"""What the guard hands out: the policy's context (``PolicyContext``), the ruling on one proposal
(``Review``) and the step's decision for the harness (``Decision``), with the default proposal
converters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from serve.client import ActionInput, ImageInput, Verdict
from serve.guard.config import Mode


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
