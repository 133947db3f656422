"""Several gateway processes on one node (``python -m serve workers=2``) sharing one state folder:
a session's requests are ordered across processes, retries stay idempotent, jobs are found by
every worker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serve.server import free_port
from tests.fakes.gateway import CLICK, GOOD, SUMMARY, b64, screen, session_body
from tests.fakes.openai_server import Reply, ScriptedServer, request_text

ROOT = Path(__file__).resolve().parents[3]


def _answer(body: dict) -> Reply:
    # Slow enough that two copies of one request overlap in two processes.
    critique = "Current Proposed Step" in request_text(body)
    return Reply(content=GOOD if critique else SUMMARY, delay_s=0.3)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@contextlib.contextmanager
def _gateway(tmp_path: Path, workers: int) -> Iterator[tuple[str, ScriptedServer, int]]:
    port = free_port()
    log = tmp_path / "gateway.log"
    env = {k: v for k, v in os.environ.items() if k != "HIVIG_SERVE_TOKEN"}
    with ScriptedServer(respond=_answer, lifetime_s=120) as backend, log.open("w") as out:
        args = [
            sys.executable, "-m", "serve", "--config", "configs/serve/vllm.yaml",
            "host=127.0.0.1", f"port={port}", "warmup=false", f"workers={workers}",
            f"sessions.state_dir={tmp_path / 'state'}", "frame.min_pixels=1024",
            "frame.max_pixels=65536", f"backend.base_url={backend.base_url}",
        ]  # fmt: skip
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the gateway did not start:\n{log.read_text()[-3000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/healthz").status_code == 200:
                        break
                time.sleep(0.2)
            yield url, backend, proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _parallel(*calls) -> list[httpx.Response]:
    out: list[httpx.Response | None] = [None] * len(calls)

    def run(i, fn):
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out  # type: ignore[return-value]


@pytest.mark.slow
def test_two_workers_order_each_sessions_requests_across_processes(tmp_path):
    with _gateway(tmp_path, workers=2) as (url, backend, pid):
        # uvicorn's supervisor and its two workers (wait: the second may still be starting)
        for _ in range(100):
            if len(_children(pid)) >= 2:
                break
            time.sleep(0.1)
        assert len(_children(pid)) >= 2
        sids = [httpx.post(f"{url}/v1/sessions", json=session_body()).json()["session_id"]
                for _ in range(6)]  # fmt: skip
        for sid in sids:
            first = {"step_idx": 0, "screenshot": b64(screen(seed=0))}
            assert httpx.post(f"{url}/v1/sessions/{sid}/observe", json=first).status_code == 200
        histories_before = sum(
            "Current Proposed Step" not in request_text(r) for r in backend.requests
        )
        step = {"step_idx": 1, "screenshot": b64(screen(seed=1)), "prev_action": CLICK}
        other = {**step, "screenshot": b64(screen(seed=2))}
        for sid in sids:
            path = f"{url}/v1/sessions/{sid}/observe"
            # The same step twice at once (a runner's retry), then another screen for it.
            a, b = _parallel(
                lambda p=path: httpx.post(p, json=step, timeout=30),
                lambda p=path: httpx.post(p, json=step, timeout=30),
            )
            assert a.status_code == b.status_code == 200, (a.text, b.text)
            assert a.json()["history"] == b.json()["history"]
            conflict = httpx.post(path, json=other, timeout=30)
            assert conflict.status_code == 409
        histories = sum("Current Proposed Step" not in request_text(r) for r in backend.requests)
        # One history update per session step, whichever process took each copy.
        assert histories - histories_before == len(sids)
        job = httpx.post(f"{url}/v1/diagnose", json={"session_id": sids[0]}).json()["job_id"]
        for _ in range(30):  # every worker finds the job, whichever one started it
            r = httpx.get(f"{url}/v1/jobs/{job}")
            assert r.status_code == 200, r.text
        assert (tmp_path / "state" / ".gateway-config.yaml").is_file()


def test_workers_need_the_shared_store():
    from hivig.config import ConfigError, load_config
    from serve.config import ServeConfig

    with pytest.raises(ConfigError, match="sessions.store=sqlite"):
        load_config(ServeConfig, None, ["workers=2", "sessions.store=memory"])
    with pytest.raises(ConfigError, match="workers"):
        load_config(ServeConfig, None, ["workers=0"])


def test_a_filesystem_without_locks_is_a_storage_error_not_a_500(tmp_path, monkeypatch):
    import errno
    import fcntl

    from tests.fakes.gateway import gateway_client, observe

    real = fcntl.flock

    def no_locks(fd, op):
        if op & fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, "No locks available")
        return real(fd, op)

    with gateway_client(tmp_path, raise_server_exceptions=False) as c:
        sid = c.post("/v1/sessions", json=session_body()).json()["session_id"]
        monkeypatch.setattr(fcntl, "flock", no_locks)
        r = observe(c, sid, 0)
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable"
    assert (tmp_path / "state" / "locks").is_dir()
    assert len(os.listdir("/proc/self/fd")) < 200  # the descriptor was closed, not leaked


@pytest.mark.slow
def test_a_worker_whose_app_fails_stops_the_supervisor(tmp_path):
    # The parent's checks pass; the worker's own config load fails (a file it cannot parse).
    from serve import workers

    bad = tmp_path / "bad.yaml"
    bad.write_text("limits: {max_queue: -1}\n")
    env = {**os.environ, workers.CONFIG_ENV: str(bad)}
    code = "import uvicorn; uvicorn.run('serve.workers:app', factory=True, workers=2, port=%d)"
    run = subprocess.run(
        [sys.executable, "-c", code % free_port()],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "failed to start, stopping the parent process" in run.stderr, run.stderr[-2000:]
    assert run.stderr.count("Child process died") == 0
