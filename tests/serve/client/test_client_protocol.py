"""The client reads the gateway's answers with the gateway's own definitions.

The answer models are the pydantic models of ``serve.protocol``; the client parses answers
without pydantic (the ``agent`` extra stays light). These tests hold the two together, through
the client's real request flows (no HTTP):

- every key the client reads from an answer is a field of that answer's model (each answer is
  handed over as a JSON object that notes the keys read from it, nested objects included);
- an answer built from its model (instance -> ``model_dump(mode="json")``) parses into the
  client's result type with the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from hivig.recovery import Recovery as GatewayRecovery
from serve.client import History, Job, Observation, Ranking, Verdict
from serve.client.config import ClientConfig
from serve.client.flows import SessionState, diagnose_request, job_request
from serve.client.transport import Deadlines, Reply, reply_of
from serve.protocol import (
    CritiqueAnswer,
    Echo,
    EchoSummary,
    ErrorAnswer,
    ErrorDetail,
    HistoryOut,
    JobAnswer,
    Marker,
    ObserveAnswer,
    RankedAnswer,
    SessionCreated,
    VerdictAnswer,
)

VERSIONS = {"model_version": "m1", "prompt_version": "p1", "schema_version": "1"}
REF = "sha256:" + "ab" * 32

# Keys the client reads that the answer models do not declare: a ranking's verdicts carry no
# ``history_version`` and a ranking no ``status``, so the client's defaults apply. Each entry
# must still be read by the client (the list cannot go stale) and stay undeclared (a field the
# model comes to declare leaves the list).
UNDECLARED = {
    ("VerdictAnswer", "history_version"),
    ("RankedAnswer", "status"),
}


class Noting(dict):
    """A JSON object that notes every key read from it, under the name of its model."""

    def __init__(self, data: dict[str, Any], reads: set[tuple[str, str]], names: dict) -> None:
        name = names.get((), "")
        super().__init__({k: _noting(v, reads, _below(names, k)) for k, v in data.items()})
        self._name, self._reads = name, reads

    def _note(self, key: Any) -> None:
        self._reads.add((self._name, key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._note(key)
        return super().pop(key, *default)


def _below(names: dict, key: str) -> dict:
    return {path[1:]: name for path, name in names.items() if path[:1] == (key,)}


def _noting(value: Any, reads: set[tuple[str, str]], names: dict) -> Any:
    if isinstance(value, dict):
        return Noting(value, reads, names)
    if isinstance(value, list):
        return [_noting(v, reads, _below(names, "[]")) for v in value]
    return value


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


# What each model's objects are called inside an answer, and the fields each may hold.
_RECOVERY = "hivig.recovery.Recovery"
FIELDS = {
    "ObserveAnswer": _fields(ObserveAnswer),
    "HistoryOut": _fields(HistoryOut),
    _RECOVERY: {f.name for f in dataclasses.fields(GatewayRecovery)},
    "CritiqueAnswer": _fields(CritiqueAnswer),
    "VerdictAnswer": _fields(VerdictAnswer),
    "Marker": _fields(Marker),
    "RankedAnswer": _fields(RankedAnswer),
    "JobAnswer": _fields(JobAnswer),
    "SessionCreated": _fields(SessionCreated),
    "Echo": _fields(Echo),
    "EchoSummary": _fields(EchoSummary),
    "ErrorAnswer": _fields(ErrorAnswer),
    "ErrorDetail": _fields(ErrorDetail),
}
NAMES = {
    "observe": {(): "ObserveAnswer", ("history",): "HistoryOut", ("recovery",): _RECOVERY},
    "critique": {(): "CritiqueAnswer", ("marker",): "Marker"},
    "ranked": {(): "RankedAnswer", ("results", "[]"): "VerdictAnswer"},
    "job": {(): "JobAnswer"},
    "created": {(): "SessionCreated"},
    "echo": {(): "Echo", ("summary",): "EchoSummary"},
    "error": {(): "ErrorAnswer", ("error",): "ErrorDetail"},
}


def drive(flow: Generator[Any, Reply, Any], *replies: Reply) -> Any:
    """Run a request flow with scripted replies, one per call it makes; returns its result."""
    try:
        next(flow)
        for reply in replies:
            flow.send(reply)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the flow made more calls than scripted")


def session(**state: Any) -> SessionState:
    cfg = ClientConfig()
    deadlines = Deadlines(cfg)
    deadlines.asked = True  # no /v1/info call: it has no answer model
    out = SessionState(cfg, {"task": "t", "action_format": "auto"}, deadlines)
    out.session_id = "s1"
    for key, value in state.items():
        setattr(out, key, value)
    return out


# ---------------------------------------------------------------------------------------------
# Answers built from the models


def history_out() -> HistoryOut:
    return HistoryOut(
        progress_summary="Opened the menu", last_action_result="ok", version=3, stale=False
    )


def echo_model() -> Echo:
    summary = EchoSummary(progress_summary="Earlier", last_action_result="done", version=2)
    return Echo(summary=summary, step_idx=4, screens={"4": REF})


def observe_answer() -> ObserveAnswer:
    recovery = GatewayRecovery(2, REF, "loop", "Go back to step 2")
    return ObserveAnswer(
        **VERSIONS,
        step_idx=5,
        status="degraded",
        reason="timeout",
        history=history_out(),
        image_ref=REF,
        change={"no_effect": True, "identical": False},
        recurrence={"r3_trigger": True, "screen_key": "k1"},
        recovery=recovery.to_dict(),
        echo=echo_model().model_dump(mode="json"),
        timing_ms={"model": 1.5, "total": 3.0},
        usage={"prompt": 10, "completion": 2},
    )


def verdict_fields(**over: Any) -> dict[str, Any]:
    fields = {
        "status": "ok",
        "verdict": "bad",
        "source": "model",
        "reason": None,
        "error_dimension": "grounding",
        "explanation": "Clicks outside the dialog.",
        "confidence": 0.75,
        "marker": Marker(x_1000=500, y_1000=250, x_px=960, y_px=270, shape="x"),
        "action_text": "click(960, 270)",
        "parse_status": "ok",
        "thinking": "The OK button is elsewhere.",
        "annotated_image": "data:image/png;base64,AAAA",
        "recurrence": {"r3_trigger": False},
    }
    return {**fields, **over}


def critique_answer() -> CritiqueAnswer:
    return CritiqueAnswer(
        **VERSIONS,
        **verdict_fields(),
        history_version=7,
        echo=echo_model().model_dump(mode="json"),
        timing_ms={"total": 4.0},
    )


def ranked_answer() -> RankedAnswer:
    results = [
        VerdictAnswer(**verdict_fields(verdict="good", confidence=0.9, error_dimension=None)),
        VerdictAnswer(**verdict_fields(verdict="abstain", reason="timeout", status="degraded")),
        VerdictAnswer(**verdict_fields(marker=None, confidence=None)),
    ]
    return RankedAnswer(
        **VERSIONS, results=results, ranking=[0, 1, 2], history_version=7, timing_ms={"total": 1.0}
    )


def dumped(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


# ---------------------------------------------------------------------------------------------
# Each answer read through the client's flows


def read_observe(body: dict[str, Any]) -> Observation:
    state = session(history=History("before", "", 1))
    return drive(state.observe_flow(5, b"png", "click(1, 2)"), Reply(200, body))


def read_critique(body: dict[str, Any]) -> Verdict:
    return drive(session().critique_flow(5, "click(1, 2)", None, None, {}), Reply(200, body))


def read_ranked(body: dict[str, Any]) -> Ranking:
    candidates = ["click(1, 2)", "click(3, 4)", "click(5, 6)"]
    return drive(session().critique_flow(5, None, candidates, None, {}), Reply(200, body))


def read_job(body: dict[str, Any]) -> Job:
    return drive(job_request(ClientConfig(), "j1").flow, Reply(200, body))


def read_created(body: dict[str, Any]) -> SessionState:
    state = session(session_id=None)
    assert drive(state.create_flow(), Reply(200, body)) is None
    return state


def read_echo(echo: dict[str, Any]) -> SessionState:
    state = session()
    created = dumped(SessionCreated(**VERSIONS, session_id="s1", created=True, echo={}))
    closed = {"session_id": "s1", "closed": True, **VERSIONS}
    assert drive(state.reseed_flow(echo), Reply(200, closed), Reply(200, created)) == "rebuilt"
    return state


def read_error(body: dict[str, Any]) -> Reply:
    response = httpx.Response(409, json={})
    response.json = lambda: body  # type: ignore[method-assign]
    return reply_of(response)


READERS = {
    "observe": (observe_answer, read_observe),
    "critique": (critique_answer, read_critique),
    "ranked": (ranked_answer, read_ranked),
    "job": (lambda: JobAnswer(**VERSIONS, job_id="j1", status="done", result={"n": 1}), read_job),
    "created": (
        lambda: SessionCreated(**VERSIONS, session_id="s2", created=True, echo={"step_idx": 1}),
        read_created,
    ),
    "echo": (echo_model, read_echo),
    "error": (
        lambda: ErrorAnswer(error=ErrorDetail(code="step_conflict", message="m")),
        read_error,
    ),
}


@pytest.mark.parametrize("kind", sorted(READERS))
def test_every_key_the_client_reads_is_a_field_of_the_answer_model(kind):
    build, read = READERS[kind]
    reads: set[tuple[str, str]] = set()
    read(Noting(dumped(build()), reads, NAMES[kind]))
    assert reads, "the client read nothing: the noting object was bypassed"
    unknown = {
        (name, key)
        for name, key in reads
        if name and key not in FIELDS[name] and (name, key) not in UNDECLARED
    }
    assert not unknown, f"the client reads keys its answer model does not declare: {unknown}"


def test_every_undeclared_key_is_still_read_by_the_client():
    reads: set[tuple[str, str]] = set()
    for kind, (build, read) in READERS.items():
        read(Noting(dumped(build()), reads, NAMES[kind]))
    assert reads >= UNDECLARED
    assert not {(name, key) for name, key in UNDECLARED if key in FIELDS[name]}


def test_a_diagnose_answer_is_a_job_answer():
    reads: set[tuple[str, str]] = set()
    body = Noting(dumped(JobAnswer(**VERSIONS, job_id="j9", status="pending")), reads, NAMES["job"])
    assert drive(diagnose_request(ClientConfig(), "/runs/x").flow, Reply(200, body)) == Job(
        "j9", "pending"
    )
    assert reads and {key for _, key in reads} <= FIELDS["JobAnswer"]


# ---------------------------------------------------------------------------------------------
# The same values on both sides


def test_an_observe_answer_parses_with_its_values():
    answer = observe_answer()
    obs = read_observe(dumped(answer))
    assert (obs.step_idx, obs.status, obs.reason, obs.image_ref) == (5, "degraded", "timeout", REF)
    assert obs.history == History(**answer.history.model_dump())
    assert obs.change == answer.change and obs.recurrence == answer.recurrence
    assert dataclasses.asdict(obs.recovery) == answer.recovery
    assert obs.ok and obs.r3_trigger and obs.no_effect and obs.screen_key == "k1"


def test_an_observe_answer_with_the_models_defaults_parses():
    answer = ObserveAnswer(
        **VERSIONS,
        step_idx=0,
        status="ok",
        history=history_out(),
        image_ref=REF,
        timing_ms={"total": 1.0},
        usage={"prompt": 0, "completion": 0},
    )
    obs = read_observe(dumped(answer))
    assert obs.change is None and obs.recurrence == {} and obs.recovery is None
    assert obs.status == "ok" and obs.reason is None and obs.no_effect is None


def _same_verdict(verdict: Verdict, answer: VerdictAnswer) -> None:
    assert verdict.verdict == answer.verdict
    assert verdict.status == answer.status and verdict.source == answer.source
    assert verdict.reason == answer.reason
    assert verdict.error_dimension == answer.error_dimension
    assert verdict.explanation == answer.explanation and verdict.thinking == answer.thinking
    assert verdict.confidence == answer.confidence
    assert verdict.marker == (answer.marker.model_dump(mode="json") if answer.marker else None)
    assert verdict.parse_status == answer.parse_status
    assert verdict.annotated_image == answer.annotated_image


def test_a_critique_answer_parses_with_its_values():
    answer = critique_answer()
    state = session()
    verdict = drive(
        state.critique_flow(5, "click(1, 2)", None, None, {}), Reply(200, dumped(answer))
    )
    _same_verdict(verdict, answer)
    assert verdict.history_version == answer.history_version and verdict.is_bad
    assert state.echo == answer.echo  # what re-creates a lost session


def test_a_ranked_answer_parses_with_its_values():
    answer = ranked_answer()
    ranking = read_ranked(dumped(answer))
    assert ranking.ranking == tuple(answer.ranking) and ranking.best == 0
    assert len(ranking.results) == len(answer.results)
    for verdict, model in zip(ranking.results, answer.results, strict=True):
        _same_verdict(verdict, model)


@pytest.mark.parametrize("status", ["pending", "done", "failed"])
def test_a_job_answer_parses_with_its_values(status):
    job = read_job(dumped(JobAnswer(**VERSIONS, job_id="j1", status=status)))
    assert (job.job_id, job.status, job.result, job.reason) == ("j1", status, None, None)


def test_a_created_session_takes_its_id_and_echo():
    answer = SessionCreated(**VERSIONS, session_id="s2", created=True, echo=dumped(echo_model()))
    state = read_created(dumped(answer))
    assert state.session_id == "s2" and state.echo == answer.echo


def test_a_reseed_takes_the_step_and_history_of_the_echo():
    echo = echo_model()
    state = read_echo(dumped(echo))
    assert state.latest_step == echo.step_idx
    assert state.history == History(**echo.summary.model_dump())


def test_an_error_answer_gives_its_code_and_message():
    answer = ErrorAnswer(error=ErrorDetail(code="unknown_session", message="no session s1"))
    reply = reply_of(httpx.Response(404, json=dumped(answer)))
    assert (reply.code, reply.message, reply.reason) == (
        "unknown_session",
        "no session s1",
        "unknown_session",
    )
