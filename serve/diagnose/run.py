"""The loaded form of a run to diagnose: one format for traces, result folders and trajectories.

Loaders turn every input into a ``Run`` of ``RunStep``; signals, inspection and the report only
read this form. Steps are numbered 1.. in execution order (``RunStep.step``, as CUADebug counts);
``source_ref`` says where each step came from in its source (line, ``step_num``, ``step_idx``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import Action


@dataclass(frozen=True)
class Skipped:
    """An input line or item that was not used, and why.

    Attributes:
        where: ``file:line`` (or another position) of the item.
        reason: Short stable code (``bad_json``, ``not_an_object``, ``error_line``, ...).
        detail: Human-readable detail.
    """

    where: str
    reason: str
    detail: str

    def to_json(self) -> dict[str, str]:
        """JSON form."""
        return {"where": self.where, "reason": self.reason, "detail": self.detail}


@dataclass
class Verdict:
    """The critic's verdict on a step as the gateway recorded it (trace input only).

    Attributes:
        verdict: ``good``, ``bad`` or ``abstain``.
        source: ``model``, ``rule`` or ``fallback``.
        dimension: The error dimension name, or ``None``.
        explanation: The explanation text.
        confidence: Verdict confidence, when logprobs were enabled.
    """

    verdict: str
    source: str
    dimension: str | None
    explanation: str
    confidence: float | None


@dataclass
class RunStep:
    """One executed (or final proposed) action with its screens and recorded signals.

    Attributes:
        step: 1-based position in the run.
        source_ref: Where the step came from in its source.
        raw: The action text exactly as recorded.
        actions: The typed actions, or ``None`` when the text could not be parsed.
        parse_error: Why the text could not be parsed (``reason: message``), else ``None``.
        intent: The verbal intent, when the source has one.
        think: The agent's reasoning or response text, when recorded.
        before: Screenshot the agent saw before acting, when available.
        after: Screenshot after the action, when available.
        verdict: The critic's recorded verdict (traces only).
        last_action_result: The history model's ``Last Action Result`` after this step.
        progress_summary: The history model's ``Progress Summary`` after this step.
        recorded_change: The gateway's ``change`` object for this step, when recorded.
        reward: The runner's reward after this step (OSWorld), when recorded.
        error: An execution error the runner recorded for this step.
        executed: ``False`` when the step was proposed but it is unknown whether it ran.
    """

    step: int
    source_ref: str
    raw: str
    actions: list[Action] | None
    parse_error: str | None = None
    intent: str | None = None
    think: str | None = None
    before: Path | None = None
    after: Path | None = None
    verdict: Verdict | None = None
    last_action_result: str | None = None
    progress_summary: str | None = None
    recorded_change: dict[str, Any] | None = None
    reward: float | None = None
    error: str | None = None
    executed: bool = True


@dataclass
class Run:
    """A run to diagnose.

    Attributes:
        kind: ``trace``, ``osworld``, ``trajectories``, ``windowsagentarena``, ``androidlab``
            or ``webarena``.
        source: The input path.
        task: The instruction (``None`` when the source does not record it).
        platform: One of ``hivig.actions.PLATFORMS``.
        screen: ``(width, height)`` of the screen in pixels.
        steps: The steps, 1.. in order.
        outcome: ``success``, ``failure`` or ``unknown``.
        score: The runner's final score (``result.txt``, a benchmark metric), when recorded.
        skipped: Lines or items that were not used, with reasons.
        notes: Facts about the input worth stating in the result (missing screenshots, ...).
        volatile_regions: The session's own volatile boxes on the 0–1000 grid (a gateway trace
            records them), masked beside the platform's.
    """

    kind: str
    source: Path
    task: str | None
    platform: str
    screen: tuple[int, int]
    steps: list[RunStep]
    outcome: str = "unknown"
    score: float | None = None
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    volatile_regions: list[list[int]] = field(default_factory=list)
