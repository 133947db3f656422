"""The serving half of ``make demo``: gateway, guarded episode, diagnosis, and the demo pages.

    python -m serve.demo --data demo_out/data --train demo_out/train --out demo_out
    python -m serve.demo ... --critic path/to/checkpoint          # a trained critic instead
    python -m serve.demo ... --serve-config configs/serve/vllm.yaml model=hivig-critic \\
        backend.base_url=http://gpu-node:8000/v1                  # a vLLM endpoint
    python -m serve.demo flywheel --runs demo_out/flywheel/runs --data demo_out/flywheel/data \\
        --out demo_out                              # after data_gen ran on OUT/flywheel/state

It starts the gateway on the checkpoint (in-process transformers backend, 127.0.0.1), runs the
scripted episode through ``CriticGuard`` in headless Chromium (``serve.webenv``) or, without a
browser, on a drawn stand-in, asks the gateway to diagnose the episode's trace, plots the
training curve and writes ``OUT/index.html`` linking everything. It also leaves the episode as
a run folder with the environment's outcome (``OUT/flywheel/state``) for ``make demo``'s
flywheel step (``serve.demo.flywheel``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from hivig.config import ConfigError, load_config
from hivig.entry import unwritable
from serve.config import ServeConfig

log = logging.getLogger("serve.demo")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m serve.demo",
        description="Serve the demo's critic, run a guarded agent episode, diagnose it and "
        "write the demo pages.",
    )
    p.add_argument("--data", required=True, help="data_gen output folder (has dataset/report.html)")
    p.add_argument("--train", required=True, help="training output folder (final/, metrics.jsonl)")
    p.add_argument("--out", required=True, help="folder for index.html and the pages")
    p.add_argument("--critic", help="checkpoint to serve instead of TRAIN/final")
    p.add_argument("--serve-config", default="configs/serve/local.yaml", help="gateway config")
    p.add_argument(
        "--env",
        choices=("auto", "browser", "synthetic"),
        default="auto",
        help="where the episode runs (auto: Chromium when installed)",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="gateway config overrides")
    return p


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _gateway_config(args: argparse.Namespace, out: Path) -> ServeConfig:
    extra = [
        f"sessions.state_dir={out / 'serve'}",
        "warmup=false",
        "critic.observe_deadline_s=120",
        "critic.critique_deadline_s=120",
    ]
    cfg = load_config(ServeConfig, args.serve_config, [*extra, *args.overrides])
    if cfg.backend.kind != "transformers" or cfg.model:
        return cfg
    if args.critic is None:
        # The tiny random model never writes the contract: short answers keep the demo fast.
        extra += ["critic.history_max_tokens=24", "critic.critique_max_tokens=24"]
    ckpt = args.critic or str(Path(args.train) / "final")
    return load_config(ServeConfig, args.serve_config, [*extra, f"model={ckpt}", *args.overrides])


def _environment(kind: str):  # noqa: ANN202 - one of two environment classes
    from serve.demo.desk import SyntheticDesk
    from serve.webenv import BrowserEnv, find_browser

    if kind == "synthetic" or (kind == "auto" and find_browser() is None):
        return SyntheticDesk(), "a drawn stand-in of the web application (no Chromium found)"
    return BrowserEnv(), "the local web application in headless Chromium"


def flywheel_main(argv: list[str]) -> int:
    """``python -m serve.demo flywheel``: add the samples made from the episode to the index."""
    from hivig.records import RecordError
    from serve.demo.flywheel import PAGES_JSON, section
    from serve.demo.pages import index_page

    p = argparse.ArgumentParser(
        prog="python -m serve.demo flywheel",
        description="Add the samples data_gen made from the demo's own episode to index.html.",
    )
    p.add_argument("--runs", required=True, help="the ingest-runs folder of the episode")
    p.add_argument("--data", required=True, help="the data_gen run output made from it")
    p.add_argument("--out", required=True, help="the demo's folder (index.html, pages.json)")
    args = p.parse_args(argv)
    runs, data, out = Path(args.runs), Path(args.data), Path(args.out)
    pages = out / PAGES_JSON
    for path, what in (
        (pages, "demo pages (run python -m serve.demo first)"),
        (runs / "stats.json", "ingest-runs stats (run data_gen ingest-runs first)"),
        (data / "dataset" / "records", "data_gen records (run data_gen run first)"),
    ):
        if not path.exists():
            return _fail(f"{what} not found: {path}")
    saved = json.loads(pages.read_text(encoding="utf-8"))
    try:
        html, shown = section(runs, data, out, saved.get("executed_steps"))
    except RecordError as e:
        return _fail(str(e))
    links = {k: Path(v) for k, v in saved["links"].items()}
    index = index_page(out, links, saved["facts"], flywheel=html)
    print(f"demo: flywheel section with {shown} samples from the episode; open {index}")
    return 0


def _verdict_counts(log: list[dict]) -> str:
    """``"7 abstain"``, ``"5 good, 1 bad"``: what the critic said over an episode's proposals."""
    said = Counter(
        (p.get("verdict") or {}).get("verdict", "none")
        for row in log
        for p in row.get("proposals") or []
    )
    return ", ".join(f"{n} {verdict}" for verdict, n in sorted(said.items())) or "none"


def _scripted_run(args: argparse.Namespace, out: Path, env_name: str) -> tuple[Path, str]:
    """The same episode once more, judged by the scripted critic (``serve.demo.scripted``) on
    its own gateway and state folder: the Bad verdict and the re-proposal the random model
    never shows. Returns the page and its one-line fact for the index."""
    from serve.app import create_app
    from serve.demo.episode import run_episode
    from serve.demo.pages import episode_page
    from serve.demo.scripted import ScriptedDemoCritic
    from serve.server import BackgroundServer

    state = out / "serve_scripted"
    cfg = load_config(ServeConfig, None, [f"sessions.state_dir={state}", "warmup=false"])
    env, _ = _environment(args.env)
    with BackgroundServer(create_app(cfg, ScriptedDemoCritic())) as srv, env:
        result = run_episode(env, srv.url, heed_feedback=True)
    trace = state / "traces" / f"{result.session_id}.jsonl"
    page = episode_page(trace, state, result.log, out, env_name, scripted=True)
    rulings = [p.get("ruling") for row in result.log for p in row.get("proposals") or []]
    fact = (
        f"Scripted critic (a fixed rule, not a model): {rulings.count('rejected')} proposal(s) "
        f"rejected and re-proposed, {len(result.log)} guarded steps, task "
        f"{'done' if result.success else 'not done'}."
    )
    print(f"demo: {fact} -> {page}")
    return page, fact


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["flywheel"]:
        return flywheel_main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    data, train, out = Path(args.data), Path(args.train), Path(args.out)
    report = data / "dataset" / "report.html"
    metrics = train / "metrics.jsonl"
    for path, what in ((report, "data report"), (metrics, "training metrics")):
        if not path.is_file():
            return _fail(f"{what} not found: {path} (run the data and training steps first)")
    problem = unwritable(out)
    if problem is not None:  # before the gateway, the browser and the episode
        return _fail(f"--out {out}: {problem}; pass a folder you can write to")
    try:
        cfg = _gateway_config(args, out)
    except ConfigError as e:
        return _fail(str(e))
    if (
        cfg.backend.kind == "transformers"
        and not (Path(cfg.backend.model) / "config.json").is_file()
    ):
        return _fail(f"no checkpoint at {cfg.backend.model} (pass --critic DIR)")
    out.mkdir(parents=True, exist_ok=True)

    from serve.app import create_app
    from serve.client import ClientConfig, CriticClient
    from serve.demo.episode import run_episode
    from serve.demo.flywheel import PAGES_JSON, RUN_FOLDER, write_run_folder
    from serve.demo.pages import episode_page, index_page, training_curve
    from serve.server import BackgroundServer

    curve = training_curve(metrics, out / "training_curve.png")
    print(f"demo: training curve of {curve['steps']} steps -> {out / 'training_curve.png'}")
    env, env_name = _environment(args.env)
    started = time.perf_counter()
    with BackgroundServer(create_app(cfg)) as srv, env:
        print(f"demo: gateway on {srv.url} ({cfg.backend.kind}: {cfg.backend.model or cfg.model})")
        print(f"demo: episode in {env_name}")
        result = run_episode(env, srv.url)
        trace = Path(cfg.sessions.state_dir) / "traces" / f"{result.session_id}.jsonl"
        print(
            f"demo: episode done in {time.perf_counter() - started:.0f} s "
            f"(guard events {result.events}, task {'done' if result.success else 'not done'})"
        )
        client = CriticClient(config=ClientConfig(base_url=srv.url, session_deadline_s=60))
        job = client.diagnose(str(trace))
        deadline = time.monotonic() + 600
        while job.status == "pending" and job.job_id and time.monotonic() < deadline:
            time.sleep(0.5)
            job = client.job(job.job_id)
        client.close()
    if job.status != "done" or not job.result:
        return _fail(f"the diagnosis job did not finish ({job.reason or job.status})")
    diagnosis = Path(cfg.sessions.state_dir) / "diagnoses" / str(job.job_id) / "diagnosis.html"
    episode = episode_page(trace, Path(cfg.sessions.state_dir), result.log, out, env_name)
    scripted_page, scripted_fact = _scripted_run(args, out, env_name)
    root = job.result.get("root_cause_step")
    facts = {
        "data": f"Generated corpus, data_gen with the offline annotator: {data}",
        "train": f"{curve['steps']} optimizer steps, loss {curve['first_loss']:.3f} -> "
        f"{curve['last_loss']:.3f}; checkpoint {cfg.backend.model}",
        "metrics": str(metrics),
        "episode": f"{len(result.log)} guarded steps in {env_name}; the served critic's "
        f"verdicts: {_verdict_counts(result.log)}; R3 events: {len(result.r3_events)}; "
        f"trace {trace}",
        "diagnosis": (
            f"Root-cause step {root}, from the episode's trace ({trace.name})."
            if root is not None
            else f"The run succeeded: no root-cause step (trace {trace.name})."
        ),
        "episode_scripted": scripted_fact,
    }
    links = {
        "data_report": report,
        "training_curve": out / "training_curve.png",
        "episode": episode,
        "episode_scripted": scripted_page,
        "diagnosis": diagnosis,
    }
    index = index_page(out, links, facts)
    (out / PAGES_JSON).write_text(
        json.dumps(
            {
                "links": {k: str(v) for k, v in links.items()},
                "facts": facts,
                "executed_steps": len(result.rewards),
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    outcome = "success" if result.success else "failure"
    run = write_run_folder(trace, Path(cfg.sessions.state_dir), out / RUN_FOLDER, outcome)
    print(f"demo: the episode as a run folder ({outcome}, as the environment scored it) -> {run}")
    print(f"demo: pages written; open {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
