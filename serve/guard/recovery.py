"""ReTrace recovery as the guard's rescue strategy.

When the gateway proposes a recovery target (an earlier intact screen), a bounded sub-loop gives
the policy the gateway's brief until the target screen is back or the budget is spent. The target
counts as reached when the gateway's image_ref matches, or when the screenshots show the same
screen (``frames_match``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from serve.client import ActionInput, ImageInput, Observation, Verdict
from serve.guard.config import Mode
from serve.guard.decisions import PolicyContext, Review
from serve.guard.state import StepState

if TYPE_CHECKING:
    from serve.guard.core import CriticGuard

log = logging.getLogger(__name__)


@dataclass
class _Target:
    """The running recovery: the target screen and the steps spent."""

    target_step: int
    target_image_ref: str
    brief: str
    steps: int = 0


class Recovery:
    """ReTrace recovery for one episode: the running target, the targets already tried, the
    outcomes and the recent screenshots the arrival test compares.

    Its settings are read from ``guard.config.recovery`` at each call.
    """

    mode: Mode = "recovery"

    def __init__(self) -> None:
        self.target: _Target | None = None
        self.tried: set[int] = set()
        """Target steps already recovered to (each is tried once per episode)."""
        self.outcomes: list[dict[str, Any]] = []
        """One entry per recovery that ended (the guard's ``recoveries``)."""
        self.screens: dict[int, ImageInput] = {}

    @property
    def active(self) -> bool:
        """Whether a recovery runs now."""
        return self.target is not None

    def keep_screen(self, guard: CriticGuard, idx: int, screenshot: ImageInput) -> None:
        """Keep the screenshot of guard step ``idx`` for later arrival tests."""
        self.screens[idx] = screenshot
        keep = guard.config.recovery.keep_screens
        for old in [k for k in self.screens if k <= idx - keep]:
            del self.screens[old]

    # -- the rescue -----------------------------------------------------------------------

    def critiques(self, guard: CriticGuard) -> bool:
        """Recovery proposals are critiqued as any other."""
        return True

    def start(self, guard: CriticGuard, st: StepState, obs: Observation, record: dict) -> bool:
        """Begin a recovery when the gateway proposes a target not tried yet."""
        rec = obs.recovery
        if rec is None or not guard.config.recovery.enabled or rec.target_step in self.tried:
            return False
        self.tried.add(rec.target_step)
        self.target = _Target(rec.target_step, rec.target_image_ref, rec.brief)
        record["recovery"] = {"event": "start", "target_step": rec.target_step}
        guard.events["recovery_start"] += 1
        return True

    def check(
        self,
        guard: CriticGuard,
        st: StepState,
        obs: Observation,
        screenshot: ImageInput,
        record: dict,
    ) -> None:
        """After a recovery step ran: end on the target screen or when the budget is spent."""
        target = self.target
        if target is None or target.steps == 0:
            return
        reached = self._same_screen(guard, obs, screenshot, target)
        if not reached and target.steps < guard.config.recovery.budget:
            return
        outcome = {"target_step": target.target_step, "reached": reached, "steps": target.steps}
        self.outcomes.append(outcome)
        record["recovery"] = {"event": "end", **outcome}
        guard.events["recovery_reached" if reached else "recovery_failed"] += 1
        self.target = None

    def context(self, guard: CriticGuard, st: StepState) -> PolicyContext:
        """The usual context with the gateway's brief, one proposal at a time."""
        brief = self.target.brief if self.target is not None else None
        return guard.history_context(st, mode="recovery", brief=brief)

    def rejected(
        self,
        guard: CriticGuard,
        st: StepState,
        proposal: Any,
        action: ActionInput,
        verdict: Verdict,
    ) -> Review | None:
        """A ``bad`` recovery proposal follows the guard's usual rule."""
        return None

    def commit(self, guard: CriticGuard, text: str, action: ActionInput | None) -> None:
        """A recovery step ran: it counts against the budget and enters the history."""
        if self.target is not None:
            self.target.steps += 1
        guard.history.append(text)

    def _same_screen(
        self, guard: CriticGuard, obs: Observation, screenshot: ImageInput, target: _Target
    ) -> bool:
        """Whether the screen is the recovery target (ReTrace's arrival test, by fingerprint)."""
        if obs.image_ref is not None and obs.image_ref == target.target_image_ref:
            return True
        # Different references only mean different bytes: a ticking clock changes them, so the
        # frames themselves are judged.
        step = guard.notes.guard_of.get(target.target_step, target.target_step)
        shot = self.screens.get(step)
        if shot is None:
            return False
        regions = guard.session_kwargs.get("volatile_regions") or ()
        return shot == screenshot or frames_match(shot, screenshot, guard.platform, regions)


def frames_match(
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
