"""A whole ``data_gen run`` against a slow loopback annotator: throughput and calls per sample.

Every annotator request of the run goes over HTTP to a loopback OpenAI-compatible server in a
child process that answers after ``--latency`` seconds (1 s by default, a large Thinking model's
pace), so the run pays for each request in time exactly as against a real endpoint: the frames
are prepared, the payloads encoded, the slots held. The server's text is then replaced by the
offline annotator's answer for the same request, so every stage gets contract-valid answers and
the run exports what the offline demo would.

Reported per run: wall-clock seconds of ``run()`` (ingest of the corpus excluded, the export
included), paid requests, the ideal time (requests x latency / concurrency), the run's fraction
of it, calls per exported sample, calls per stage, and the longest history chain (a chain's
summaries are sequential, so the run can never take less than chain x latency).

    python benchmarks/bench_datagen_run.py                      # concurrency 16 and 64, 3 runs
    python benchmarks/bench_datagen_run.py --concurrency 16 --runs 5 --latency 1.0
    PYTHONPATH=OTHER_TREE python benchmarks/bench_datagen_run.py  # another tree's code measured

Every run is a fresh process, as the command is (cold imports and worker start-up count).
Prints one JSON object per run and a summary (medians) at the end; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # tests.fakes; a PYTHONPATH naming another tree still comes first

import data_gen.run as run_module  # noqa: E402
from data_gen.config import DataGenConfig  # noqa: E402
from data_gen.ingest import IngestConfig, ingest  # noqa: E402
from data_gen.sample_corpus import SampleConfig, make_sample  # noqa: E402
from hivig.config import load_config  # noqa: E402
from tests.fakes.openai_server import Reply, ScriptedServer  # noqa: E402

DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


def _endpoint_module() -> Any:
    """``tests/fakes/annotator_endpoint.py`` of this benchmark's own tree, loaded by path: a
    PYTHONPATH naming another tree (the code measured) may hold no such module."""
    path = ROOT / "tests" / "fakes" / "annotator_endpoint.py"
    spec = importlib.util.spec_from_file_location("bench_annotator_endpoint", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


ENDPOINT = _endpoint_module()
"""The replaying annotator (real HTTP requests, the offline annotator's answers)."""


def _serve(latency_s: float, count_tokens: bool, urls: mp.Queue, stop: Any) -> None:
    respond = _token_counter() if count_tokens else None
    with ScriptedServer(
        default=Reply(content="ok"), respond=respond, latency_s=latency_s, lifetime_s=3600
    ) as s:
        urls.put(s.base_url)
        stop.wait()


def _token_counter() -> Any:
    """Answers whose ``usage.prompt_tokens`` is the request's size for Qwen3-VL: its text
    through the real Qwen tokenizer, each image at one token per 32 x 32 pixels (the frame the
    annotator sends is already on that grid), and the chat template's few tokens per message."""
    import io

    from PIL import Image

    from hivig.tiny import qwen_tokenizer
    from tests.fakes.openai_server import request_images, request_text

    tokenizer = qwen_tokenizer()

    def respond(body: dict[str, Any]) -> Reply:
        text = len(tokenizer(request_text(body)).input_ids)
        images = 0
        for data in request_images(body):
            with Image.open(io.BytesIO(data)) as img:
                images += (img.width // 32) * (img.height // 32) + 2  # vision start and end
        template = 5 * len(body.get("messages", [])) + 3
        return Reply(content="ok", prompt_tokens=text + images + template)

    return respond


@contextlib.contextmanager
def _timed(owner: Any, name: str, into: dict[str, float], key: str) -> Iterator[None]:
    """Time every call of ``owner.name`` into ``into[key]`` while the block runs."""
    real = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - t0

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, real)


def one_run(corpus: Path, trajs: Path, out: Path, url: str, args: argparse.Namespace, c: int):
    cfg = load_config(
        DataGenConfig,
        DEMO,
        [
            f"corpus={corpus}",
            f"out={out}",
            f"trajectories={trajs}",
            f"annotator.backend.concurrency={c}",
            "export.audit_max_auc=1.0",  # the audit is not what is measured here
        ],
    )
    made: list[Any] = []
    run_module.build_annotator = ENDPOINT.annotator_factory(url, c, made)  # a process per run
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    with (
        _timed(run_module.Executor, "run_shard", phases, "stages_s"),
        _timed(run_module, "merge", phases, "export_s"),
    ):
        stats = run_module.run(cfg, None)
    seconds = time.perf_counter() - t0
    ann = made[0]
    requests = ann.counts["requests"]
    exported = stats["samples"]
    works, _ = run_module.load_work(cfg)
    chain = max(len(w.trajectory.steps) - 1 for w in works)
    ideal = requests * args.latency / c
    row: dict[str, Any] = {}
    if args.tokens:
        row["prompt_tokens_estimate_vs_server"] = _estimate_vs_server(cfg, stats)
    return {
        **row,
        "concurrency": c,
        "latency_s": args.latency,
        "seconds": round(seconds, 2),
        "requests": requests,
        "ideal_s": round(ideal, 2),
        # Where the time went: the annotation stages, the merge and export, and the rest
        # (configuration, loading the trajectories, the plan).
        **{k: round(v, 2) for k, v in phases.items()},
        "fraction_of_ideal": round(ideal / seconds, 3),
        "longest_chain_s": round(chain * args.latency, 2),
        "exported": exported,
        "calls_per_sample": round(requests / exported, 3),
        "calls_by_stage": dict(sorted(ann.stages.items())),
    }


def _estimate_vs_server(cfg: DataGenConfig, stats: dict[str, Any]) -> dict[str, Any]:
    """Per stage: the dry run's prompt-token estimate, the server's count, and their ratio."""
    from data_gen.estimate import estimate_requests

    est = estimate_requests(cfg)["prompt_tokens"]
    out = {}
    for stage, row in stats["annotator_usage"]["stages"].items():
        served = row["prompt_tokens"]
        ratio = round(est[stage] / served, 3) if served else None
        out[stage] = {"estimate": est[stage], "server": served, "ratio": ratio}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="folder for corpus and runs")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="the server counts each request's prompt tokens (real Qwen tokenizer, 32 px image "
        "patches); the run's estimate is compared with its count per stage",
    )
    parser.add_argument("--one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_datagen_run_"))
    corpus = work / f"corpus{args.episodes}"
    trajs = work / "ingest"
    if args.one:  # one measured run, in this fresh process
        c, out, url = args.one
        row = one_run(corpus, trajs / "trajectories.jsonl", Path(out), url, args, int(c))
        print(json.dumps(row), flush=True)
        return
    if not corpus.exists():
        make_sample(corpus, SampleConfig(trajectories=args.episodes, seed=0), progress=False)
    if not (trajs / "trajectories.jsonl").exists():
        ingest(corpus, trajs, IngestConfig(), progress=False)
    urls: mp.Queue = mp.Queue()
    stop = mp.Event()
    server = mp.Process(target=_serve, args=(args.latency, args.tokens, urls, stop), daemon=True)
    server.start()
    url = urls.get(timeout=60)
    rows: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            for c in args.concurrency:
                # A fresh process per run, as the command is: cold imports and worker start-up
                # are part of what a run costs.
                out = work / f"run-{c}-{i}-{time.time_ns()}"
                cmd = [sys.executable, __file__, *sys.argv[1:], "--work", str(work)]
                cmd += ["--one", str(c), str(out), url]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        stop.set()
        server.join(timeout=10)
    summary = {
        str(c): {
            key: statistics.median(r[key] for r in rows if r["concurrency"] == c)
            for key in ("seconds", "fraction_of_ideal", "requests", "calls_per_sample")
        }
        for c in args.concurrency
    }
    print("SUMMARY " + json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
