"""Throughput of OpenAIClient against the loopback ScriptedServer with a fixed server latency.

With ``latency`` seconds per request and ``concurrency`` requests in flight, the ideal rate is
``concurrency / latency`` requests per second (32 / 0.2 s = 160 req/s). The result is the median
achieved rate over several runs as a fraction of that ideal; the target is >= 0.9.

By default the server runs in a thread of the benchmark process, as in the tests, so client and
server share one interpreter lock; ``--server process`` moves it to a child process, as a real
inference server would be, and so measures the client alone. "CPU ms/req" is this process's CPU
time per request (client, plus the server in thread mode); "CPU wait s" is how long this
process's threads were runnable but waiting for a CPU (Linux schedstat), the sign of a busy host.

    python benchmarks/bench_client.py
    python benchmarks/bench_client.py --server process
    python benchmarks/bench_client.py --requests 640 --runs 5 --concurrency 64
    python benchmarks/bench_client.py --server process --images 2 --image-size 1280x800

``--images N`` puts N screenshots in every request, drawn from a small pool of frame objects
reused across requests, as data_gen does: the client encodes each object once (the payload
cache) and later requests splice the cached parts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from hivig.backends import OpenAIClient, Sampling
from hivig.config import screen_size
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.tiny import synthetic_screenshot

# The scripted OpenAI-compatible server is a test double (tests/fakes/); run from anywhere.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fakes.openai_server import Reply, ScriptedServer  # noqa: E402

TARGET = 0.9
REPLY = Reply(content="<summary>Progress Summary: ok</summary>", reasoning="fine")
SERVER_LIFETIME_S = 600.0


def _runqueue_wait_s() -> float:
    """Seconds this process's threads have waited for a CPU while runnable (Linux; else NaN).

    On a shared machine this is what separates "the client is slow" from "the client was not
    scheduled": the second field of /proc/<pid>/task/<tid>/schedstat, summed over threads.
    """
    total_ns = 0
    paths = glob.glob(f"/proc/{os.getpid()}/task/*/schedstat")
    if not paths:
        return float("nan")
    for path in paths:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total_ns += int(Path(path).read_text().split()[1])
    return total_ns / 1e9


def _serve_in_child(latency_s: float, urls: mp.Queue, stop: mp.Event) -> None:
    with ScriptedServer(default=REPLY, latency_s=latency_s, lifetime_s=SERVER_LIFETIME_S) as s:
        urls.put(s.base_url)
        stop.wait(SERVER_LIFETIME_S)


@contextlib.contextmanager
def _server(mode: str, latency_s: float) -> Iterator[tuple[str, ScriptedServer | None]]:
    """Yield the server URL (and the server object when it lives in this process)."""
    if mode == "thread":
        with ScriptedServer(default=REPLY, latency_s=latency_s, lifetime_s=SERVER_LIFETIME_S) as s:
            yield s.base_url, s
        return
    ctx = mp.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_serve_in_child, args=(latency_s, urls, stop), daemon=True)
    child.start()
    try:
        yield urls.get(timeout=60), None
    finally:
        stop.set()
        child.join(10)


@dataclass
class RunResult:
    seconds: float
    ok: int
    failed: int
    max_in_flight: int
    mean_latency_s: float
    cpu_ms_per_request: float
    runqueue_wait_s: float

    def rate(self, n: int) -> float:
        return n / self.seconds


def _requests(n: int, frames: list[Image.Image], per_request: int) -> list[tuple[list, Sampling]]:
    out = []
    for i in range(n):
        # Consecutive requests share frames (step i's after-image is step i+1's before-image).
        parts: list[TextPart | ImagePart] = [
            ImagePart(frames[(i + k) % len(frames)]) for k in range(per_request)
        ]
        parts.append(TextPart("Is this step correct?"))
        out.append(([ChatMessage("user", parts)], Sampling(max_tokens=64, seed=i)))
    return out


async def _one_run(url: str, requests: list, concurrency: int, timeout_s: float) -> RunResult:
    # A fresh client per run, so every run pays its own connection set-up.
    client = OpenAIClient(url, "scripted", concurrency=concurrency, timeout_s=timeout_s)
    n = len(requests)
    start, cpu_start, wait_start = time.perf_counter(), time.process_time(), _runqueue_wait_s()
    results = await client.generate_many(requests, return_exceptions=True)
    seconds = time.perf_counter() - start
    cpu_ms = (time.process_time() - cpu_start) * 1000 / n
    wait_s = _runqueue_wait_s() - wait_start
    await client.aclose()
    latencies = [r.latency_s for r in results if not isinstance(r, Exception)]
    return RunResult(
        seconds=seconds,
        ok=len(latencies),
        failed=n - len(latencies),
        max_in_flight=0,
        mean_latency_s=statistics.fmean(latencies) if latencies else float("nan"),
        cpu_ms_per_request=cpu_ms,
        runqueue_wait_s=wait_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=320, help="requests per run")
    parser.add_argument("--runs", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--concurrency", type=int, default=32, help="client concurrency")
    parser.add_argument("--latency", type=float, default=0.2, help="server latency, seconds")
    parser.add_argument(
        "--server", choices=("thread", "process"), default="thread", help="where the server runs"
    )
    parser.add_argument("--images", type=int, default=0, help="screenshots per request")
    parser.add_argument(
        "--image-size", default="1280x800", type=screen_size(), help="screenshot WxH"
    )
    parser.add_argument("--frames", type=int, default=16, help="distinct frame objects")
    args = parser.parse_args()

    width, height = args.image_size
    frames = [synthetic_screenshot(width, height, seed=i) for i in range(args.frames)]
    # Built once: every run sends the same frame objects, so runs after the first find them in
    # the client's payload cache (the first run pays one encoding per frame).
    requests = _requests(args.requests, frames, args.images)
    ideal = args.concurrency / args.latency
    rows: list[RunResult] = []
    # The host's load matters: client and server need CPU for every request, and a shared
    # machine's other work delays them.
    load_before = os.getloadavg()[0]
    with _server(args.server, args.latency) as (url, server):
        for _ in range(args.runs):
            result = asyncio.run(_one_run(url, requests, args.concurrency, 60.0))
            # Peak concurrency as the server saw it (cumulative; -1 when out of process).
            result.max_in_flight = server.max_in_flight if server is not None else -1
            rows.append(result)

    load_after = os.getloadavg()[0]
    print(
        f"server latency {args.latency * 1000:.0f} ms ({args.server}), concurrency "
        f"{args.concurrency}, {args.requests} requests/run, {args.images} x {width}x{height} "
        f"images/request from {args.frames} frames, ideal {ideal:.1f} req/s; "
        f"{os.cpu_count()} CPUs, 1-min load {load_before:.2f} -> {load_after:.2f}"
    )
    print(
        f"{'run':>3} {'seconds':>8} {'req/s':>8} {'of ideal':>8} {'ok':>5} {'failed':>6} "
        f"{'mean lat ms':>11} {'CPU ms/req':>10} {'CPU wait s':>10} {'peak in flight':>14}"
    )
    for i, r in enumerate(rows, 1):
        rate = r.rate(args.requests)
        print(
            f"{i:>3} {r.seconds:>8.3f} {rate:>8.1f} {rate / ideal:>8.3f} {r.ok:>5} {r.failed:>6} "
            f"{r.mean_latency_s * 1000:>11.1f} {r.cpu_ms_per_request:>10.2f} "
            f"{r.runqueue_wait_s:>10.2f} {r.max_in_flight:>14}"
        )
    median_rate = statistics.median(r.rate(args.requests) for r in rows)
    fraction = median_rate / ideal
    verdict = "PASS" if fraction >= TARGET and all(r.failed == 0 for r in rows) else "FAIL"
    print(
        f"RESULT median {median_rate:.1f} req/s = {fraction:.3f} of ideal {ideal:.1f} req/s "
        f"(target >= {TARGET}) {verdict}"
    )


if __name__ == "__main__":
    main()
