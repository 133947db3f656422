"""The gateway against clumsy and hostile clients and a misbehaving backend, each fault provoked:
a stalled server, conflicting retries, gaps, absurd coordinates, leaky messages and paths."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.critic import QueueGate
from serve.metrics import Metrics
from tests.fakes.gateway import (
    CLICK,
    GOOD,
    SUMMARY,
    LiveServer,
    ScriptedBackend,
    b64,
    gateway_client,
    observe,
    screen,
    serve_config,
    session_body,
    start_session,
)
from tests.fakes.openai_server import Reply, ScriptedServer, request_text


def _code(r) -> str:
    return r.json()["error"]["code"]


# ---------------------------------------------------------------------------------------------
# A stalled backend


def test_a_stalled_remote_backend_frees_its_queue_places_at_the_deadline(tmp_path):
    stalled = threading.Event()
    stalled.set()

    def answer(body):
        delay = 20.0 if stalled.is_set() else 0.0
        text = GOOD if "Current Proposed Step" in request_text(body) else SUMMARY
        return Reply(content=text, delay_s=delay)

    with ScriptedServer(respond=answer, lifetime_s=60) as server:
        cfg = serve_config(
            tmp_path / "state",
            "backend.kind=openai",
            f"backend.base_url={server.base_url}",
            "backend.model=scripted",
            "backend.timeout_s=30",
            "limits.max_queue=2",
            "critic.observe_deadline_s=0.4",
            "critic.critique_deadline_s=0.4",
        )
        with TestClient(create_app(cfg)) as c:
            sid = start_session(c)
            assert observe(c, sid, 0).status_code == 200
            start = time.monotonic()
            # More stalled calls than queue places, one after the other: each gives its place
            # back at its deadline (before: held for backend.timeout_s, then 429 for everyone).
            for _ in range(4):
                r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
                assert r.status_code == 200, r.text
                assert r.json()["verdict"] == "abstain" and r.json()["reason"] == "timeout"
            assert time.monotonic() - start < 8
            stalled.clear()  # the backend recovers: the next call gets a real verdict at once
            r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
            assert r.json()["verdict"] == "good" and r.json()["source"] == "model"


def test_retry_after_says_when_the_first_place_frees():
    gate = QueueGate(limit=1, retry_after_s=1, metrics=Metrics())
    ticket = gate.enter(8.0)
    with pytest.raises(Exception) as refused:
        gate.check(1)
    assert refused.value.status == 429
    assert 7 <= int(refused.value.headers["Retry-After"]) <= 8
    gate.leave(ticket)
    gate.leave(ticket)  # a second release of one place is a no-op
    assert gate.depth == 0 and gate.retry_after() == 1
    # Once calls are seen to take about a second, a refusal predicts that, not the deadline.
    gate = QueueGate(limit=1, retry_after_s=1, metrics=Metrics())
    for _ in range(3):
        gate.leave(gate.enter(30.0))
    gate.enter(30.0)
    assert gate.retry_after() == 1


def test_readiness_goes_red_while_the_backend_fails_and_heals(tmp_path):
    backend = ScriptedBackend(mode="fail")
    with gateway_client(tmp_path, backend) as c:
        assert c.get("/readyz").status_code == 200
        sid = start_session(c)
        for k in range(3):
            obs = observe(c, sid, k, prev=CLICK if k else None)
            assert obs.status_code == 200
            c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": k, "action": CLICK})
        r = c.get("/readyz")
        assert r.status_code == 503 and "backend failing" in r.json()["detail"]
        backend.mode = "ok"  # one answered call is enough
        c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 2, "action": CLICK})
        assert c.get("/readyz").status_code == 200
        backend.mode = "fail"
        for x in range(3):  # other actions: the good verdict above is filed for CLICK
            action = {**CLICK, "x": 10 + x}
            c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 2, "action": action})
        assert c.get("/readyz").status_code == 503
        c.app.state.gateway.critic.health.cooldown_s = 0.0  # time passes: half-open again
        assert c.get("/readyz").status_code == 200


# ---------------------------------------------------------------------------------------------
# Conflicting retries and gaps


def test_a_retry_with_another_screenshot_is_a_conflict_not_silently_dropped(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        first = observe(c, sid, 0, screenshot=b64(screen(seed=1)))
        again = observe(c, sid, 0, screenshot=b64(screen(seed=1)))
        assert again.status_code == 200 and again.json() == first.json()
        other = observe(c, sid, 0, screenshot=b64(screen(seed=2)))
        assert (other.status_code, _code(other)) == (409, "step_conflict")
        assert "force" in other.json()["error"]["message"]
        assert observe(c, sid, 1, prev=CLICK).status_code == 200
        moved = observe(c, sid, 1, prev={**CLICK, "x": 81})
        assert (moved.status_code, _code(moved)) == (409, "step_conflict")


def test_two_concurrent_observes_of_one_step_with_different_screens(tmp_path):
    app = create_app(serve_config(tmp_path / "state"), ScriptedBackend(delay_s=0.2))
    with LiveServer(app) as server:
        sid = httpx.post(f"{server.url}/v1/sessions", json=session_body()).json()["session_id"]
        statuses: list[int] = []

        def send(seed: int) -> None:
            body = {"step_idx": 0, "screenshot": b64(screen(seed=seed))}
            r = httpx.post(f"{server.url}/v1/sessions/{sid}/observe", json=body, timeout=10)
            statuses.append(r.status_code)

        threads = [threading.Thread(target=send, args=(seed,)) for seed in (3, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(statuses) == [200, 409]


def test_a_forced_observe_across_a_gap_says_the_history_is_stale(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        assert observe(c, sid, 0).status_code == 200
        body = {"step_idx": 5, "screenshot": b64(screen(seed=5)), "prev_action": CLICK}
        r = c.post(f"/v1/sessions/{sid}/observe", json={**body, "force": True})
        assert r.status_code == 200
        out = r.json()
        assert out["status"] == "degraded" and out["reason"] == "history_gap"
        assert out["history"]["stale"] is True and out["echo"]["summary"]["stale"] is True
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 5


# ---------------------------------------------------------------------------------------------
# Absurd coordinates


@pytest.mark.parametrize(
    "action",
    [
        {"type": "left_click", "x": 1e9, "y": 5},
        {"type": "left_click", "x": -1e12, "y": 5},
        {"type": "left_click_drag", "x": 5, "y": 5, "x2": 4e9, "y2": 5},
        {
            "raw": '<tool_call>\n{"name": "computer_use", "arguments": '
            '{"action": "left_click", "coordinate": [1e9, 5]}}\n</tool_call>'
        },
    ],
)
def test_a_coordinate_far_off_any_screen_is_answered_by_the_rule(tmp_path, action):
    backend = ScriptedBackend()
    with gateway_client(tmp_path, backend) as c:
        sid = start_session(c)
        observe(c, sid, 0)
        calls = len(backend.calls)
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": action}).json()
    assert (v["verdict"], v["source"], v["reason"]) == ("bad", "rule", "out_of_frame")
    assert len(backend.calls) == calls  # the model never saw it


@pytest.mark.parametrize("bad", [True, "50", None, [1, 2]])
def test_a_typed_coordinate_that_is_not_a_number_is_the_clients_mistake(tmp_path, bad):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        observe(c, sid, 0)
        action = {"type": "left_click", "x": bad, "y": 5}
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": action})
    assert (r.status_code, _code(r)) == (422, "bad_action")


# ---------------------------------------------------------------------------------------------
# What answers disclose


def test_a_bad_image_message_shows_no_memory_address(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        r = observe(c, sid, 0, screenshot=b64(b"\x89PNG\r\n\x1a\n not really"))
    assert (r.status_code, _code(r)) == (400, "bad_image")
    assert " at 0x" not in r.json()["error"]["message"]
    assert "BytesIO" not in r.json()["error"]["message"]


def _diagnosis_of(c, sid: str) -> dict:
    """Start a diagnosis of ``sid`` and wait for its job to finish."""
    job_id = c.post("/v1/diagnose", json={"session_id": sid}).json()["job_id"]
    for _ in range(200):
        job = c.get(f"/v1/jobs/{job_id}").json()
        if job["status"] != "pending":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def test_a_job_shows_no_absolute_server_path(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        observe(c, sid, 0)
        for k in range(1, 3):
            observe(c, sid, k, prev=CLICK, screenshot=b64(screen(seed=0)))
        job = _diagnosis_of(c, sid)
        job_id = job["job_id"]
    assert job["status"] == "done", job
    text = str(job)
    assert str(tmp_path) not in text
    assert job["input"] == f"traces/{sid}.jsonl"
    assert job["html"] == f"diagnoses/{job_id}/diagnosis.html"


def test_an_expired_session_reads_closed_before_the_sweep(tmp_path):
    with gateway_client(tmp_path, None, "sessions.ttl_s=0.05") as c:
        sid = start_session(c)
        time.sleep(0.1)
        assert c.get(f"/v1/sessions/{sid}").json()["closed"] is True


# ---------------------------------------------------------------------------------------------
# Image work


def _flat_png(w: int, h: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, "PNG")  # tens of KB, megapixels to decode
    return b64(buf.getvalue())


def test_a_huge_but_tiny_png_is_refused_before_it_is_decoded(tmp_path):
    huge = _flat_png(6300, 6300)  # 39.7 MP in about 130 KB (making it takes most of a second)
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        start = time.perf_counter()
        r = observe(c, sid, 0, screenshot=huge)
        took = time.perf_counter() - start
    assert (r.status_code, _code(r)) == (400, "bad_image") and "6300x6300" in r.text
    assert took < 1.0, took  # the header is read, the pixels never


def test_large_screenshots_cannot_starve_an_ordinary_one(tmp_path):
    # Screens over 4 MP go through one lane: twelve 16.7 MP uploads (up to a second of decoding
    # each) hold at most one image thread, and an ordinary screenshot is served meanwhile.
    cfg = serve_config(tmp_path / "state", "limits.large_image_pixels=4000000")
    big = _flat_png(4096, 4096)
    with LiveServer(create_app(cfg, ScriptedBackend())) as server:
        sids = [
            httpx.post(f"{server.url}/v1/sessions", json=session_body()).json()["session_id"]
            for _ in range(13)
        ]
        statuses: list[int] = []

        def upload(sid: str) -> None:
            body = {"step_idx": 0, "screenshot": big}
            r = httpx.post(f"{server.url}/v1/sessions/{sid}/observe", json=body, timeout=30)
            statuses.append(r.status_code)

        threads = [threading.Thread(target=upload, args=(s,)) for s in sids[:12]]
        for t in threads:
            t.start()
        time.sleep(0.2)
        start = time.perf_counter()
        small = {"step_idx": 0, "screenshot": b64(screen(seed=9))}
        r = httpx.post(f"{server.url}/v1/sessions/{sids[12]}/observe", json=small, timeout=30)
        took = time.perf_counter() - start
        for t in threads:
            t.join()
    assert r.status_code == 200
    assert took < 0.6, f"an ordinary observe waited {took:.2f} s behind large screenshots"
    # Large ones wait for the lane up to the observe deadline (1 s here), then 429.
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 429}, statuses


def test_a_screenshot_that_cannot_be_written_is_served_from_memory(tmp_path, monkeypatch):
    import serve.images

    def refuse(path, data, **kw):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(serve.images, "write_atomic", refuse)
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        first = observe(c, sid, 0)
        assert first.status_code == 200, first.text
        ref = first.json()["image_ref"]
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
        assert v.status_code == 200 and v.json()["verdict"] == "good"
        again = c.post(
            f"/v1/sessions/{sid}/observe",
            json={"step_idx": 1, "image_ref": ref, "prev_action": CLICK},
        )
        assert again.status_code == 200, again.text
        assert c.app.state.gateway.images.write_errors >= 1


def test_a_job_through_a_symlinked_state_folder_shows_no_server_path(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with gateway_client(tmp_path, None, name="link/state") as c:
        sid = start_session(c)
        observe(c, sid, 0)
        observe(c, sid, 1, prev=CLICK, screenshot=b64(screen(seed=0)))
        job = _diagnosis_of(c, sid)
    assert str(tmp_path) not in str(job), job
    assert job["input"] == f"traces/{sid}.jsonl"


def test_a_path_with_a_control_character_is_a_bad_request(tmp_path):
    with gateway_client(tmp_path) as c:
        r = c.post("/v1/diagnose", json={"path": "/tmp/\u0000x"})
        assert (r.status_code, _code(r)) == (422, "bad_request")
        r = c.post("/v1/sessions", json=session_body(session_id=".."))
        assert (r.status_code, _code(r)) == (422, "bad_request")


def test_the_history_object_of_an_answer_is_a_previous_summary(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        history = observe(c, sid, 0).json()["history"]
        body = {**session_body(), "previous_summary": history, "after": b64(screen(seed=3))}
        r = c.post("/v1/observe", json=body)
        assert r.status_code == 200, r.text


def test_readiness_is_red_while_every_queue_place_is_held_by_a_hung_model(tmp_path):
    backend = ScriptedBackend(mode="slow")  # in process: the places stay held past the deadline
    overrides = ("limits.max_queue=2", "critic.critique_deadline_s=0.2")
    with gateway_client(tmp_path, backend, *overrides) as c:
        sid = start_session(c)
        observe(c, sid, 0)
        for x in range(2):
            action = {**CLICK, "x": 10 + x}
            v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": action})
            assert v.json()["reason"] == "timeout"
        r = c.get("/readyz")
        assert r.status_code == 503 and "past its deadline" in r.json()["detail"]


def test_an_over_limit_screenshot_is_refused_without_waiting_for_the_large_lane(tmp_path):
    import asyncio

    from hivig.config import FrameConfig
    from serve.errors import ApiError
    from serve.images import ImageStore

    store = ImageStore(
        tmp_path, FrameConfig(), max_bytes=10**8, max_pixels=10_000, large_pixels=5_000
    )

    async def main() -> ApiError:
        await store._large_lanes.acquire()  # the lane is busy
        try:
            await store.put_inline(_flat_png(200, 200), wait_s=5.0)
        except ApiError as e:
            return e
        raise AssertionError("an over-limit screenshot was accepted")

    start = time.perf_counter()
    error = asyncio.run(main())
    assert (error.status, error.code) == (400, "bad_image")
    assert time.perf_counter() - start < 2.0
    store.close()
