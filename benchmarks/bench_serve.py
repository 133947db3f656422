"""Gateway benchmarks: request overhead, throughput under a slow backend, tiny-model latency.

    .venv/bin/python benchmarks/bench_serve.py --runs 5            # all three parts
    .venv/bin/python benchmarks/bench_serve.py --only overhead --runs 5
    .venv/bin/python benchmarks/bench_serve.py --only throughput --size 1280x800

(a) overhead: one critique on a 1920x1080 PNG through the FastAPI app in process (routing, JSON,
    base64, decode, canonical frame, marker, prompt, the PNG encode of the transport, parsing,
    session and trace writes), with a backend that only builds the OpenAI request body (so the
    PNG encode vLLM needs is counted) and answers at once. Baseline in the same run: bare
    ``canonical_frame`` + ``encode_png`` of the same screenshot. p50 and p99, and their ratio.
(b) throughput: 32 concurrent sessions over a real uvicorn server on 127.0.0.1, the client in its
    own process, each step an observe (inline PNG) and a critique (by image_ref), against a
    backend adding 200 ms per call; achieved calls/s as a fraction of 32 x 2 / 0.4 s. The gateway
    is the app in this process with an in-process backend (``--transport inproc``) or
    ``python -m serve`` with its OpenAI client against a loopback OpenAI-compatible server
    (``--transport openai``: what a vLLM deployment runs, the HTTP calls included). The
    gateway's CPU per step is set against the bare image work of a step (decode, canonical
    frame, one PNG encode, with the gateway's resize kernel), sampled in a process of its own
    every 0.5 s while the gateway serves (the same machine under the same load:
    ``gateway_cpu_to_bare_during_run``) and again on the quiet machine after the run
    (``gateway_cpu_to_bare``). With ``--transport openai`` the event loop's part of that CPU
    (the main thread) is reported too (``gateway_event_loop_cpu_ms_per_step``).
(c) latency with the tiny random Qwen3-VL (in-process transformers backend, CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hivig.backends import Generation, Usage, default_image_cache  # noqa: E402
from hivig.backends.openai_client import encode_request  # noqa: E402
from hivig.config import FrameConfig, load_config, screen_size  # noqa: E402
from hivig.vision import FAST_PNG_LEVEL, canonical_frame, encode_png, resize_kernel  # noqa: E402
from serve.app import create_app  # noqa: E402
from serve.config import ServeConfig  # noqa: E402

GOOD = "<criticism>\nOverall Grading: Good\nExplanation: The click opens the menu.\n</criticism>"
SUMMARY = (
    "<summary>\nProgress Summary: The menu is open.\nLast Action Result: The click opened "
    "the menu.\n</summary>"
)
CLICK = {"type": "left_click", "x": 960, "y": 540, "intent": "Open the menu"}
DEGRADED = b'"status":"degraded"'  # as the gateway writes it (compact JSON)


class EncodingBackend:
    """Builds the OpenAI request body as ``OpenAIBackend`` does (every image PNG-encoded once,
    on a worker thread while any is new) and answers after ``delay_s``."""

    model_name = "bench"
    # As the OpenAI client: it sends PNGs from the process-wide cache, and the gateway hands
    # the frames' PNGs over to it.
    png_payloads = default_image_cache()

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls = 0

    async def generate(self, messages, sampling, *, request_hash=None):
        self.calls += 1
        await encode_request("bench", messages, sampling, known_hash=request_hash)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        kind = "critique" if "Current Proposed Step" in messages[-1].text() else "history"
        text = GOOD if kind == "critique" else SUMMARY
        return Generation(text, "ok", Usage(1, 1), "stop", "bench", sampling, "h", self.delay_s)


def screenshot(width: int, height: int, seed: int) -> bytes:
    """A busy synthetic desktop (text-like rows, windows) as PNG bytes; differs per seed."""
    img = Image.new("RGB", (width, height), (236, 238, 242))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, width, 40), fill=(30, 40, 60))
    for row in range(60, height - 40, 22):
        for col in range(40, width - 200, 180):
            shade = (row * 7 + col * 3 + seed * 31) % 120
            d.rectangle(
                (col, row, col + 120 + (seed + row) % 50, row + 10), fill=(shade, shade, 90)
            )
    d.rectangle(
        (width // 3, height // 3, width // 3 + 300, height // 3 + 200), fill=(255, 255, 255)
    )
    d.text((width // 3 + 20, height // 3 + 20), f"Dialog {seed}", fill=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _cfg(state: Path, *extra: str) -> ServeConfig:
    return load_config(
        ServeConfig,
        None,
        [f"sessions.state_dir={state}", "warmup=false", "limits.max_queue=1024", *extra],
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ---------------------------------------------------------------------------------------------
# (a) overhead


async def _overhead_once(
    iterations: int, shots: list[bytes], state: Path
) -> dict[str, list[float]]:
    app = create_app(_cfg(state), EncodingBackend())
    frame = FrameConfig()
    b64 = [base64.b64encode(s).decode() for s in shots]
    out: dict[str, list[float]] = {
        "baseline": [],
        "session_critique": [],
        "stateless_critique": [],
        "observe": [],
    }
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            body = {"task": "Open the menu", "platform": "ubuntu", "screen": {"w": 1920, "h": 1080}}
            sid = (await c.post("/v1/sessions", json=body)).json()["session_id"]
            for k in range(iterations):
                data = shots[k % len(shots)]
                t = time.perf_counter()
                encode_png(
                    canonical_frame(data, min_pixels=frame.min_pixels, max_pixels=frame.max_pixels),
                    FAST_PNG_LEVEL,
                )
                out["baseline"].append(time.perf_counter() - t)
                obs = {"step_idx": k, "screenshot": b64[k % len(b64)]}
                if k:
                    obs["prev_action"] = CLICK
                obs_bytes = json.dumps(obs).encode()
                t = time.perf_counter()
                r = await c.post(f"/v1/sessions/{sid}/observe", content=obs_bytes)
                out["observe"].append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
                crit = json.dumps({"step_idx": k, "action": CLICK}).encode()
                t = time.perf_counter()
                r = await c.post(f"/v1/sessions/{sid}/critique", content=crit)
                out["session_critique"].append(time.perf_counter() - t)
                assert r.status_code == 200 and r.json()["verdict"] == "good", r.text
                stateless = json.dumps(
                    {**body, "screenshot": b64[(k + 1) % len(b64)], "action": CLICK}
                ).encode()
                t = time.perf_counter()
                r = await c.post("/v1/critique", content=stateless)
                out["stateless_critique"].append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
    return out


def bench_overhead(runs: int, iterations: int) -> dict:
    shots = [screenshot(1920, 1080, seed) for seed in range(iterations + 1)]
    per_run = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            per_run.append(asyncio.run(_overhead_once(iterations, shots, Path(tmp))))
    result = {}
    for key in per_run[0]:
        p50 = statistics.median(_pct(r[key][1:], 0.5) for r in per_run)  # first call warms up
        p99 = statistics.median(_pct(r[key][1:], 0.99) for r in per_run)
        result[key] = {"p50_ms": round(p50 * 1000, 2), "p99_ms": round(p99 * 1000, 2)}
    base = result["baseline"]
    for key in ("session_critique", "stateless_critique", "observe"):
        result[key]["p50_ratio"] = round(result[key]["p50_ms"] / base["p50_ms"], 3)
        result[key]["p99_ratio"] = round(result[key]["p99_ms"] / base["p99_ms"], 3)
    return result


# ---------------------------------------------------------------------------------------------
# (b) throughput


class RawConnection:
    """One keep-alive HTTP/1.1 connection posting pre-encoded JSON bodies.

    The load generator shares the machine's cores with the gateway it measures; httpx costs
    several milliseconds of CPU per agent step, this a fraction of one.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def __aenter__(self) -> RawConnection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(), len(body), body)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return int(head[9:12]), await self.reader.readexactly(length)


def _client_process(
    url: str,
    sessions: int,
    steps: int,
    size: tuple[int, int],
    client: str,
    spread_s: float,
    queue: mp.Queue,
) -> None:
    shots = [base64.b64encode(screenshot(*size, seed)).decode() for seed in range(steps)]
    # On screen at every size: an off-screen click is answered by a rule, without the model.
    click = {**CLICK, "x": size[0] // 2, "y": size[1] // 2}
    create = json.dumps(
        {"task": "Open the menu", "platform": "ubuntu", "screen": {"w": size[0], "h": size[1]}}
    ).encode()
    observes = [
        json.dumps(
            {"step_idx": k, "screenshot": shots[k], **({"prev_action": click} if k else {})}
        ).encode()
        for k in range(steps)
    ]
    critiques = [json.dumps({"step_idx": k, "action": click}).encode() for k in range(steps)]

    async def episode(post: Any, delay: float) -> tuple[float, int]:
        await asyncio.sleep(delay)
        start = time.perf_counter()
        status, data = await post("/v1/sessions", create)
        sid = json.loads(data)["session_id"]
        errors = int(status != 201)
        for k in range(steps):
            s1, d1 = await post(f"/v1/sessions/{sid}/observe", observes[k])
            s2, d2 = await post(f"/v1/sessions/{sid}/critique", critiques[k])
            # A model call that timed out or failed is still a 200 (fail-open), marked degraded.
            errors += (s1 != 200) + (s2 != 200) + (DEGRADED in d1) + (DEGRADED in d2)
        return time.perf_counter() - start, errors

    async def raw_episode(delay: float) -> tuple[float, int]:
        host, port = url.removeprefix("http://").split(":")
        async with RawConnection(host, int(port)) as conn:
            return await episode(conn.post, delay)

    async def main() -> tuple[float, int, float]:
        limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:

            async def post(path: str, body: bytes) -> tuple[int, bytes]:
                r = await c.post(path, content=body, headers={"content-type": "application/json"})
                return r.status_code, r.content

            cpu = time.process_time()
            starts = [i * spread_s / sessions for i in range(sessions)]
            runs = (raw_episode(d) if client == "raw" else episode(post, d) for d in starts)
            done = await asyncio.gather(*runs)
            mean_episode = statistics.mean(took for took, _ in done)
            return mean_episode, sum(e for _, e in done), time.process_time() - cpu

    queue.put(asyncio.run(main()))


def _drive(
    url: str,
    sessions: int,
    steps: int,
    size: tuple[int, int],
    client: str,
    start: str,
    delay: float,
    gateway_cpu: Any,
) -> tuple[float, int, tuple[float, float | None], float, list[float]]:
    """Run the load generator against ``url``: mean episode time, errors, gateway CPU (all of
    it, and its event loop's where known), client CPU, and the bare image work's CPU seconds
    sampled meanwhile."""
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    # Staggered: session i starts i/sessions of a step (two calls) after the first, as
    # independent agents do; burst: all at once, every step in lockstep.
    spread = 2 * delay if start == "staggered" else 0.0
    p = ctx.Process(target=_client_process, args=(url, sessions, steps, size, client, spread, q))
    # The bare image work sampled while the gateway serves: the same machine under the same
    # load, a step every half second (a few per cent of one core).
    stop, bare_q = ctx.Event(), ctx.Queue()
    sampler = ctx.Process(target=_bare_sampler, args=(size, steps, 0.5, stop, bare_q))
    try:
        sampler.start()
        p.start()
        cpu0 = gateway_cpu()
        deadline = time.monotonic() + 600
        while True:
            try:
                took, errs, client_cpu = q.get(timeout=1)
                break
            except queue.Empty:
                if not p.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the load generator died or hung") from None
        cpu1 = gateway_cpu()
        cpu = (cpu1[0] - cpu0[0], None if cpu0[1] is None else cpu1[1] - cpu0[1])
        stop.set()
        bare = bare_q.get(timeout=60)
    finally:
        stop.set()
        for proc, wait_s in ((p, 10), (sampler, 60)):
            if proc.pid is None:
                continue  # never started
            proc.join(timeout=wait_s)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    return took, errs, cpu, client_cpu, bare


def _bare_sampler(
    size: tuple[int, int], steps: int, interval_s: float, stop: Any, out: mp.Queue
) -> None:
    """Time one step's bare image work every ``interval_s`` until ``stop``; the times go to
    ``out`` (this process's CPU only: the work and its numpy threads)."""
    shots = [screenshot(*size, seed) for seed in range(steps)]
    _bare_step(shots[0])  # warm: the first call loads the kernel's plans
    times: list[float] = []
    while True:  # at least one sample, however short the run
        times.append(_bare_step(shots[len(times) % steps]))
        if stop.wait(interval_s):
            break
    out.put(times)


def _gateway_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of ``python -m serve`` (its process tree) and of its event loop alone: the
    main thread, whose thread id is the process id (uvicorn runs the loop there)."""
    return _tree_cpu(pid), _thread_cpu(pid, pid)


def _thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds (user + system) of one thread of a live process (Linux ``/proc``)."""
    return _stat_cpu(Path(f"/proc/{pid}/task/{tid}/stat").read_text())


def _stat_cpu(stat: str) -> float:
    """User + system CPU seconds from a ``/proc`` ``stat`` line (fields after the name)."""
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live descendants (Linux ``/proc``).

    Children are read from the main thread's list, which holds them all for ``python -m serve``
    (its threads start no processes).
    """
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _stat_cpu(Path(f"/proc/{p}/stat").read_text())
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def _in_process_run(tmp: Path, delay: float, drive: Any) -> tuple[int, tuple, float]:
    """The gateway as an app in this process (uvicorn in a thread) with an in-process backend."""
    from serve.server import BackgroundServer as LiveServer

    backend = EncodingBackend(delay)
    app = create_app(
        _cfg(tmp, "critic.critique_deadline_s=30", "critic.observe_deadline_s=30"), backend
    )
    with LiveServer(app) as srv:
        # The server is a thread of this process: its event loop's share is not told apart.
        out = drive(srv.url, lambda: (time.process_time(), None))
    return backend.calls, out, 0.0


def _cli_run(tmp: Path, delay: float, drive: Any) -> tuple[int, tuple, float]:
    """``python -m serve`` with the OpenAI transport (``configs/serve/vllm.yaml``), against a
    loopback OpenAI-compatible server in this process that answers after ``delay``."""
    import subprocess

    from serve.server import free_port
    from tests.fakes.openai_server import ScriptedServer, request_text

    def respond(body: dict) -> str:
        return GOOD if "Current Proposed Step" in request_text(body) else SUMMARY

    port = free_port()
    model = ScriptedServer(respond=respond, latency_s=delay, lifetime_s=1800, keep_requests=0)
    with model:
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serve",
                "--config",
                str(ROOT / "configs/serve/vllm.yaml"),
                "host=127.0.0.1",
                f"port={port}",
                "model=bench",
                f"backend.base_url={model.base_url}",
                f"sessions.state_dir={tmp}",
                "warmup=false",
                # One process: its main thread is the event loop (``_gateway_cpu``).
                "workers=1",
                "log_level=warning",
                "limits.max_queue=1024",
                "backend.concurrency=256",
                "critic.critique_deadline_s=30",
                "critic.observe_deadline_s=30",
            ],
            cwd=ROOT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, gateway)
            # The model server is a thread of this process, which otherwise only waits.
            server_cpu = time.process_time()
            out = drive(url, lambda: _gateway_cpu(gateway.pid))
            server_cpu = time.process_time() - server_cpu
        finally:
            gateway.terminate()
            try:
                gateway.wait(60)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait()
        return model.request_count, out, server_cpu


def _wait_ready(url: str, proc: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the gateway at {url} did not become ready")


@contextlib.contextmanager
def _kernel_env(kernel: str) -> Iterator[str]:
    """``HIVIG_RESIZE_KERNEL=kernel`` inside the block (sampler processes inherit it); the
    caller's setting is restored afterwards."""
    previous = os.environ.get("HIVIG_RESIZE_KERNEL")
    os.environ["HIVIG_RESIZE_KERNEL"] = kernel
    try:
        yield kernel
    finally:
        if previous is None:
            os.environ.pop("HIVIG_RESIZE_KERNEL", None)
        else:
            os.environ["HIVIG_RESIZE_KERNEL"] = previous


def bench_throughput(
    runs: int,
    sessions: int,
    steps: int,
    size: tuple[int, int],
    delay: float,
    client: str,
    start: str,
    transport: str = "inproc",
) -> dict:
    # The bare work resizes with the gateway's kernel, here and in the sampler processes.
    with _kernel_env(_gateway_kernel(transport)) as kernel:
        fractions, errors, loaded = [], 0, []
        cpu_s, loop_s, client_cpu_s, server_cpu_s = [], [], [], []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:

                def drive(url: str, gateway_cpu: Any) -> tuple:
                    return _drive(url, sessions, steps, size, client, start, delay, gateway_cpu)

                if transport == "openai":
                    calls, (took, errs, cpu, client_cpu, bare_s), server = _cli_run(
                        Path(tmp), delay, drive
                    )
                else:
                    calls, (took, errs, cpu, client_cpu, bare_s), server = _in_process_run(
                        Path(tmp), delay, drive
                    )
            cpu_s.append(cpu[0])
            loop_s.append(cpu[1])
            loaded += bare_s
            client_cpu_s.append(client_cpu)
            server_cpu_s.append(server)
            # The first observe of a session makes no model call (no step was executed yet).
            ideal = (2 * steps - 1) * delay
            if calls != sessions * (2 * steps - 1):
                raise RuntimeError(f"{calls} model calls, expected {sessions * (2 * steps - 1)}")
            fractions.append(ideal / took)
            errors += errs
        bare = _bare_image_work(size, steps)
        bare_loaded_ms = statistics.median(loaded) * 1000
        gateway_ms = statistics.median(cpu_s) * 1000 / (sessions * steps)
        loop_ms = (
            None
            if None in loop_s
            else round(statistics.median(loop_s) * 1000 / (sessions * steps), 1)
        )
        return {
            "sessions": sessions,
            "steps": steps,
            "size": f"{size[0]}x{size[1]}",
            "backend_delay_s": delay,
            "client": client,
            "start": start,
            "transport": transport,
            "fraction_of_ideal_median": round(statistics.median(fractions), 3),
            "fractions": [round(f, 3) for f in fractions],
            # Gateway process CPU per agent step (observe + critique), whatever the machine's load.
            "gateway_cpu_ms_per_step": round(gateway_ms, 1),
            # Of which its event loop (requests in and out, session store, traces); the rest is
            # the image threads (``--transport openai`` only: in process the two are one process).
            "gateway_event_loop_cpu_ms_per_step": loop_ms,
            # The client shares the machine's cores: its CPU is part of what the machine can give.
            "client_cpu_ms_per_step": round(
                statistics.median(client_cpu_s) * 1000 / (sessions * steps), 1
            ),
            # --transport openai: the loopback model server shares the machine too.
            "model_server_cpu_ms_per_step": round(
                statistics.median(server_cpu_s) * 1000 / (sessions * steps), 1
            ),
            # The bare image work of one step (decode, canonical frame, one PNG encode; the kernel
            # the gateway used): what the gateway's CPU is held to. Sampled in a process of its own
            # while the gateway served (the same machine under the same load), and once more on
            # the quiet machine after the run.
            "kernel": kernel,
            "bare_image_ms_per_step_during_run": round(bare_loaded_ms, 1),
            "bare_samples_during_run": len(loaded),
            **bare,
            "gateway_cpu_to_bare_during_run": round(gateway_ms / bare_loaded_ms, 2),
            "gateway_cpu_to_bare": round(gateway_ms / bare["bare_image_ms_per_step"], 2),
            "errors": errors,
        }


def _bare_step(data: bytes) -> float:
    """CPU seconds of one step's bare image work: decode, canonical frame, one PNG encode."""
    frame = FrameConfig()
    start = time.process_time()
    frame_img = canonical_frame(data, min_pixels=frame.min_pixels, max_pixels=frame.max_pixels)
    encode_png(frame_img, FAST_PNG_LEVEL)
    return time.process_time() - start


def _gateway_kernel(transport: str) -> str:
    """The kernel the gateway resizes with: ``python -m serve`` never imports torch, so it
    takes the numpy kernel unless told; the in-process app takes this process's."""
    told = (os.environ.get("HIVIG_RESIZE_KERNEL") or "auto").strip().lower()
    if told != "auto":
        return told
    return "numpy" if transport == "openai" else resize_kernel()


def _bare_image_work(size: tuple[int, int], steps: int) -> dict[str, Any]:
    """The bare image work on a quiet machine (after the run), in this process."""
    shots = [screenshot(*size, seed) for seed in range(steps)]
    times = [_bare_step(data) for data in shots * 3]
    return {"bare_image_ms_per_step": round(statistics.median(times) * 1000, 1)}


# ---------------------------------------------------------------------------------------------
# (c) tiny model


def bench_tiny(runs: int) -> dict:
    from hivig.tiny import save_tiny_checkpoint

    shot = base64.b64encode(screenshot(1920, 1080, 0)).decode()
    latencies = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = save_tiny_checkpoint(Path(tmp) / "tiny")
        cfg = _cfg(
            Path(tmp) / "state",
            f"model={ckpt}",
            "critic.critique_max_tokens=64",
            "critic.critique_deadline_s=120",
        )
        app = create_app(cfg)

        async def main() -> None:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://b", timeout=300
                ) as c:
                    body = {
                        "task": "Open the menu",
                        "platform": "ubuntu",
                        "screen": {"w": 1920, "h": 1080},
                    }
                    sid = (await c.post("/v1/sessions", json=body)).json()["session_id"]
                    await c.post(
                        f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": shot}
                    )
                    for i in range(runs + 1):
                        action = {**CLICK, "x": 900 + i}
                        t = time.perf_counter()
                        r = await c.post(
                            f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": action}
                        )
                        latencies.append(time.perf_counter() - t)
                        assert r.status_code == 200
                        usage = r.json()["usage"]

            main.usage = usage  # type: ignore[attr-defined]

        asyncio.run(main())
    lat = latencies[1:]
    return {
        "critique_p50_ms": round(statistics.median(lat) * 1000, 1),
        "critique_max_ms": round(max(lat) * 1000, 1),
        "usage_last": getattr(main, "usage", None),
        "max_new_tokens": 64,
    }


def _size(text: str) -> tuple[int, int]:
    """``WxH`` -> ``(W, H)``; argparse turns an error into one usage line and exit 2."""
    w, sep, h = text.lower().partition("x")
    if not (sep and w.isdigit() and h.isdigit() and int(w) >= 32 and int(h) >= 32):
        raise argparse.ArgumentTypeError(f"{text!r} is not WxH with sides >= 32, e.g. 1280x800")
    return int(w), int(h)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30, help="critiques per overhead run")
    parser.add_argument("--only", choices=("overhead", "throughput", "tiny"))
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--size", default="1920x1080", type=screen_size(), help="throughput screenshot size WxH"
    )
    parser.add_argument("--delay", type=float, default=0.2, help="backend latency per call, s")
    parser.add_argument(
        "--transport",
        choices=("inproc", "openai"),
        default="inproc",
        help="throughput gateway: the app in this process with an in-process backend, or "
        "`python -m serve` and its OpenAI client against a loopback OpenAI-compatible server "
        "(what a vLLM deployment runs; the gateway then also pays for the HTTP calls)",
    )
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="throughput load generator: pre-encoded requests on raw keep-alive connections "
        "(cheap, so the gateway gets the machine's CPU) or httpx (what serve.client uses)",
    )
    parser.add_argument(
        "--start",
        choices=("staggered", "burst"),
        default="staggered",
        help="throughput sessions start spread over one step (independent agents) or all at "
        "once (lockstep: every request of a step arrives together, the worst case)",
    )
    args = parser.parse_args()
    size = args.size
    out = {}
    if args.only in (None, "overhead"):
        out["overhead"] = bench_overhead(args.runs, args.iterations)
        print(json.dumps({"overhead": out["overhead"]}, indent=1), flush=True)
    if args.only in (None, "throughput"):
        out["throughput"] = bench_throughput(
            args.runs,
            args.sessions,
            args.steps,
            size,
            args.delay,
            args.client,
            args.start,
            args.transport,
        )
        print(json.dumps({"throughput": out["throughput"]}, indent=1), flush=True)
    if args.only in (None, "tiny"):
        out["tiny"] = bench_tiny(args.runs)
        print(json.dumps({"tiny": out["tiny"]}, indent=1), flush=True)


if __name__ == "__main__":
    main()
