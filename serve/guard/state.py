"""The guard's state that its rescues share: the step being decided (``StepState``), what the
gateway said per step (``GatewayNotes``), and the interface a rescue strategy offers the guard
(``Rescue``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from serve.client import ActionInput, ImageInput, Observation, Verdict
from serve.guard.config import Mode
from serve.guard.decisions import PolicyContext, Review

if TYPE_CHECKING:
    from serve.guard.core import CriticGuard


@dataclass
class StepState:
    """State of the step being decided."""

    idx: int
    screenshot: ImageInput | None
    observation: Observation | None
    gw: int = 0
    """The gateway's step index (differs from ``idx`` after a rebuilt Restore)."""
    attempts: list[tuple[Any, ActionInput, Verdict | None]] = field(default_factory=list)
    feedback: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def screen_key(self) -> str:
        """The screen this step's rejections are counted under."""
        obs = self.observation
        return (obs.screen_key if obs else None) or f"step{self.idx}"


@dataclass
class GatewayNotes:
    """What the gateway said per guard step, kept for the policy's context and the rescues."""

    texts: dict[int, str] = field(default_factory=dict)
    """The macro history text observed at each guard step."""
    guard_of: dict[int, int] = field(default_factory=dict)
    """Gateway step -> guard step (they differ after a rebuilt Restore)."""

    def note(self, idx: int, gw: int, obs: Observation) -> None:
        """Record ``obs``, the gateway's answer at its step ``gw``, as guard step ``idx``."""
        self.guard_of[gw] = idx
        self.texts[idx] = obs.history.text()


class Rescue(Protocol):
    """A loop-level rescue (R3, recovery) as the guard sees it.

    The guard calls it at fixed points: ``start`` after an observation while no rescue runs,
    ``check`` after an observation while it runs, and, while it runs, ``context`` for the
    policy's context, ``rejected`` when a proposal is judged ``bad`` and ``commit`` when one is
    executed. A rescue owns its state; the guard builds fresh ones for every episode.
    """

    mode: Mode
    """The guard's mode while this rescue runs."""

    @property
    def active(self) -> bool:
        """Whether the rescue runs now."""
        ...

    def critiques(self, guard: CriticGuard) -> bool:
        """Whether proposals are critiqued while the rescue runs."""
        ...

    def start(self, guard: CriticGuard, st: StepState, obs: Observation, record: dict) -> bool:
        """Begin on ``obs`` when it calls for this rescue; whether it began."""
        ...

    def check(
        self,
        guard: CriticGuard,
        st: StepState,
        obs: Observation,
        screenshot: ImageInput,
        record: dict,
    ) -> None:
        """After a step of the rescue ran: end it when it succeeded or is spent."""
        ...

    def context(self, guard: CriticGuard, st: StepState) -> PolicyContext:
        """The policy's context while the rescue runs."""
        ...

    def rejected(
        self,
        guard: CriticGuard,
        st: StepState,
        proposal: Any,
        action: ActionInput,
        verdict: Verdict,
    ) -> Review | None:
        """The ruling on a ``bad`` proposal, or ``None`` for the guard's usual rule."""
        ...

    def commit(self, guard: CriticGuard, text: str, action: ActionInput | None) -> None:
        """Note an executed proposal (``text`` as the policy's history would list it)."""
        ...


def verdict_dict(v: Verdict | None) -> dict[str, Any] | None:
    """A verdict as the guard's log records it."""
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
