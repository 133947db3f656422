"""Fault injection: concurrent sessions through a real gateway while faults come and go.

    .venv/bin/python benchmarks/bench_faults.py                 # 8 sessions x 16 steps
    .venv/bin/python benchmarks/bench_faults.py --sessions 4 --steps 8 --json out.json

A gateway (uvicorn on 127.0.0.1, OpenAI backend against a loopback server) serves runner-shaped
clients: each step an observe and a critique, 429/503 answered by waiting ``Retry-After`` and
sending again, ``unknown_session`` by re-creating the session from its echo. Meanwhile faults are
switched on and off one after the other: the backend stalls, fails with 500s and answers garbage;
the session store refuses writes and its file is deleted; ``traces/`` and ``images/`` refuse
writes; and hostile clients send unfinished request heads, oversized screenshots and malformed,
unknown-field or out-of-range bodies,
a trailing slash with a forged ``Host``, bodies cut off by a client that leaves, and a request a
bug answers 500 followed by another on the same connection; 3,000 idle sessions expire mid-run
while ``/healthz`` is timed. The report counts faults tried and answers by status, and
checks what must hold: the gateway stays up, every answer has a documented status, no step a
client saw committed is lost, and every committed step is in the session's trace.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import socket
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve.app import create_app  # noqa: E402
from serve.server import BackgroundServer  # noqa: E402
from serve.sessions import SessionState  # noqa: E402
from tests.fakes.gateway import CLICK, GOOD, SUMMARY, b64, screen, serve_config  # noqa: E402
from tests.fakes.openai_server import Reply, ScriptedServer, request_text  # noqa: E402

DOCUMENTED = {200, 201, 400, 404, 409, 413, 415, 422, 429, 503}
"""Every status ``docs/serving.md`` documents for these routes."""


# ---------------------------------------------------------------------------------------------
# The backend, switchable


class Backend:
    """A loopback OpenAI server whose behaviour a fault switches: ok, stall, flap or garbage."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.server = ScriptedServer(respond=self._answer, lifetime_s=600)

    def _answer(self, body: dict) -> Reply:
        if self.mode == "stall":
            return Reply(content=SUMMARY, delay_s=3.0)
        if self.mode == "flap":
            return Reply(status=500)
        if self.mode == "garbage":
            return Reply(raw_body=b"{not json")
        critique = "Current Proposed Step" in request_text(body)
        content = GOOD if critique else SUMMARY
        if self.mode == "huge usage":  # a count past 64 bits once made every route a 500
            return Reply(content=content, prompt_tokens=10**30)
        if self.mode == "huge answer":  # past backend.max_response_bytes: abstain
            return Reply(content=content + " " * 300_000)
        return Reply(content=content)


class _RefusingDisk:
    """A store connection whose writes fail as a failing disk fails them (reads still work)."""

    _WRITES = ("BEGIN", "INSERT", "UPDATE", "DELETE", "COMMIT")

    def __init__(self, db: Any) -> None:
        self.db = db

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.split()[0].upper() in self._WRITES:
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


# ---------------------------------------------------------------------------------------------
# Faults: each a context manager that holds the fault while the sessions run


def _faults(
    gateway: Any, backend: Backend, state: Path, url: str, tally: Tally
) -> dict[str, Callable[[], Any]]:
    @contextlib.contextmanager
    def backend_mode(mode: str) -> Iterator[None]:
        backend.mode = mode
        try:
            yield
        finally:
            backend.mode = "ok"

    @contextlib.contextmanager
    def store_refuses_writes() -> Iterator[None]:
        store = gateway.store
        store._db = _RefusingDisk(store._db)
        try:
            # A write of its own, so the fault is met whatever the agents' timing (they may all
            # be between steps for the whole window): a session that cannot be stored is a 503.
            task = {"task": "probe", "platform": "ubuntu", "screen": {"w": 320, "h": 200}}
            tally.count(httpx.post(f"{url}/v1/sessions", json=task, timeout=30).status_code)
            yield
        finally:
            store._db = store._db.db

    @contextlib.contextmanager
    def store_deleted() -> Iterator[None]:
        (state / "sessions.sqlite").unlink()
        yield

    @contextlib.contextmanager
    def folder_in_the_way(name: str) -> Iterator[None]:
        folder, aside = state / name, state / f"{name}.aside"
        folder.rename(aside)
        folder.write_text("not a folder")
        try:
            yield
        finally:
            folder.unlink()
            aside.rename(folder)

    @contextlib.contextmanager
    def idle_sessions_expire(n: int = 3000) -> Iterator[None]:
        # Sessions another process left idle past the TTL: the next sweep (every 0.5 s here)
        # closes them while the agents' requests go on (the prober times /healthz meanwhile).
        old = time.time() - 2 * gateway.cfg.sessions.ttl_s
        docs = [(f"idle{i}", SessionState(f"idle{i}", "t", "ubuntu", 320, 200).to_json(), old)
                for i in range(n)]  # fmt: skip
        with contextlib.suppress(sqlite3.OperationalError):  # no store file just now: skipped
            db = sqlite3.connect(f"file:{state / 'sessions.sqlite'}?mode=rw", uri=True, timeout=30)
            with db:  # one transaction, as another process would write them
                db.execute("DELETE FROM sessions WHERE id LIKE 'idle%'")  # the last round's
                db.executemany("INSERT INTO sessions VALUES (?, ?, ?, 0)", docs)
            db.close()
        yield

    return {
        "3,000 idle sessions expire": idle_sessions_expire,
        "backend stalls": lambda: backend_mode("stall"),
        "backend fails (500)": lambda: backend_mode("flap"),
        "backend answers garbage": lambda: backend_mode("garbage"),
        "backend usage past 64 bits": lambda: backend_mode("huge usage"),
        "backend answer oversized": lambda: backend_mode("huge answer"),
        "store refuses writes": store_refuses_writes,
        "store file deleted": store_deleted,
        "traces/ refuses writes": lambda: folder_in_the_way("traces"),
        "images/ refuses writes": lambda: folder_in_the_way("images"),
    }


# ---------------------------------------------------------------------------------------------
# Clients


class Tally:
    """Answers by status, and what every session saw committed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: Counter[int] = Counter()
        self.hostile: Counter[str] = Counter()
        self.committed: dict[str, int] = {}  # session id -> last step_idx observed with 200
        self.broken: Counter[str] = Counter()  # hostile requests the gateway mishandled
        self.healthz_max_s = 0.0  # the slowest /healthz, polled every 0.1 s through the run

    def count(self, status: int) -> None:
        with self.lock:
            self.statuses[status] += 1


def _post(http: httpx.Client, tally: Tally, path: str, body: dict) -> httpx.Response:
    """POST until the answer is not a 429/503 (waiting Retry-After, as a runner would)."""
    for _ in range(200):
        r = http.post(path, json=body)
        tally.count(r.status_code)
        if r.status_code not in (429, 503):
            return r
        time.sleep(min(float(r.headers.get("Retry-After", "1")), 0.5))
    return r


def _episode(url: str, tally: Tally, steps: int, seed: int, pace_s: float) -> None:
    task = {"task": f"Episode {seed}", "platform": "ubuntu", "screen": {"w": 320, "h": 200}}
    with httpx.Client(base_url=url, timeout=30) as http:
        r = _post(http, tally, "/v1/sessions", task)
        sid, echo = r.json()["session_id"], r.json()["echo"]
        k = 0
        while k < steps:
            body: dict[str, Any] = {"step_idx": k, "screenshot": b64(screen(seed=seed * 100 + k))}
            if k:
                body["prev_action"] = CLICK
            r = _post(http, tally, f"/v1/sessions/{sid}/observe", body)
            if r.status_code == 404:  # lost: re-created from the last echo, as the client does
                again = {**task, "session_id": sid, "echo": echo}
                _post(http, tally, "/v1/sessions", again)
                continue
            if r.status_code == 409:  # a retry after a lost answer: the step is in
                r = _post(http, tally, f"/v1/sessions/{sid}/observe", {**body, "force": True})
            assert r.status_code == 200, r.text
            echo = r.json()["echo"]
            with tally.lock:
                tally.committed[sid] = k
            _post(http, tally, f"/v1/sessions/{sid}/critique", {"step_idx": k, "action": CLICK})
            k += 1
            time.sleep(pace_s)  # an agent acts between steps


def _hostile(url: str, tally: Tally, stop: threading.Event) -> None:
    host, port = url.removeprefix("http://").split(":")
    huge = io.BytesIO()
    Image.new("RGB", (5000, 5000), (9, 9, 9)).save(huge, "PNG")
    bodies = {
        "oversized screenshot": {"image": b64(huge.getvalue())},
        "malformed body": None,
        "unknown field": {"image": "", "colour": "blue"},
        "step_idx past int64": {"step_idx": 2**63, "screenshot": "x"},
        "screenshot neither PNG nor JPEG": {"image": b64(b"GIF89a" + bytes(64))},
    }
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                s = socket.create_connection((host, int(port)))
                s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n")  # never finished
                tally.hostile["unfinished request head"] += 1
                b = socket.create_connection((host, int(port)))  # headers, never the body: 408
                b.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n")
                tally.hostile["unfinished request body"] += 1
                h = socket.create_connection((host, int(port)))  # over max_header_bytes: 431
                h.sendall(b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\n")
                tally.hostile["oversized request head"] += 1
            with contextlib.suppress(OSError):  # the client hangs up mid-body: no bug, no 500
                g = socket.create_connection((host, int(port)))
                g.sendall(b"POST /v1/images HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n{")
                time.sleep(0.05)
                g.close()
                tally.hostile["client gone mid-body"] += 1
            r = http.get("/v1/info/", headers={"Host": "evil.example"})  # no redirect there
            tally.count(r.status_code)
            tally.hostile["trailing slash, forged Host"] += 1
            _bug_then_same_connection(http, tally)
            for name, body in bodies.items():
                path = "/v1/sessions/none/observe" if "step_idx" in name else "/v1/images"
                r = (
                    http.post(path, content=b"{nope")
                    if body is None
                    else http.post(path, json=body)
                )
                tally.count(r.status_code)
                with tally.lock:
                    tally.hostile[name] += 1
            stop.wait(0.3)


BUG = "a bug's 500, then the same connection"


def _bug_then_same_connection(http: httpx.Client, tally: Tally) -> None:
    """A request a bug answers 500; the next one must be answered on the same connection."""
    tally.hostile[BUG] += 1
    try:
        r = http.get("/v1/bug")
        first = r.extensions["network_stream"].get_extra_info("client_addr")
        again = http.get("/healthz")
        same = again.extensions["network_stream"].get_extra_info("client_addr") == first
        if r.status_code != 500 or again.status_code != 200 or not same:
            tally.broken["connection dropped after a 500"] += 1
    except httpx.TransportError:
        tally.broken["connection dropped after a 500"] += 1


def _probe(url: str, tally: Tally, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.wait(0.1):
            start = time.monotonic()
            http.get("/healthz")
            tally.healthz_max_s = max(tally.healthz_max_s, time.monotonic() - start)


async def _bug() -> None:
    raise RuntimeError("a bug")  # any route may have one; its 500 must not cost the connection


# ---------------------------------------------------------------------------------------------
# The run


def run(
    root: Path, sessions: int = 8, steps: int = 16, window_s: float = 0.8, pace_s: float = 0.3
) -> dict[str, Any]:
    """One fault-injection run under ``root``; the report (see the module docstring)."""
    state = root / "state"
    backend = Backend()
    tally = Tally()
    with backend.server:
        cfg = serve_config(
            state,
            "backend.kind=openai",
            "backend.model=scripted",
            f"backend.base_url={backend.server.base_url}",
            "backend.timeout_s=30",
            "critic.observe_deadline_s=0.5",
            "critic.critique_deadline_s=0.5",
            "limits.header_timeout_s=1.0",
            "limits.body_timeout_s=1.0",
            "backend.max_response_bytes=200000",
            "limits.max_queue=16",
            "retention.sweep_every_s=0.5",
        )
        app = create_app(cfg)
        app.add_api_route("/v1/bug", _bug)
        with BackgroundServer(app) as server:
            gateway = app.state.gateway
            faults = _faults(gateway, backend, state, server.url, tally)
            # Agents act slowly enough to be still at work through the first round of faults,
            # however fast the gateway answers: a fault window with no traffic tests nothing.
            pace = max(pace_s, len(faults) * 1.5 * window_s / steps)
            stop = threading.Event()
            clients = [
                threading.Thread(target=_episode, args=(server.url, tally, steps, seed, pace))
                for seed in range(sessions)
            ]
            attacker = threading.Thread(target=_hostile, args=(server.url, tally, stop))
            prober = threading.Thread(target=_probe, args=(server.url, tally, stop))
            for t in [*clients, attacker, prober]:
                t.start()
            tried: list[str] = []
            # Every fault at least once, and faults for as long as any agent is at work.
            for name, fault in itertools.cycle(faults.items()):
                if len(set(tried)) == len(faults) and not any(t.is_alive() for t in clients):
                    break
                with fault():
                    tried.append(name)
                    time.sleep(window_s)
                time.sleep(window_s / 2)
            for t in clients:
                t.join()
            stop.set()
            attacker.join()
            prober.join()
            internal = gateway.metrics.registry.get_sample_value(
                "hivig_errors_total", {"code": "internal"}
            )
            alive = httpx.get(f"{server.url}/healthz").status_code == 200
            kept = {sid: httpx.get(f"{server.url}/v1/sessions/{sid}").json()["step_idx"]
                    for sid in tally.committed}  # fmt: skip
        # The server has stopped: waiting trace events were flushed at shutdown.
        traced = {sid: _traced_steps(state, sid) for sid in tally.committed}
    lost = sum(kept[sid] < k for sid, k in tally.committed.items())
    untraced = sum(len(set(range(k + 1)) - traced[sid]) for sid, k in tally.committed.items())
    return {
        "sessions": sessions,
        "steps": steps,
        "faults_tried": len(tried) + sum(tally.hostile.values()),
        "fault_windows": dict(Counter(tried)),
        "hostile_requests": dict(tally.hostile),
        "answers_by_status": dict(sorted(tally.statuses.items())),
        "undocumented_statuses": sorted(set(tally.statuses) - DOCUMENTED),
        "hostile_mishandled": dict(tally.broken),
        "internal_errors_besides_the_bug": (internal or 0) - tally.hostile[BUG],
        "healthz_max_s": round(tally.healthz_max_s, 3),
        "gateway_alive": alive,
        "committed_steps": sum(k + 1 for k in tally.committed.values()),
        "steps_lost": lost,
        "committed_steps_missing_from_traces": untraced,
    }


def _traced_steps(state: Path, sid: str) -> set[int]:
    path = state / "traces" / f"{sid}.jsonl"
    steps = set()
    for line in path.read_text().splitlines() if path.is_file() else []:
        event = json.loads(line)
        if event.get("event") == "observe":
            steps.add(event["step_idx"])
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--window", type=float, default=0.8, help="seconds each fault holds")
    parser.add_argument("--pace", type=float, default=0.3, help="seconds an agent acts per step")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = run(Path(tmp), args.sessions, args.steps, args.window, args.pace)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
