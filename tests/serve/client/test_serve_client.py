"""Gateway client: sessions, fail-open on every failure, retries, breaker, session re-creation.

The gateway is an in-process fake (``FakeGateway``, an ``httpx.MockTransport`` handler) that
implements the API v1 shapes; the guard and adapter tests import it from here.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from typing import Any

import httpx
import pytest

from serve.client import (
    AsyncCriticClient,
    CircuitBreaker,
    ClientConfig,
    CriticClient,
    Job,
    Observation,
    Ranking,
    Verdict,
    parse_ranking,
    rank_verdicts,
)

VERSIONS = {"model_version": "fake-1", "prompt_version": "p1", "schema_version": "1"}


def png(tag: str) -> bytes:
    """Stand-in screenshot bytes; the fake gateway never decodes them."""
    return b"\x89PNG fake " + tag.encode()


def _error(status: int, code: str, headers: dict | None = None) -> httpx.Response:
    body = {"error": {"code": code, "message": code}}
    return httpx.Response(status, json=body, headers=headers or {})


class FakeGateway:
    """A tiny API v1 gateway in memory.

    Screens are compared by their bytes: the same bytes twice in a row is ``no_effect``. The
    recurrence detector counts consecutive no-effect repeats of one (screen, action) pair and
    fires ``r3_trigger`` at ``r3_k``. ``judge(action) -> verdict dict`` decides critiques;
    ``faults`` is a list of ``(path_substring, kind)`` consumed one request at a time
    (``kind``: an int status, ``"timeout"``, ``"connect"``, ``"garbage"``, ``"html"``).
    ``recovery_at[step] = recovery dict`` adds a recovery proposal to that observe.
    """

    def __init__(self, token: str | None = None, r3_k: int = 2) -> None:
        self.token = token
        self.r3_k = r3_k
        self.sessions: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.faults: list[tuple[str, Any]] = []
        self.judge = lambda action: {"verdict": "good", "confidence": 0.9}
        self.recovery_at: dict[int, dict[str, Any]] = {}
        self.created = 0
        self.jobs: dict[str, dict[str, Any]] = {}

    # -- plumbing -----------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.requests if method is None or m == method]

    def bodies(self, fragment: str) -> list[Any]:
        return [b for _m, p, b in self.requests if fragment in p]

    def creates(self) -> list[Any]:
        return [b for _m, p, b in self.requests if p == "/v1/sessions"]

    def _fault(self, path: str) -> Any:
        for i, (fragment, kind) in enumerate(self.faults):
            if fragment in path:
                del self.faults[i]
                return kind
        return None

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, path, body))
        if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
            return _error(401, "unauthorized")
        kind = self._fault(path)
        if kind == "timeout":
            raise httpx.ReadTimeout("slow", request=request)
        if kind == "connect":
            raise httpx.ConnectError("refused", request=request)
        if kind == "garbage":
            return httpx.Response(200, json={"unexpected": True})
        if kind == "html":
            return httpx.Response(200, text="<html>proxy error</html>")
        if kind == 429:
            return _error(429, "overloaded", {"Retry-After": "0"})
        if isinstance(kind, int):
            code = {500: "internal", 503: "backend_unavailable", 413: "image_too_large"}
            return _error(kind, code.get(kind, "error"))
        return self.route(request.method, path, body)

    # -- API ----------------------------------------------------------------------------

    def route(self, method: str, path: str, body: Any) -> httpx.Response:
        parts = path.strip("/").split("/")
        if path == "/v1/sessions" and method == "POST":
            return self.create(body)
        if parts[:2] == ["v1", "sessions"] and len(parts) >= 3:
            sid = parts[2]
            if sid not in self.sessions:
                return _error(404, "unknown_session")
            sess = self.sessions[sid]
            if method == "DELETE":
                sess["closed"] = True
                return httpx.Response(200, json={"session_id": sid, "closed": True, **VERSIONS})
            if parts[3:] == ["observe"]:
                return self.observe(sid, sess, body)
            if parts[3:] == ["critique"]:
                return self.critique(sid, sess, body)
        if path == "/readyz":
            return httpx.Response(200, json={"ready": True, **VERSIONS})
        if path == "/v1/diagnose":
            job_id = f"job{len(self.jobs)}"
            self.jobs[job_id] = {"status": "done", "result": {"path": body["path"]}}
            return httpx.Response(202, json={"job_id": job_id, **VERSIONS})
        if parts[:2] == ["v1", "jobs"]:
            if parts[2] not in self.jobs:
                return _error(404, "unknown_job")
            return httpx.Response(200, json={**self.jobs[parts[2]], **VERSIONS})
        return _error(404, "not_found")

    def create(self, body: dict[str, Any]) -> httpx.Response:
        self.created += 1
        sid = body.get("session_id") or f"s{self.created}"
        existing = self.sessions.get(sid)
        if existing is not None and not existing["closed"]:
            # Like the gateway: an open session is kept as it is.
            reply = {"session_id": sid, "created": False, "echo": existing["echo"], **VERSIONS}
            return httpx.Response(201, json=reply)
        echo = body.get("echo") or {
            "task": body["task"],
            "platform": body["platform"],
            "screen": body["screen"],
            "coord_space": body.get("coord_space", "screen_px"),
            "summary": {"progress_summary": "", "version": 0},
            "step_idx": None,
            "steps": [],
            "screens": {},
        }
        self.sessions[sid] = {
            "create": body,
            "echo": echo,
            "latest": echo.get("step_idx"),
            "last_ref": echo.get("screens", {}).get(str(echo.get("step_idx"))),
            "stored": {},
            "images": {},
            "run": 0,
            "last_pair": None,
            "closed": False,
        }
        return httpx.Response(201, json={"session_id": sid, "echo": echo, **VERSIONS})

    def observe(self, sid: str, sess: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
        k = body["step_idx"]
        if k in sess["stored"] and not body.get("force"):
            return httpx.Response(200, json=sess["stored"][k])
        latest = sess["latest"]
        expected = 0 if latest is None else latest + 1
        if k != expected and not body.get("force"):
            return _error(409, "step_conflict")
        if k > 0 and "prev_action" not in body:
            return _error(422, "bad_request")
        image = body.get("screenshot")
        if image is None:
            image = sess["images"].get(body.get("image_ref"))
            if image is None:
                return _error(404, "unknown_image_ref")
        ref = "sha256:" + hashlib.sha256(image.encode()).hexdigest()
        sess["images"][ref] = image
        prev_ref = sess["last_ref"]
        change = None
        action_key = None
        if k > 0:
            same = prev_ref == ref
            change = {
                "identical": same,
                "dhash_dist": 0 if same else 12,
                "region_changed": None,
                "masked_diff_frac": 0.0 if same else 0.3,
                "no_effect": same,
            }
            action_key = json.dumps(body["prev_action"], sort_keys=True)
            pair = (prev_ref, action_key)
            if same and pair == sess["last_pair"]:
                sess["run"] += 1
            elif same:
                sess["run"] = 1
            else:
                sess["run"] = 0
            sess["last_pair"] = pair if same else None
        n = len(sess["echo"]["steps"]) + (1 if k > 0 else 0)
        history = {
            "progress_summary": f"{n} steps done",
            "last_action_result": "nothing changed" if change and change["no_effect"] else "ok",
            "version": n + 1,
            "stale": False,
        }
        steps = list(sess["echo"]["steps"])
        if k > 0:
            # Echo steps are the executed steps: the action of step k-1 on its screen.
            intent = body["prev_action"].get("raw", "")
            steps.append(
                {
                    "step_idx": k - 1,
                    "intent": intent,
                    "action_text": intent,
                    "image_ref": prev_ref,
                    "last_action_result": history["last_action_result"],
                }
            )
        screens = {**sess["echo"].get("screens", {}), str(k): ref}
        sess["echo"] = {
            **sess["echo"],
            "summary": history,
            "step_idx": k,
            "steps": steps,
            "screens": screens,
        }
        sess["last_ref"] = ref
        reply = {
            "session_id": sid,
            "step_idx": k,
            "status": "ok",
            "reason": None,
            "history": history,
            "image_ref": ref,
            "change": change,
            "recurrence": {
                "same_key_no_effect_run": sess["run"],
                "cycle_len": None,
                "screen_revisits": 0,
                "r3_trigger": sess["run"] >= self.r3_k,
                "action_key": action_key,
                "screen_key": ref,
            },
            "recovery": self.recovery_at.get(k),
            "echo": sess["echo"],
            "timing_ms": {"total": 1},
            **VERSIONS,
        }
        sess["stored"][k] = reply
        sess["latest"] = k
        return httpx.Response(200, json=reply)

    def critique(self, sid: str, sess: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
        if body["step_idx"] != sess["latest"]:
            return _error(409, "step_conflict")
        if "image_ref" in body and body["image_ref"] not in sess["images"]:
            return _error(404, "unknown_image_ref")

        def one(action: dict[str, Any]) -> dict[str, Any]:
            v = {
                "status": "ok",
                "source": "model",
                "reason": None,
                "error_dimension": None,
                "explanation": "",
                "thinking": None,
                "confidence": None,
                "marker": None,
                "parse_status": "ok",
                "truncated": False,
                "recurrence": {},
                "history_version": 1,
                "annotated_image": None,
                "timing_ms": {"total": 1},
                **VERSIONS,
            }
            v.update(self.judge(action))
            return v

        if "candidates" in body:
            results = [one(a) for a in body["candidates"]]
            ranking = rank_verdicts(
                [Verdict(r["verdict"], confidence=r["confidence"]) for r in results]
            )
            reply = {"results": results, "ranking": ranking, **VERSIONS}
        else:
            reply = {**one(body["action"]), "echo": sess["echo"]}
        return httpx.Response(200, json=reply)


def make_client(gw: FakeGateway, **cfg: Any) -> CriticClient:
    config = ClientConfig(base_url="http://gw", retry_jitter_s=0.0, **cfg)
    return CriticClient(config=config, transport=gw.transport())


# ---------------------------------------------------------------------------------------------
# Happy path


def test_session_observe_critique_close():
    gw = FakeGateway(token="sekrit")
    client = make_client(gw, token="sekrit")
    s = client.start("Open the settings", "ubuntu", (1920, 1080))
    assert s.session_id == "s1"
    create = gw.creates()[0]
    assert create["screen"] == {"w": 1920, "h": 1080} and create["coord_space"] == "screen_px"
    obs = s.observe(0, png("a"))
    assert isinstance(obs, Observation) and obs.ok and obs.change is None
    sent = gw.bodies("/observe")[0]
    assert base64.b64decode(sent["screenshot"]) == png("a")
    assert "prev_action" not in sent
    obs1 = s.observe(1, png("b"), "pyautogui.click(10, 10)")
    assert gw.bodies("/observe")[1]["prev_action"] == {
        "raw": "pyautogui.click(10, 10)",
        "format": "auto",
    }
    assert obs1.no_effect is False and obs1.history.progress_summary == "1 steps done"
    gw.judge = lambda a: {
        "verdict": "bad",
        "error_dimension": "Wrong Target",
        "explanation": "That is the help icon.",
        "confidence": 0.8,
    }
    v = s.critique(1, {"raw": "click", "format": "auto"})
    assert isinstance(v, Verdict) and v.is_bad and v.error_dimension == "Wrong Target"
    assert s.echo["step_idx"] == 1 and s.echo["steps"][-1]["step_idx"] == 0
    assert s.close() is True
    assert gw.sessions["s1"]["closed"]


def test_wrong_token_fails_open_as_unauthorized():
    gw = FakeGateway(token="right")
    client = make_client(gw, token="wrong")
    s = client.start("t", "ubuntu", (100, 100))
    assert s.session_id is None
    obs = s.observe(0, png("a"))
    assert not obs.ok and obs.reason == "unauthorized" and obs.history.stale
    v = s.critique(0, "click")
    assert v.abstained and v.reason == "unauthorized" and v.source == "client"


def test_candidates_return_a_ranking():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    verdicts = {"a": ("bad", 0.9), "b": ("good", 0.6), "c": ("good", 0.95)}
    gw.judge = lambda a: dict(zip(("verdict", "confidence"), verdicts[a["raw"]], strict=True))
    r = s.critique(0, candidates=["a", "b", "c"])
    assert isinstance(r, Ranking) and r.ranking == (2, 1, 0) and r.best == 2
    assert [v.verdict for v in r.results] == ["bad", "good", "good"]


def test_rank_verdicts_orders_by_verdict_then_confidence():
    vs = [
        Verdict("abstain", reason="timeout"),
        Verdict("bad", confidence=0.9),
        Verdict("good", confidence=0.4),
        Verdict("bad", confidence=0.3),
        Verdict("good", confidence=0.8),
    ]
    assert rank_verdicts(vs) == [4, 2, 0, 3, 1]


def test_ready():
    gw = FakeGateway()
    client = make_client(gw)
    assert client.ready() is True
    gw.faults = [("/readyz", 503), ("/readyz", 503)]
    assert client.ready() is False


def test_client_config_is_validated():
    with pytest.raises(ValueError):
        ClientConfig(critique_deadline_s=0)
    with pytest.raises(ValueError):
        ClientConfig(breaker_failures=0)


def test_diagnose_and_job():
    gw = FakeGateway()
    client = make_client(gw)
    job = client.diagnose("runs/trace.jsonl")
    assert isinstance(job, Job) and job.status == "pending" and job.job_id == "job0"
    done = client.job(job.job_id)
    assert done.status == "done" and done.result == {"path": "runs/trace.jsonl"}
    missing = client.job("nope")
    assert missing.status == "failed" and missing.reason == "unknown_job"


# ---------------------------------------------------------------------------------------------
# Failure paths: never raise, explicit reasons


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("timeout", "timeout"),
        ("connect", "transport"),
        (500, "backend"),
        (503, "backend"),
        ("garbage", "bad_response"),
        ("html", "bad_response"),
    ],
)
def test_critique_fails_open(fault, reason):
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    # Two faults: the retryable ones are retried once and fail again.
    gw.faults = [("/critique", fault), ("/critique", fault)]
    v = s.critique(0, "click")
    assert v.abstained and v.reason == reason and v.source == "client"
    assert s.failures == {reason: 1}


def test_observe_fails_open_keeping_the_last_history():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    good = s.observe(1, png("b"), "x")
    gw.faults = [("/observe", 500)]
    stale = s.observe(2, png("c"), "y")
    assert stale.status == "stale" and stale.reason == "backend"
    assert stale.history.stale and stale.history.progress_summary == good.history.progress_summary


def test_one_retry_recovers_a_transient_failure():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    gw.faults = [("/critique", "connect")]
    v = s.critique(0, "click")
    assert v.is_good
    assert gw.paths().count("/v1/sessions/s1/critique") == 2


def test_500_is_not_retried_and_429_waits_then_retries():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    gw.faults = [("/critique", 500)]
    assert s.critique(0, "click").reason == "backend"
    assert gw.paths().count("/v1/sessions/s1/critique") == 1
    gw.faults = [("/critique", 429)]
    assert s.critique(0, "click").is_good


def test_deadline_bounds_a_slow_gateway():
    gw = FakeGateway()
    inner = gw.handle

    def slow(request):
        if "/critique" in request.url.path:
            import time

            time.sleep(0.4)
            raise httpx.ReadTimeout("slow", request=request)
        return inner(request)

    cfg = ClientConfig(base_url="http://gw", critique_deadline_s=0.3, retry_jitter_s=0.0)
    client = CriticClient(config=cfg, transport=httpx.MockTransport(slow))
    s = client.start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    v = s.critique(0, "click")
    assert v.abstained and v.reason == "timeout"


def test_circuit_breaker_opens_after_five_failures_and_half_opens():
    now = [0.0]
    breaker = CircuitBreaker(failures=5, open_s=60.0, clock=lambda: now[0])
    gw = FakeGateway()
    client = CriticClient(
        config=ClientConfig(base_url="http://gw", retries=0),
        transport=gw.transport(),
        breaker=breaker,
    )
    s = client.start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    gw.faults = [("/critique", 503)] * 5
    for _ in range(5):
        assert s.critique(0, "click").reason == "backend"
    assert breaker.state == "open"
    sent = len(gw.requests)
    v = s.critique(0, "click")
    assert v.abstained and v.reason == "circuit_open"
    assert len(gw.requests) == sent  # nothing went out
    now[0] = 61.0
    assert breaker.state == "half_open"
    assert s.critique(0, "click").is_good  # the probe succeeds and closes the breaker
    assert breaker.state == "closed"


def test_failed_probe_reopens_the_breaker():
    now = [0.0]
    breaker = CircuitBreaker(failures=2, open_s=10.0, clock=lambda: now[0])
    breaker.record(True)
    breaker.record(True)
    assert not breaker.allow()
    now[0] = 11.0
    assert breaker.allow() and not breaker.allow()  # one probe only
    breaker.record(True)
    assert breaker.state == "open"
    now[0] = 15.0
    assert not breaker.allow()


def test_request_errors_do_not_trip_the_breaker():
    gw = FakeGateway()
    client = make_client(gw, retries=0)
    s = client.start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    gw.faults = [("/critique", 422)] * 8
    for _ in range(8):
        s.critique(0, "click")
    assert client.breaker.state == "closed"


# ---------------------------------------------------------------------------------------------
# Gateway loss and resync


def test_lost_session_is_recreated_from_the_echo_on_observe():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    s.observe(1, png("b"), "click a")
    gw.sessions.clear()  # the gateway restarted
    obs = s.observe(2, png("c"), "click b")
    assert obs.ok and obs.step_idx == 2 and s.recreated == 1
    recreate = gw.creates()[-1]
    assert recreate["session_id"] == "s1" and recreate["echo"]["step_idx"] == 1
    assert [st["step_idx"] for st in recreate["echo"]["steps"]] == [0]
    assert obs.history.progress_summary == "2 steps done"  # the history survived
    assert [st["step_idx"] for st in obs.body["echo"]["steps"]] == [0, 1]
    assert "force" not in gw.bodies("/observe")[-1]


def test_lost_session_is_recreated_on_critique_without_replaying_the_screen():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    s.observe(1, png("b"), "click a")
    gw.sessions.clear()
    observes = len(gw.bodies("/observe"))
    v = s.critique(1, "click b")
    assert v.is_good and s.recreated == 1
    # The echo covers step 1: no second observe (it would add the step to the history twice).
    assert len(gw.bodies("/observe")) == observes


def test_critique_replays_the_screen_when_the_gateway_lacks_it():
    gw = FakeGateway()
    client = make_client(gw)
    gw.faults = [("/v1/sessions", "connect"), ("/v1/sessions", "connect")]
    s = client.start("t", "ubuntu", (100, 100))
    gw.faults = [("/v1/sessions", "connect"), ("/v1/sessions", "connect")]
    assert s.observe(0, png("a")).reason == "transport"  # still down
    v = s.critique(0, "click")  # back up: created, the screen replayed, then judged
    assert v.is_good and s.session_id == "s1"
    replay = gw.bodies("/observe")[-1]
    assert replay["step_idx"] == 0 and replay["force"] is True
    assert base64.b64decode(replay["screenshot"]) == png("a")


def test_reseed_replaces_the_gateway_history_with_an_earlier_echo():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    early = s.observe(1, png("b"), "click a").body["echo"]
    s.observe(2, png("b"), "dead click")
    s.observe(3, png("b"), "dead click")
    assert s.reseed(early) is True
    assert [m for m, p, _ in gw.requests[-2:]] == ["DELETE", "POST"]
    assert gw.creates()[-1]["echo"]["step_idx"] == 1 and s.session_id == "s1"
    obs = s.observe(2, png("c"), "open menu")  # continues from the echo's step, no conflict
    assert obs.ok and "force" not in gw.bodies("/observe")[-1]
    assert [st["intent"] for st in obs.body["echo"]["steps"]] == ["click a", "open menu"]
    assert s.recreated == 0  # a reseed is not a lost session


def test_reseed_fails_open():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    echo = s.observe(0, png("a")).body["echo"]
    gw.faults = [("/v1/sessions/s1", 500)]
    assert s.reseed(echo) is False
    assert s.reseed("not an echo") is False


def test_gateway_down_at_start_then_back():
    gw = FakeGateway()
    client = make_client(gw)
    gw.faults = [("/v1/sessions", "connect"), ("/v1/sessions", "connect")]
    s = client.start("t", "ubuntu", (100, 100))
    assert s.session_id is None
    obs = s.observe(0, png("a"))
    assert obs.ok and s.session_id == "s1"


def test_step_conflict_is_resynced_with_force():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    obs = s.observe(5, png("b"), "x")  # the harness skipped steps
    assert obs.ok and obs.step_idx == 5
    assert gw.bodies("/observe")[-1]["force"] is True


def test_unknown_image_ref_is_resent_inline():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    v = s.critique(0, "click", png="sha256:" + "0" * 64)
    assert v.is_good
    last = gw.bodies("/critique")[-1]
    assert "image_ref" not in last and base64.b64decode(last["screenshot"]) == png("a")


def test_image_too_large_without_a_decodable_image_fails_open():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    gw.faults = [("/observe", 413)]
    obs = s.observe(0, png("a"))  # fake bytes cannot be shrunk
    assert not obs.ok and obs.reason == "image_too_large"


def test_image_too_large_is_resent_smaller():
    from PIL import Image

    from hivig.vision import encode_png

    big = encode_png(Image.new("RGB", (64, 32), (200, 10, 10)))
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (64, 32))
    gw.faults = [("/observe", 413)]
    obs = s.observe(0, big)
    assert obs.ok
    resent = base64.b64decode(gw.bodies("/observe")[-1]["screenshot"])
    assert Image.open(__import__("io").BytesIO(resent)).size == (32, 16)


def test_unexpected_exception_inside_the_client_fails_open(monkeypatch):
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    monkeypatch.setattr("serve.client.flows.parse_observation", lambda *a: 1 / 0)
    obs = s.observe(0, png("a"))
    assert obs.status == "stale" and obs.reason == "client_error"


def test_missing_screenshot_fails_open_without_a_request():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    sent = len(gw.requests)
    assert s.observe(0, None).reason == "no_image"
    assert len(gw.requests) == sent
    v = s.critique(0, "click")  # the gateway never saw step 0, and there is nothing to replay
    assert v.abstained and v.reason == "step_conflict"
    assert not gw.bodies("/observe")


def test_closed_session_abstains():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.close()
    assert s.critique(0, "x").reason == "closed"
    assert s.observe(0, png("a")).reason == "closed"


# ---------------------------------------------------------------------------------------------
# Async client


def test_async_client_same_flows():
    async def main() -> None:
        gw = FakeGateway()
        cfg = ClientConfig(base_url="http://gw", retry_jitter_s=0.0)
        async with AsyncCriticClient(config=cfg, transport=gw.transport()) as client:
            s = await client.start("t", "android", (1080, 2400))
            assert (await s.observe(0, png("a"))).ok
            gw.sessions.clear()
            obs = await s.observe(1, png("b"), {"raw": "tap", "format": "auto"})
            assert obs.ok and s.recreated == 1
            gw.faults = [("/critique", "timeout"), ("/critique", "timeout")]
            v = await s.critique(1, "tap")
            assert v.abstained and v.reason == "timeout"
            r = await s.critique(1, candidates=["a", "b"])
            assert isinstance(r, Ranking) and len(r.results) == 2
            assert await client.ready() and s.echo["step_idx"] == 1
            job = await client.diagnose("x.jsonl")
            assert (await client.job(job.job_id)).status == "done"
            assert await s.close()

    asyncio.run(main())


def test_async_breaker_opens():
    async def main() -> None:
        gw = FakeGateway()
        cfg = ClientConfig(base_url="http://gw", retries=0, breaker_failures=2)
        client = AsyncCriticClient(config=cfg, transport=gw.transport())
        s = await client.start("t", "ubuntu", (10, 10))
        await s.observe(0, png("a"))
        gw.faults = [("/critique", "connect")] * 2
        await s.critique(0, "x")
        await s.critique(0, "x")
        assert (await s.critique(0, "x")).reason == "circuit_open"
        await client.aclose()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# Interrupted probes and JSON-safe bodies


class _Opaque:
    """An object no JSON encoder knows (a converter bug in an adapter)."""


def test_unencodable_probe_is_recorded_and_later_probes_go_out():
    now = [0.0]
    breaker = CircuitBreaker(failures=2, open_s=10.0, clock=lambda: now[0])
    gw = FakeGateway()
    client = CriticClient(
        config=ClientConfig(base_url="http://gw", retries=0),
        transport=gw.transport(),
        breaker=breaker,
    )
    s = client.start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    gw.faults = [("/critique", 503)] * 2
    s.critique(0, "click"), s.critique(0, "click")
    assert breaker.state == "open"
    now[0] = 11.0
    v = s.critique(0, {"type": "left_click", "x": _Opaque(), "y": 1})
    assert v.abstained and v.reason == "client_error"
    assert not breaker._probing  # the probe's failure was recorded
    now[0] = 100.0
    assert s.critique(0, "click").is_good  # the next probe went out and closed the breaker
    assert breaker.state == "closed"


def test_unrecorded_probe_expires_after_its_timeout():
    now = [0.0]
    breaker = CircuitBreaker(failures=1, open_s=10.0, clock=lambda: now[0], probe_timeout_s=5.0)
    breaker.record(True)
    now[0] = 11.0
    assert breaker.allow()  # a probe goes out and its caller never records it
    now[0] = 14.0
    assert not breaker.allow()
    now[0] = 16.5
    assert breaker.allow() and not breaker.allow()  # the stale probe expired: one new probe


def test_client_breaker_probe_timeout_is_the_longest_deadline():
    cfg = ClientConfig(base_url="http://gw", observe_deadline_s=3.0, critique_deadline_s=7.0)
    # The critique waits longest: its 7 s plus the 2 s grace beyond the gateway's deadline.
    assert CriticClient(config=cfg).breaker.probe_timeout_s == 9.0


def test_numpy_numbers_in_actions_are_sent_as_json_numbers():
    np = pytest.importorskip("numpy")
    gw = FakeGateway()
    client = make_client(gw)
    s = client.start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    action = {"type": "left_click", "x": np.int64(12), "y": np.float32(3.5), "ok": np.bool_(True)}
    v = s.critique(0, action)
    assert v.is_good
    sent = [b for m, p, b in gw.requests if p.endswith("/critique")][-1]["action"]
    assert sent == {"type": "left_click", "x": 12, "y": 3.5, "ok": True}
    assert type(sent["x"]) is int and client.breaker.state == "closed"


def test_async_probe_cancelled_by_the_harness_does_not_stick():
    now = [0.0]
    breaker = CircuitBreaker(failures=1, open_s=10.0, clock=lambda: now[0])
    slow = [False]

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/sessions":
            return httpx.Response(201, json={"session_id": "s1", "echo": {}, **VERSIONS})
        if slow[0]:
            await asyncio.sleep(5)
        return _error(503, "backend_unavailable")

    async def main() -> None:
        cfg = ClientConfig(base_url="http://gw", retries=0)
        client = AsyncCriticClient(
            config=cfg, transport=httpx.MockTransport(handler), breaker=breaker
        )
        s = await client.start("t", "ubuntu", (10, 10))
        assert (await s.critique(0, "x")).reason == "backend"
        now[0], slow[0] = 11.0, True
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(s.critique(0, "x"), 0.05)
        assert not breaker._probing
        now[0], slow[0] = 100.0, False
        assert (await s.critique(0, "x")).reason == "backend"  # a probe went out again
        await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("ranking", [[1, "0"], [0, None], [True, 0], [0, 0], "01", [0.0, 1]])
def test_a_bad_ranking_is_discarded_but_the_verdicts_are_kept(ranking):
    body = {
        "results": [
            {"verdict": "bad", "confidence": 0.9},
            {"verdict": "good", "confidence": 0.8},
        ],
        "ranking": ranking,
    }
    got = parse_ranking(body, 2)
    assert got is not None and [r.verdict for r in got.results] == ["bad", "good"]
    assert got.ranking == (1, 0)  # ranked from the verdicts


def _closed_sessions_are_unknown(gw: FakeGateway, create_failures: int) -> dict[str, int]:
    """Make ``gw`` answer like the real gateway for closed sessions (404) and fail the first
    ``create_failures`` creates after a DELETE with 500."""
    inner = gw.route
    state = {"deleted": 0, "failures": create_failures}

    def route(method: str, path: str, body: Any) -> httpx.Response:
        parts = path.strip("/").split("/")
        if len(parts) >= 3 and gw.sessions.get(parts[2], {}).get("closed"):
            return _error(404, "unknown_session")
        if method == "DELETE":
            state["deleted"] += 1
        if path == "/v1/sessions" and method == "POST" and state["deleted"] and state["failures"]:
            state["failures"] -= 1
            return _error(500, "internal")
        return inner(method, path, body)

    gw.route = route
    return state


def test_reseed_retries_a_failed_create_once():
    gw = FakeGateway()
    _closed_sessions_are_unknown(gw, create_failures=1)
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    early = s.observe(1, png("b"), "click a").body["echo"]
    s.observe(2, png("b"), "dead click")
    assert s.reseed_status(early) == "rebuilt"
    assert gw.creates()[-1]["echo"]["step_idx"] == 1


def test_reseed_lost_recreates_the_session_from_the_current_echo():
    gw = FakeGateway()
    _closed_sessions_are_unknown(gw, create_failures=2)
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    s.observe(0, png("a"))
    early = s.observe(1, png("b"), "click a").body["echo"]
    s.observe(2, png("b"), "dead click")
    current = s.observe(3, png("b"), "dead click").body["echo"]
    assert s.reseed_status(early) == "lost"
    assert s.echo == current  # the pre-reseed echo is back
    obs = s.observe(4, png("c"), "open menu")
    assert obs.ok
    assert gw.creates()[-1]["echo"]["step_idx"] == 3  # re-created as it was, not from `early`
    assert not any(b.get("force") for b in gw.bodies("/observe"))  # no gap was forced over
    steps = [st["intent"] for st in obs.body["echo"]["steps"]]
    assert steps == ["click a", "dead click", "dead click", "open menu"]


def test_reseed_untouched_when_the_close_fails():
    gw = FakeGateway()
    s = make_client(gw).start("t", "ubuntu", (100, 100))
    echo = s.observe(0, png("a")).body["echo"]
    s.observe(1, png("b"), "x")
    gw.faults = [("/v1/sessions/s1", 500)]
    assert s.reseed_status(echo) == "untouched" and s.echo["step_idx"] == 1


def test_the_gateway_and_the_client_rank_alike():
    # One ranking: what the gateway sends and what the client works out on its own, for every
    # mix of verdicts and confidences (bads least confident first, a missing confidence even).
    import itertools

    from serve.gateway import rank as gateway_rank

    choices = [(v, c) for v in ("good", "abstain", "bad") for c in (None, 0.2, 0.5, 0.9)]
    for pairs in itertools.product(choices, repeat=3):
        client = rank_verdicts([Verdict(v, confidence=c) for v, c in pairs])
        assert gateway_rank(list(pairs)) == client
    assert gateway_rank([("bad", 0.9), ("bad", 0.2)]) == [1, 0]
