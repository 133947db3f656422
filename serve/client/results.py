"""What the client hands the agent, and how it reads the gateway's answers into it.

The result types (``History``, ``Recovery``, ``Observation``, ``Verdict``, ``Ranking``, ``Job``)
are the client's view of the gateway's answer models in ``serve.protocol`` (``HistoryOut``,
``ObserveAnswer``, ``CritiqueAnswer``/``VerdictAnswer``, ``RankedAnswer``, ``JobAnswer``). The
parsers read the same fields without pydantic, so the runner side stays light, and they are
total: a body that is not the answer gives ``None`` (the caller fails open), never an error.
A test holds every key read here to a field of its model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serve.ranking import rank


@dataclass(frozen=True)
class History:
    """The gateway's macro history of the episode (what the policy is shown)."""

    progress_summary: str = ""
    last_action_result: str = ""
    version: int = 0
    stale: bool = False

    def text(self) -> str:
        """The history as one block of prompt text (empty before the first update)."""
        parts = []
        if self.progress_summary:
            parts.append(f"Progress so far: {self.progress_summary}")
        if self.last_action_result:
            parts.append(f"Result of the last action: {self.last_action_result}")
        return "\n".join(parts)


@dataclass(frozen=True)
class Recovery:
    """A ReTrace recovery target the gateway proposes (return to an earlier intact screen)."""

    target_step: int
    target_image_ref: str
    reason: str = ""
    brief: str = ""


@dataclass(frozen=True)
class Observation:
    """The reply to ``Session.observe``; ``ok`` is False when the client failed open.

    Attributes:
        step_idx: The step observed.
        status: ``ok`` / ``degraded`` (gateway) or ``stale`` (the client failed open).
        reason: Why it is degraded or stale (``timeout``, ``circuit_open``, ``backend``, ...).
        history: The updated history; on failure the last known one, flagged ``stale``.
        image_ref: The stored screen's reference (``None`` on failure).
        change: The change detector's output (``no_effect``, ``identical``, ...), ``None`` at k=0.
        recurrence: The recurrence detector's output (``r3_trigger``, ``screen_key``, ...).
        recovery: A recovery target, when the gateway proposes one.
        body: The full reply, for logs.
    """

    step_idx: int
    status: str
    reason: str | None
    history: History
    image_ref: str | None = None
    change: dict[str, Any] | None = None
    recurrence: dict[str, Any] = field(default_factory=dict)
    recovery: Recovery | None = None
    body: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the gateway answered (``ok`` or ``degraded``)."""
        return self.status != "stale"

    @property
    def r3_trigger(self) -> bool:
        """Whether the recurrence detector asks for R3."""
        return bool(self.recurrence.get("r3_trigger"))

    @property
    def no_effect(self) -> bool | None:
        """Whether the last action changed nothing (``None`` when unknown)."""
        if not self.change or "no_effect" not in self.change:
            return None
        return bool(self.change["no_effect"])

    @property
    def screen_key(self) -> str | None:
        """The screen's fingerprint key (recurrence), else its image_ref."""
        return self.recurrence.get("screen_key") or self.image_ref


@dataclass(frozen=True)
class Verdict:
    """The critic's judgement of one proposed action.

    ``verdict`` is ``good``, ``bad`` or ``abstain``; an abstention always carries ``reason``.
    ``source`` is ``model``/``rule``/``fallback`` from the gateway, ``client`` when the client
    failed open.
    """

    verdict: str
    status: str = "ok"
    source: str = "model"
    reason: str | None = None
    error_dimension: str | None = None
    explanation: str = ""
    thinking: str | None = None
    confidence: float | None = None
    marker: dict[str, Any] | None = None
    parse_status: str = "ok"
    truncated: bool = False
    history_version: int | None = None
    annotated_image: str | None = field(default=None, repr=False)
    body: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_bad(self) -> bool:
        """True only for a definite ``bad`` (abstentions never block)."""
        return self.verdict == "bad"

    @property
    def is_good(self) -> bool:
        """True for ``good``."""
        return self.verdict == "good"

    @property
    def abstained(self) -> bool:
        """True when the critic gave no judgement."""
        return self.verdict == "abstain"


@dataclass(frozen=True)
class Ranking:
    """The reply to a critique with ``candidates``: one verdict per candidate and their order."""

    results: tuple[Verdict, ...]
    ranking: tuple[int, ...]
    status: str = "ok"
    reason: str | None = None

    @property
    def best(self) -> int | None:
        """Index of the first-ranked candidate (``None`` without candidates)."""
        return self.ranking[0] if self.ranking else None


@dataclass(frozen=True)
class Job:
    """A diagnosis job; ``status`` is ``pending``, ``done`` or ``failed``."""

    job_id: str | None
    status: str
    result: dict[str, Any] | None = None
    reason: str | None = None


def abstain(reason: str, explanation: str = "") -> Verdict:
    """The explicit fail-open verdict."""
    return Verdict(
        verdict="abstain",
        status="degraded",
        source="client",
        reason=reason,
        explanation=explanation,
        parse_status="failed",
    )


# ---------------------------------------------------------------------------------------------
# Parsing answers (garbage -> None)


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a boolean), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None


def parse_history(obj: Any, fallback: History) -> History:
    """A ``History`` from an answer's ``history`` (``HistoryOut``) or an echo's ``summary``;
    ``fallback`` when there is none (its version too, when the object has no valid one)."""
    obj = as_dict(obj)
    if not obj:
        return fallback
    version = obj.get("version")
    return History(
        progress_summary=str(obj.get("progress_summary") or ""),
        last_action_result=str(obj.get("last_action_result") or ""),
        version=version if isinstance(version, int) else fallback.version,
        stale=bool(obj.get("stale", False)),
    )


def parse_recovery(obj: Any) -> Recovery | None:
    """A ``Recovery`` from an observe answer's ``recovery``, or ``None``."""
    obj = as_dict(obj)
    step, ref = obj.get("target_step"), obj.get("target_image_ref")
    if not isinstance(step, int) or not isinstance(ref, str):
        return None
    return Recovery(step, ref, str(obj.get("reason") or ""), str(obj.get("brief") or ""))


def parse_observation(body: Any, step_idx: int, last: History) -> Observation | None:
    """An ``Observation`` from a reply body, or ``None`` when the body is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("history"), dict):
        return None
    status = body.get("status", "ok")
    if status not in ("ok", "degraded"):
        return None
    change = body.get("change")
    step = body.get("step_idx")
    return Observation(
        step_idx=step if isinstance(step, int) else step_idx,
        status=status,
        reason=_text(body, "reason"),
        history=parse_history(body["history"], last),
        image_ref=_text(body, "image_ref"),
        change=change if isinstance(change, dict) else None,
        recurrence=as_dict(body.get("recurrence")),
        recovery=parse_recovery(body.get("recovery")),
        body=body,
    )


def parse_verdict(body: Any) -> Verdict | None:
    """A ``Verdict`` from a reply body, or ``None`` when the body is not one."""
    if not isinstance(body, dict) or body.get("verdict") not in ("good", "bad", "abstain"):
        return None
    version = body.get("history_version")
    reason = _text(body, "reason")
    if body["verdict"] == "abstain" and reason is None:
        reason = "unspecified"  # abstentions are always explicit about why
    return Verdict(
        verdict=body["verdict"],
        status=str(body.get("status", "ok")),
        source=str(body.get("source", "model")),
        reason=reason,
        error_dimension=_text(body, "error_dimension"),
        explanation=str(body.get("explanation") or ""),
        thinking=_text(body, "thinking"),
        confidence=as_number(body.get("confidence")),
        marker=body.get("marker") if isinstance(body.get("marker"), dict) else None,
        parse_status=str(body.get("parse_status", "ok")),
        truncated=bool(body.get("truncated", False)),
        history_version=version if isinstance(version, int) else None,
        annotated_image=_text(body, "annotated_image"),
        body=body,
    )


def parse_ranking(body: Any, n: int) -> Ranking | None:
    """A ``Ranking`` of ``n`` candidates from a reply body, or ``None``."""
    if not isinstance(body, dict) or not isinstance(body.get("results"), list):
        return None
    results = [parse_verdict(r) for r in body["results"]]
    if len(results) != n or any(r is None for r in results):
        return None
    ranking = body.get("ranking")
    # A ranking of anything but the n indices (mixed types, bools, repeats) is discarded on
    # its own; the verdicts are still good and are ranked here instead.
    valid = (
        isinstance(ranking, list)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in ranking)
        and sorted(ranking) == list(range(n))
    )
    order = tuple(ranking) if valid else tuple(rank_verdicts(results))  # type: ignore[arg-type]
    return Ranking(tuple(results), order, status=str(body.get("status", "ok")))  # type: ignore[arg-type]


def parse_job(body: Any, job_id: str) -> Job | None:
    """A ``Job`` from a ``GET /v1/jobs/{id}`` reply body, or ``None`` when the body is not one."""
    status = as_dict(body).get("status")
    if status not in ("pending", "done", "failed"):
        return None
    result = body.get("result")
    return Job(job_id, status, result if isinstance(result, dict) else None)


def rank_verdicts(verdicts: list[Verdict] | tuple[Verdict, ...]) -> list[int]:
    """Candidate indices best first, by the gateway's own ranking (``serve.ranking.rank``)."""
    return rank([(v.verdict, v.confidence) for v in verdicts])
