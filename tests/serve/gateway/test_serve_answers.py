"""Every answer of every ``/v1`` route against its ``serve.protocol`` model, as served and as
documented in ``docs/serving.md``.

The services build these models and the routes dump them; here each real answer must validate,
name no field its model does not declare, and list its fields in the model's order (the wire
order, which stored answers replay byte for byte).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from serve import protocol
from serve.protocol import (
    CritiqueAnswer,
    ErrorAnswer,
    ImageStored,
    JobAnswer,
    ObserveAnswer,
    RankedAnswer,
    SessionClosed,
    SessionCreated,
    SessionInfo,
    VerdictAnswer,
    dump_answer,
)
from tests.fakes.gateway import (
    CLICK,
    b64,
    gateway_client,
    observe,
    screen,
    session_body,
    start_session,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "serving.md"
FAR = {"type": "left_click", "x": 5000, "y": 60}


def held(model: type[BaseModel], body: dict[str, Any]) -> None:
    """``body`` validates as ``model``, with declared fields only, in declared order."""
    model.model_validate(body)
    declared = list(model.model_fields)
    unknown = [k for k in body if k not in declared]
    assert not unknown, f"{model.__name__} does not declare {unknown}"
    assert list(body) == [k for k in declared if k in body], f"{model.__name__}: field order"
    if model is RankedAnswer:
        for verdict in body["results"]:
            held(VerdictAnswer, verdict)


def _job(c: Any, job_id: str) -> dict[str, Any]:
    for _ in range(200):
        job = c.get(f"/v1/jobs/{job_id}").json()
        if job["status"] != "pending":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never ended")


def test_every_route_answers_its_model(tmp_path):
    answers: list[tuple[type[BaseModel], dict[str, Any]]] = []
    with gateway_client(tmp_path) as c:
        r = c.post("/v1/sessions", json=session_body())
        answers.append((SessionCreated, r.json()))
        sid = r.json()["session_id"]
        again = c.post("/v1/sessions", json=session_body(session_id=sid))
        answers.append((SessionCreated, again.json()))
        answers.append((ObserveAnswer, observe(c, sid, 0).json()))
        answers.append((ObserveAnswer, observe(c, sid, 1, prev=CLICK).json()))
        forced = {"step_idx": 4, "screenshot": b64(screen(seed=4)), "prev_action": CLICK}
        gap = c.post(f"/v1/sessions/{sid}/observe", json={**forced, "force": True}).json()
        assert gap["reason"] == "history_gap"
        answers.append((ObserveAnswer, gap))
        url = f"/v1/sessions/{sid}/critique"
        one = {"step_idx": 4, "action": CLICK, "return_image": True, "return_thinking": True}
        answers.append((CritiqueAnswer, c.post(url, json=one).json()))
        answers.append((CritiqueAnswer, c.post(url, json=one).json()))  # the stored answer
        ranked = {"step_idx": 4, "candidates": [CLICK, FAR]}
        answers.append((RankedAnswer, c.post(url, json=ranked).json()))
        answers.append((SessionInfo, c.get(f"/v1/sessions/{sid}").json()))
        stateless = {
            **session_body(),
            "before": b64(screen(seed=1)),
            "after": b64(screen(seed=2)),
            "prev_action": CLICK,
        }
        answers.append((ObserveAnswer, c.post("/v1/observe", json=stateless).json()))
        critique = {**session_body(), "screenshot": b64(screen()), "action": CLICK}
        answers.append((CritiqueAnswer, c.post("/v1/critique", json=critique).json()))
        critique = {**session_body(), "screenshot": b64(screen()), "candidates": [CLICK, FAR]}
        answers.append((RankedAnswer, c.post("/v1/critique", json=critique).json()))
        upload = c.post("/v1/images", json={"image": b64(screen(seed=7))})
        answers.append((ImageStored, upload.json()))
        started = c.post("/v1/diagnose", json={"session_id": sid})
        answers.append((JobAnswer, started.json()))
        answers.append((JobAnswer, _job(c, started.json()["job_id"])))
        answers.append((SessionClosed, c.delete(f"/v1/sessions/{sid}").json()))
        answers.append((ErrorAnswer, c.get(f"/v1/sessions/{sid}/nothing").json()))
        answers.append((ErrorAnswer, c.post("/v1/sessions", json={}).json()))
    for model, body in answers:
        held(model, body)
    stateless_answers = [b for m, b in answers if m is not SessionCreated and "task" not in b]
    assert all("trace" not in b for b in stateless_answers)


def test_a_stateless_answer_has_no_session_fields(tmp_path):
    with gateway_client(tmp_path) as c:
        body = {**session_body(), "after": b64(screen())}
        observed = c.post("/v1/observe", json=body).json()
        critique = {**session_body(), "screenshot": b64(screen()), "action": CLICK}
        judged = c.post("/v1/critique", json=critique).json()
    assert "session_id" not in observed and "echo" in observed
    assert "echo" not in judged


def test_a_stored_answer_is_replayed_byte_for_byte(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        body = {"step_idx": 0, "screenshot": b64(screen())}
        first = c.post(f"/v1/sessions/{sid}/observe", json=body)
        retry = c.post(f"/v1/sessions/{sid}/observe", json=body)
        url = f"/v1/sessions/{sid}/critique"
        v1 = c.post(url, json={"step_idx": 0, "candidates": [CLICK, FAR]})
        v2 = c.post(url, json={"step_idx": 0, "candidates": [CLICK, FAR]})
    assert first.content == retry.content
    assert v1.content == v2.content


def test_dump_answer_keeps_only_the_fields_given():
    answer = SessionClosed.model_construct(
        session_id="s", closed=True, model_version="m", prompt_version="p", schema_version="1"
    )
    assert "trace" not in dump_answer(answer)
    answer.trace = "pending"
    assert list(dump_answer(answer))[-1] == "trace"


# ---------------------------------------------------------------------------------------------
# The answers docs/serving.md documents


def documented_answers() -> list[tuple[str, dict[str, Any]]]:
    """``(model name, body)`` of each answer example in the docs: a JSON block right after a
    line naming its model as ``serve.protocol.<Model>``."""
    text = DOCS.read_text(encoding="utf-8")
    found = re.findall(r"`serve\.protocol\.(\w+)`[^\n]*\n+```json\n(.*?)\n```", text, re.DOTALL)
    return [(name, json.loads(body)) for name, body in found]


def test_the_docs_document_every_answer_model():
    names = {name for name, _ in documented_answers()}
    expected = {m.__name__ for m in (ObserveAnswer, CritiqueAnswer, RankedAnswer, SessionCreated)}
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("name,body", documented_answers(), ids=lambda v: str(v)[:20])
def test_every_documented_answer_holds_to_its_model(name, body):
    held(getattr(protocol, name), body)


def test_a_critique_retry_key_keeps_its_value():
    # Stored sessions hold critique answers under this key: a retry after an upgrade must find
    # the answer the earlier version stored, so the key's value is pinned.
    from serve.protocol import Critique
    from serve.services.steps import _request_key

    req = Critique(step_idx=2, action={"raw": "click(10, 20)"}, image_ref="sha256:" + "ab" * 32)
    assert _request_key(req, "screen-1") == "cf08ba9f0eab53d8b76775db9db8ffdc"
