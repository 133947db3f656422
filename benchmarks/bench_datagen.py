"""data_gen throughput: the CPU part with the offline annotator, and the annotator stage's overlap.

1. CPU part: the whole pipeline (plan, transitions, history, perturbation, judge, rationales,
   export with ShareGPT images and the report) with the offline annotator on a generated corpus,
   pinned to one core. Result: exported samples per second (median of ``--runs``), with and
   without the export's image rendering (ShareGPT marked PNGs and report cards).
2. Annotator stage: the state-transition stage against the loopback OpenAI-compatible server
   with a fixed latency (default 0.2 s) and ``--concurrency`` requests in flight. The ideal rate is
   concurrency / latency; the result is the achieved rate as a fraction of it (target >= 0.85).
   The server runs in a child process, as a real inference server would. Modes: cold (frames
   decoded and payloads encoded inside the timed stage, as in a run), ``--prewarm`` (frames
   decoded ahead), ``--preencode`` (request payloads encoded ahead too: the request path alone).
   The fraction is end to end, start-up (the first frames) and drain (the last requests'
   latency) included, so a small corpus understates the steady rate: 30 episodes give ~144
   requests (4.5 waves of 32), where even a stage with no CPU cost could reach only ~0.9; the
   stage therefore uses 120 episodes (~520 requests) unless ``--trajectories`` says otherwise.
   Also printed: client and server CPU per request (the server's from /proc).

    python benchmarks/bench_datagen.py
    python benchmarks/bench_datagen.py --runs 3 --concurrency 32 --latency 0.2
    python benchmarks/bench_datagen.py --only annotator --runs 5
    python benchmarks/bench_datagen.py --only annotator --prewarm
    python benchmarks/bench_datagen.py --only annotator --image-format png   # lossless transport
    python benchmarks/bench_datagen.py --only cards    # export A/B: report cards reuse frames
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import data_gen.export
from data_gen.annotator import Annotator
from data_gen.config import DataGenConfig
from data_gen.executor import StageStats
from data_gen.ingest import ingest
from data_gen.perturb import ElementIndex
from data_gen.run import build_plan, gen_params, load_work, run
from data_gen.sample_corpus import SampleConfig, make_sample
from data_gen.steps import TransitionsStep
from data_gen.steps.work import Context, LoopThread
from hivig.backends import OpenAIClient, default_image_cache
from hivig.config import BackendConfig, load_config
from hivig.messages import ImageRef

# The scripted OpenAI-compatible server is a test double (tests/fakes/); run from anywhere.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fakes.openai_server import Reply, ScriptedServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"
TARGET = 0.85
CPU_EPISODES = 30
STAGE_EPISODES = 120  # ~520 requests: start-up and drain stay a small part of the stage
TRANSITION = (
    "<think>\n[Action Mechanism] The step acts on a button.\n[Structural Effect] A panel opens."
    "\n</think>\n<next_state>\nA panel will open.\n</next_state>"
)


def _serve(latency_s: float, urls: mp.Queue, stop: mp.Event) -> None:
    with ScriptedServer(
        default=Reply(content=TRANSITION), latency_s=latency_s, lifetime_s=900
    ) as s:
        urls.put(s.base_url)
        stop.wait()


def _corpus(work: Path, episodes: int) -> tuple[Path, Path]:
    """A ``make-sample`` corpus of ``episodes`` episodes and its ingested trajectories."""
    corpus = work / f"corpus{episodes}"
    if not corpus.exists():
        make_sample(corpus, SampleConfig(trajectories=episodes, seed=0), progress=False)
        ingest(corpus, work / f"ingest{episodes}", progress=False)
    trajs = work / f"ingest{episodes}" / "trajectories.jsonl"
    print(f"corpus: {episodes} episodes, {sum(1 for _ in trajs.open())} trajectories")
    return corpus, trajs


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far; NaN where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_part(corpus: Path, trajs: Path, work: Path, runs: int, images: bool) -> tuple[float, int]:
    rates, samples = [], 0
    for i in range(runs):
        cfg = load_config(
            DataGenConfig,
            DEMO,
            [
                f"corpus={corpus}",
                f"out={work / f'cpu{int(images)}_{i}'}",
                f"trajectories={trajs}",
                f"export.sharegpt={images}",
                f"export.report_cards={36 if images else 0}",
            ],
        )
        t0 = time.perf_counter()
        stats = run(cfg, None)
        rates.append(stats["samples"] / (time.perf_counter() - t0))
        samples = stats["samples"]
    return statistics.median(rates), samples


def card_reuse_ab(corpus: Path, trajs: Path, work: Path, runs: int) -> dict[str, float]:
    """Samples per process-CPU second of ``run()``, report cards reusing the ShareGPT frames
    ("after") or rendering their own as before ("before"); alternated, one core, same corpus.

    Process CPU rather than wall time, so other jobs on a shared machine disturb it less.
    """
    real = data_gen.export._sharegpt

    def no_reuse(*a, **k):  # the previous export: cards never saw the ShareGPT frames
        real(*a, **k)
        return {}

    rates: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for i in range(runs):
            for label in rates:
                data_gen.export._sharegpt = no_reuse if label == "before" else real
                cfg = load_config(
                    DataGenConfig,
                    DEMO,
                    [f"corpus={corpus}", f"out={work / f'ab_{label}{i}'}", f"trajectories={trajs}"],
                )
                c0 = time.process_time()
                stats = run(cfg, None)
                rates[label].append(stats["samples"] / (time.process_time() - c0))
    finally:
        data_gen.export._sharegpt = real
    return {label: statistics.median(v) for label, v in rates.items()}


def annotator_stage(
    corpus: Path, trajs: Path, work: Path, args: argparse.Namespace
) -> tuple[float, int, float, float, float, float]:
    urls: mp.Queue = mp.Queue()
    stop = mp.Event()
    server = mp.Process(target=_serve, args=(args.latency, urls, stop), daemon=True)
    server.start()
    url = urls.get(timeout=60)
    fractions, cpu_ms, server_ms, requests = [], [], [], 0
    try:
        for i in range(args.runs):
            cfg = load_config(
                DataGenConfig,
                DEMO,
                [
                    f"corpus={corpus}",
                    f"out={work / f'ann{i}'}",
                    f"trajectories={trajs}",
                    f"frame.max_pixels={args.max_pixels}",
                    f"frame.min_pixels={min(args.max_pixels, 65536)}",
                ],
            )
            backend_cfg = BackendConfig(
                kind="openai", base_url=url, model="scripted", concurrency=args.concurrency
            )
            client = OpenAIClient(
                url,
                "scripted",
                concurrency=args.concurrency,
                max_retries=0,
                image_format=args.image_format,
                jpeg_quality=args.jpeg_quality,
            )
            works, _ = load_work(cfg)
            shots = sorted({s.screenshot for w in works for s in w.trajectory.steps})
            annotator = Annotator(
                backend_cfg,
                cfg.frame,
                corpus,
                None,
                1,
                backend=client,
                prefetch=args.prefetch,
                prepare_threads=args.prepare_threads,
            )
            if args.prewarm or args.preencode:
                annotator.warm(shots)
            if args.preencode:
                for shot in shots:
                    default_image_cache().image_part(
                        annotator.prepared_frame(ImageRef(shot)),
                        args.image_format,
                        args.jpeg_quality,
                    )
            elements = ElementIndex.load(corpus / cfg.elements_file)
            loop = LoopThread()
            ctx = Context(
                cfg,
                corpus,
                annotator,
                elements,
                build_plan(cfg, works, elements, False),
                gen_params(cfg),
                loop,
            )
            stats = StageStats("transitions")
            t0, c0, s0 = time.perf_counter(), time.process_time(), _cpu_s(server.pid)
            TransitionsStep(ctx).run(works, stats)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            server_ms.append(
                1000 * (_cpu_s(server.pid) - s0) / max(1, annotator.counts["requests"])
            )
            loop.run(client.aclose())
            loop.close()
            annotator.close()
            requests = annotator.counts["requests"]
            fractions.append((requests / elapsed) / (args.concurrency / args.latency))
            cpu_ms.append(1000 * cpu / max(1, requests))
            # Frame preparations per distinct screenshot: 1.0 means decoded exactly once.
            prepared = annotator.frames.counts["frames_prepared"] / max(1, len(shots))
    finally:
        stop.set()
        server.join(timeout=10)
    return (
        statistics.median(fractions),
        requests,
        min(fractions),
        statistics.median(cpu_ms),
        statistics.median(server_ms),
        prepared,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trajectories",
        type=int,
        default=None,
        help=f"episodes of the generated corpus (default: {CPU_EPISODES} for the CPU part, "
        f"{STAGE_EPISODES} for the annotator stage)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--core", type=int, default=0, help="CPU core for the CPU-part runs")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=DataGenConfig().annotator.prefetch,
        help="requests prepared ahead of a free request slot (default: the annotator config's)",
    )
    parser.add_argument(
        "--prepare-threads",
        type=int,
        default=DataGenConfig().annotator.prepare_threads,
        help="threads preparing requests; 0 = one per usable CPU (the annotator config's)",
    )
    parser.add_argument("--only", choices=("cpu", "annotator", "cards"), default=None)
    parser.add_argument(
        "--prewarm",
        action="store_true",
        help="decode the screenshots before timing (isolates the request path)",
    )
    parser.add_argument(
        "--preencode",
        action="store_true",
        help="also encode every frame's request payload before timing (implies --prewarm; "
        "leaves only the per-request work: body assembly, HTTP, parsing, validation)",
    )
    parser.add_argument(
        "--image-format",
        choices=("png", "jpeg"),
        default=DataGenConfig().annotator.image_format,
        help="transport format of the annotator-stage images (default: the annotator config's)",
    )
    parser.add_argument("--jpeg-quality", type=int, default=DataGenConfig().annotator.jpeg_quality)
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=1_048_576,
        help="canonical-frame budget of the annotator-stage images, in pixels",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.only in (None, "cpu", "cards"):
            corpus, trajs = _corpus(work, args.trajectories or CPU_EPISODES)
        if args.only in (None, "cpu"):
            affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {args.core})
            full, samples = cpu_part(corpus, trajs, work, args.runs, images=True)
            core, _ = cpu_part(corpus, trajs, work, args.runs, images=False)
            os.sched_setaffinity(0, affinity)
            print(f"CPU part, 1 core, offline annotator: {samples} samples exported")
            print(f"  full export (ShareGPT PNGs + report): {full:8.1f} samples/s")
            print(f"  without export image rendering      : {core:8.1f} samples/s")
        if args.only == "cards":
            affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {args.core})
            ab = card_reuse_ab(corpus, trajs, work, args.runs)
            os.sched_setaffinity(0, affinity)
            print(f"report cards, samples per CPU-second (median of {args.runs}, alternated):")
            print(f"  cards render their own frames (before): {ab['before']:8.1f}")
            print(f"  cards link the ShareGPT frames (after) : {ab['after']:8.1f}")
        if args.only in (None, "annotator"):
            corpus, trajs = _corpus(work, args.trajectories or STAGE_EPISODES)
            frac, requests, worst, cpu_ms, server_ms, prepared = annotator_stage(
                corpus, trajs, work, args
            )
            ideal = args.concurrency / args.latency
            print(
                f"annotator stage (transitions): {requests} requests, concurrency "
                f"{args.concurrency}, latency {args.latency}s, ideal {ideal:.0f} req/s, "
                f"frames <= {args.max_pixels} px, transport {args.image_format}, "
                f"prewarmed {args.prewarm or args.preencode}, "
                f"pre-encoded {args.preencode}"
            )
            print(
                f"  achieved / ideal (median of {args.runs}): {frac:.3f}  (worst {worst:.3f}; "
                f"target >= {TARGET}); CPU per request: client {cpu_ms:.1f} ms, "
                f"server {server_ms:.1f} ms; "
                f"frame preparations per screenshot {prepared:.2f}"
            )


if __name__ == "__main__":
    main()
