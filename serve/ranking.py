"""The one ranking of candidate verdicts, shared by the gateway's answer and the client's fallback.

Kept free of heavy imports: the runner's client (the ``agent`` extra) uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence

VERDICT_ORDER = {"good": 0, "abstain": 1, "bad": 2}

# A verdict with no confidence is ranked as an even call among its peers.
UNKNOWN_CONFIDENCE = 0.5


def rank(verdicts: Sequence[tuple[str, float | None]]) -> list[int]:
    """Candidate indices best first, given ``(verdict, confidence)`` per candidate.

    Good before abstain before bad. A more confident good ranks higher; among bads the least
    confident is the least bad, so it ranks higher. Ties keep the candidates' order.
    """

    def key(i: int) -> tuple[int, float, int]:
        verdict, confidence = verdicts[i]
        conf = UNKNOWN_CONFIDENCE if confidence is None else confidence
        return (VERDICT_ORDER[verdict], conf if verdict == "bad" else -conf, i)

    return sorted(range(len(verdicts)), key=key)
