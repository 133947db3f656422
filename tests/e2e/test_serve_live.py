"""The gateway as runners meet it: a real uvicorn server on loopback, the tiny checkpoint, load.

Every loop here is bounded in count and time and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import resource
import threading
import time

import httpx
import pytest

from serve.app import create_app
from tests.fakes.gateway import (
    CLICK,
    LiveServer,
    ScriptedBackend,
    b64,
    screen,
    serve_config,
    session_body,
)


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_checkpoint):
    return tiny_checkpoint


def _session(client: httpx.Client) -> str:
    r = client.post("/v1/sessions", json=session_body())
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def test_tiny_checkpoint_over_real_http(tmp_path, tiny_ckpt):
    """The transformers backend built in the lifespan from ``model=DIR``, driven over HTTP."""
    cfg = serve_config(
        tmp_path / "state",
        f"model={tiny_ckpt}",
        "backend.kind=transformers",
        "critic.history_max_tokens=24",
        "critic.critique_max_tokens=24",
        "critic.observe_deadline_s=60",
        "critic.critique_deadline_s=60",
    )
    with LiveServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=120) as c:
        info = c.get("/v1/info").json()
        # The frame comes from the checkpoint's processor, as training saved it.
        assert info["frame"]["max_pixels"] == 65_536 and info["backend"] == "transformers"
        sid = _session(c)
        assert (
            c.post(
                f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(screen())}
            ).status_code
            == 200
        )
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK}).json()
        # Random weights: the answer never follows the contract, so the critic abstains, openly.
        assert v["verdict"] in ("good", "bad", "abstain")
        if v["verdict"] == "abstain":
            assert v["status"] == "degraded" and v["reason"] in ("parse", "truncated")
        assert v["usage"]["prompt"] > 100 and v["usage"]["completion"] > 0
        obs = c.post(
            f"/v1/sessions/{sid}/observe",
            json={"step_idx": 1, "screenshot": b64(screen(seed=1)), "prev_action": CLICK},
        ).json()
        assert obs["history"]["version"] in (0, 1) and "echo" in obs
        far = {"type": "left_click", "x": 300, "y": 190}
        ranked = c.post(
            f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "candidates": [CLICK, far]}
        ).json()
        assert len(ranked["results"]) == 2 and sorted(ranked["ranking"]) == [0, 1]
        stateless = c.post(
            "/v1/critique",
            json={
                **session_body(),
                "trajectory": [CLICK],
                "screenshot": b64(screen(seed=2)),
                "action": far,
            },
        )
        assert stateless.status_code == 200 and stateless.json()["verdict"] in (
            "good",
            "bad",
            "abstain",
        )
        assert "hivig_parse_total" in c.get("/metrics").text


def test_restart_mid_session_loses_nothing(tmp_path):
    cfg = serve_config(tmp_path / "state")
    with LiveServer(create_app(cfg, ScriptedBackend())) as srv, httpx.Client(base_url=srv.url) as c:
        sid = _session(c)
        c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(screen())})
        step1 = c.post(
            f"/v1/sessions/{sid}/observe",
            json={"step_idx": 1, "screenshot": b64(screen(seed=1)), "prev_action": CLICK},
        ).json()
        port = srv.port
    backend = ScriptedBackend()
    with (
        LiveServer(create_app(cfg, backend), port=port) as srv,
        httpx.Client(base_url=srv.url) as c,
    ):
        got = c.get(f"/v1/sessions/{sid}").json()
        assert got["echo"]["summary"] == step1["history"] and got["step_idx"] == 1
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK}).json()
        assert v["status"] == "ok"
        step2 = c.post(
            f"/v1/sessions/{sid}/observe",
            json={"step_idx": 2, "screenshot": b64(screen(seed=2)), "prev_action": CLICK},
        ).json()
        assert step2["history"]["version"] == 2
    trace = [json.loads(x) for x in (tmp_path / "state" / "traces" / f"{sid}.jsonl").open()]
    assert [e["event"] for e in trace] == ["session", "observe", "observe", "critique", "observe"]


def test_graceful_shutdown_finishes_in_flight_requests(tmp_path):
    cfg = serve_config(tmp_path / "state", "critic.critique_deadline_s=5")
    backend = ScriptedBackend(delay_s=1.0)
    srv = LiveServer(create_app(cfg, backend)).__enter__()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        sid = _session(c)
        c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(screen())})
        out: dict = {}

        def call() -> None:
            out["r"] = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.4)  # the request is inside the backend now
        srv.stop()
        t.join(timeout=30)
    assert out["r"].status_code == 200 and out["r"].json()["verdict"] == "good"


def test_a_full_queue_answers_429_with_retry_after(tmp_path):
    cfg = serve_config(
        tmp_path / "state",
        "limits.max_queue=2",
        "limits.retry_after_s=3",
        "critic.critique_deadline_s=5",
    )
    with LiveServer(create_app(cfg, ScriptedBackend(delay_s=0.5))) as srv:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                sids = []
                for _ in range(6):
                    sid = (await c.post("/v1/sessions", json=session_body())).json()["session_id"]
                    await c.post(
                        f"/v1/sessions/{sid}/observe",
                        json={"step_idx": 0, "screenshot": b64(screen())},
                    )
                    sids.append(sid)
                return await asyncio.gather(
                    *(
                        c.post(f"/v1/sessions/{s}/critique", json={"step_idx": 0, "action": CLICK})
                        for s in sids
                    )
                )

        responses = asyncio.run(burst())
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) == 2 and codes.count(429) == 4, codes
    refused = next(r for r in responses if r.status_code == 429)
    # When the first place frees: no call has finished yet, so its deadline (5 s), never below
    # limits.retry_after_s.
    assert 3 <= int(refused.headers["Retry-After"]) <= 5
    assert refused.json()["error"]["code"] == "overloaded"


def test_load_32_sessions_by_20_steps(tmp_path):
    """32 concurrent sessions x 20 steps on a zero-latency backend: no errors, bounded memory,
    every trace complete."""
    sessions, steps = 32, 20
    cfg = serve_config(tmp_path / "state", "limits.max_queue=256")
    shots = [b64(screen(seed=i)) for i in range(steps + 1)]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with LiveServer(create_app(cfg, ScriptedBackend())) as srv:

        async def episode(c: httpx.AsyncClient) -> int:
            errors = 0
            sid = (await c.post("/v1/sessions", json=session_body())).json()["session_id"]
            for k in range(steps):
                body = {"step_idx": k, "screenshot": shots[k]}
                if k:
                    body["prev_action"] = CLICK
                r1 = await c.post(f"/v1/sessions/{sid}/observe", json=body)
                r2 = await c.post(
                    f"/v1/sessions/{sid}/critique", json={"step_idx": k, "action": CLICK}
                )
                errors += (r1.status_code != 200) + (r2.status_code != 200)
            errors += (await c.delete(f"/v1/sessions/{sid}")).status_code != 200
            return errors

        async def main() -> list[int]:
            limits = httpx.Limits(max_connections=sessions)
            async with httpx.AsyncClient(base_url=srv.url, timeout=60, limits=limits) as c:
                return await asyncio.wait_for(
                    asyncio.gather(*(episode(c) for _ in range(sessions))), 240
                )

        start = time.perf_counter()
        errors = asyncio.run(main())
        took = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    growth_mb = peak_mb - rss_before / 1024
    print(
        f"load: {sessions}x{steps} in {took:.1f} s, peak RSS {peak_mb:.0f} MiB (+{growth_mb:.0f})"
    )
    assert sum(errors) == 0
    assert growth_mb < 400
    traces = list((tmp_path / "state" / "traces").glob("*.jsonl"))
    assert len(traces) == sessions
    for path in traces:
        events = [json.loads(line)["event"] for line in path.open()]
        assert events == ["session"] + ["observe", "critique"] * steps + ["close"]
