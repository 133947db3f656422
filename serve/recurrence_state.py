"""The gateway's side of the recurrence detector: per-session state in, signals out.

The detector itself is pure (``hivig.recurrence``); its state lives in the session document, so
a restarted gateway keeps counting where it stopped. Every observe updates it; the critique of
the same step reads the latest signals (and their one-line note for the prompt).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from PIL import Image

from hivig.actions import Action
from hivig.recurrence import (
    DetectorConfig,
    DetectorState,
    Signals,
    new_state,
    recurrence_note,
    update,
)
from serve.sessions import SessionState

_EMPTY_RECURRENCE = {
    "same_key_no_effect_run": 0,
    "cycle_len": None,
    "screen_revisits": 0,
    "r3_trigger": False,
    "action_key": None,
    "screen_key": None,
}


class Detector:
    """Runs ``hivig.recurrence.update`` on a session's state.

    The state a step produced is kept in memory next to its JSON, so the next step of the same
    session skips the decode (the session document stays the only truth: a state is reused only
    while the document holds exactly the JSON it was saved as).
    """

    def __init__(self, config: DetectorConfig | None = None, cache_size: int = 1024) -> None:
        """Thresholds from ``config`` (the defaults otherwise); decoded states of up to
        ``cache_size`` recent sessions kept."""
        self.config = config or DetectorConfig()
        self._cache: OrderedDict[str, tuple[str, DetectorState]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # updates run on the image threads

    def _state(self, session: SessionState) -> DetectorState:
        if not session.detector:
            return new_state(session.platform, [tuple(r) for r in session.volatile_regions])
        with self._lock:
            hit = self._cache.get(session.session_id)
        if hit is not None and hit[0] == session.detector:
            return hit[1]
        return DetectorState.from_json(session.detector)

    def _keep(self, session_id: str, text: str, state: DetectorState) -> None:
        if self._cache_size <= 0:
            return
        with self._lock:
            self._cache[session_id] = (text, state)
            self._cache.move_to_end(session_id)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def update(
        self, session: SessionState, frame: Image.Image, actions: Sequence[Action | str] | None
    ) -> Signals:
        """Judge the step's new screen; the session keeps the new state and signals."""
        state, signals = update(self._state(session), frame, actions, self.config)
        session.detector = state.to_json()
        self._keep(session.session_id, session.detector, state)
        session.signals = {
            "change": signals.change,
            "recurrence": signals.recurrence,
            "note": recurrence_note(signals),
        }
        return signals

    def reset(self, session: SessionState) -> None:
        """Forget detector state (stateless requests carry none)."""
        session.detector = None
        session.signals = None

    def note(self, session: SessionState) -> str | None:
        """The latest note for the critique prompt, if a repeat or cycle is flagged."""
        return (session.signals or {}).get("note")

    def last_recurrence(self, session: SessionState) -> dict[str, Any]:
        """The latest ``recurrence`` object (all zero before the first observe)."""
        return (session.signals or {}).get("recurrence") or dict(_EMPTY_RECURRENCE)


def fired(signals: Signals) -> list[str]:
    """Names of the detector signals that fired, for metrics."""
    rec, change = signals.recurrence, signals.change or {}
    out = []
    if change.get("no_effect"):
        out.append("no_effect")
    if rec.get("r3_trigger"):
        out.append("r3_trigger")
    if rec.get("cycle_len"):
        out.append("cycle")
    return out
