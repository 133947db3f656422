"""Fail-open HTTP client for the critic gateway (API v1), sync and async.

``CriticClient.start(...)`` opens a gateway session; ``Session.observe`` sends each new screen
and the action that led to it, ``Session.critique`` judges a proposed action. Nothing here raises
into the agent loop: a timeout, an HTTP error, a garbled reply or an open circuit breaker gives an
explicit result, ``Verdict(verdict="abstain", reason=...)`` or ``Observation(status="stale",
reason=...)`` with the last history kept, and the agent proceeds with its own action.

One module per concept:

- ``config``: ``ClientConfig``.
- ``results``: the result types (``Observation``, ``Verdict``, ``Ranking``, ...) and the parsers
  that read the gateway's answers into them.
- ``transport``: one call (``Call`` → ``Reply``), the circuit breaker, retries, deadlines.
- ``payloads``: request bodies (image and action fields, the session body).
- ``flows``: the request logic, written once as generators that yield ``Call`` objects and
  receive ``Reply`` objects, and the session state it keeps.
- ``sync`` / ``aio``: ``CriticClient`` / ``AsyncCriticClient`` and their sessions, which only
  drive the flows over ``httpx.Client`` / ``httpx.AsyncClient``, sleeping with ``time.sleep``
  or ``asyncio.sleep``. That is how one sequence (observe, the session lost, re-created from
  its echo, observe again) behaves the same in both.

Transport rules: connect timeout 2 s; a deadline per call that covers its retries; one retry
with jitter on transport errors, 429 (within the deadline, honouring ``Retry-After``), 502, 503
and 504; a circuit breaker opens after 5 consecutive failures for 60 s, then lets one probe
through.

Deadlines. The gateway answers an observe or a critique within its own deadline
(``critic.*_deadline_s``), degraded if the model is late. The client waits that deadline plus
``deadline_grace_s`` (2 s of network and request handling), so the gateway's degraded answer
arrives before the client gives up. The gateway's deadlines are read from ``GET /v1/info`` when
the first session is created (8 s, the gateway's default, until then); an explicit
``observe_deadline_s`` / ``critique_deadline_s`` replaces them, and the grace is still added.

The breaker is for a gateway that is down or unreachable: connect errors, 5xx, garbled replies,
and calls that got no answer although the client waited the gateway's deadline out. A timeout
the client struck before the gateway's deadline (its own deadline set shorter) says nothing about
the gateway: it neither counts nor resets the run of failures.

Importing this package pulls in ``httpx`` and nothing heavy (no pydantic, torch or numpy): it is
what the ``agent`` extra installs.
"""

from serve.client.aio import AsyncCriticClient, AsyncSession
from serve.client.config import ClientConfig
from serve.client.flows import Flow, ReseedStatus
from serve.client.payloads import ActionInput, ImageInput, action_field, image_field, json_safe
from serve.client.results import (
    History,
    Job,
    Observation,
    Ranking,
    Recovery,
    Verdict,
    abstain,
    parse_observation,
    parse_ranking,
    parse_verdict,
    rank_verdicts,
)
from serve.client.sync import CriticClient, Session
from serve.client.transport import CallFlow, CircuitBreaker

__all__ = [
    "ActionInput",
    "AsyncCriticClient",
    "AsyncSession",
    "CallFlow",
    "CircuitBreaker",
    "ClientConfig",
    "CriticClient",
    "Flow",
    "History",
    "ImageInput",
    "Job",
    "Observation",
    "Ranking",
    "Recovery",
    "ReseedStatus",
    "Session",
    "Verdict",
    "abstain",
    "action_field",
    "image_field",
    "json_safe",
    "parse_observation",
    "parse_ranking",
    "parse_verdict",
    "rank_verdicts",
]
