"""data_gen's streamed stages, planned spending, usage and progress.

The stages run per trajectory under one request budget (``data_gen.steps.flow``): they must write
exactly what they write one after another, history requests must go first, a stage with a
temporary failure must leave only the stages before it committed, and the run must pay only for
what a planned sample needs (transitions of planned steps, history chains up to the planned cap)
and refuse a plan that misses the distribution before any request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sys
from pathlib import Path

import pytest
from _sample_run import demo_config, ingested_sample

import data_gen.run as run_module
from data_gen.annotator import (
    Annotator,
    AnnotatorRequest,
    PriorityGate,
    priority,
)
from data_gen.executor import Codec, Executor, Shard, StageIncomplete, StageStats
from data_gen.perturb import ElementIndex
from data_gen.progress import stage_bars
from data_gen.report import annotator_usage
from data_gen.run import build_annotator, load_work, main, make_context, run
from data_gen.steps import STEP_CLASSES
from data_gen.steps.flow import StreamedStages, planned_items
from data_gen.steps.history import validate_history
from data_gen.steps.work import WORK_CODEC, LoopThread
from hivig.backends import OpenAIClient
from hivig.config import BackendConfig, FrameConfig, SamplingConfig
from hivig.messages import ChatMessage, TextPart
from hivig.records import SPLITS, read_records
from tests.fakes.openai_server import Reply, ScriptedServer, request_text

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = ingested_sample(tmp_path_factory.mktemp("corpus"), trajectories=8, seed=5)
    return root / "c", root / "i" / "trajectories.jsonl"


def _cfg(corpus, out, *extra):
    return demo_config(corpus[0].parent, out, "export.audit_max_auc=1.0", *extra)


def _context(cfg):
    works, _ = load_work(cfg)
    elements = ElementIndex.load(Path(cfg.corpus) / cfg.elements_file)
    ctx = make_context(cfg, works, elements, build_annotator(cfg), LoopThread())
    return ctx, works


# ---------------------------------------------------------------------------------------------
# The flow against the stages one after another


def test_streamed_stages_write_what_the_stages_write_one_after_another(corpus, tmp_path):
    outputs = {}
    for mode in ("staged", "streamed"):
        cfg = _cfg(corpus, tmp_path / mode)
        ctx, works = _context(cfg)
        executor = Executor(cfg.out, [cls(ctx) for cls in STEP_CLASSES], WORK_CODEC)
        flow = StreamedStages(ctx) if mode == "streamed" else None
        executor.run_shard(Shard(0, 1), works, flow)
        ctx.loop.close()
        outputs[mode] = {
            p.relative_to(tmp_path / mode).as_posix(): p.read_bytes()
            for folder in ("work", "exclusions", "completions")
            for p in sorted((tmp_path / mode / folder).rglob("*.json*"))
        }
    assert len(outputs["streamed"]) == 15  # five stages: output, exclusions, marker
    assert outputs["streamed"] == outputs["staged"]


def test_each_stage_is_committed_with_the_items_as_it_left_them(corpus, tmp_path):
    cfg = _cfg(corpus, tmp_path / "o")
    ctx, works = _context(cfg)
    executor = Executor(cfg.out, [cls(ctx) for cls in STEP_CLASSES], WORK_CODEC)
    executor.run_shard(Shard(0, 1), works, StreamedStages(ctx))
    ctx.loop.close()
    written = {"transitions": "transition", "history": "history", "rationale": "critique"}
    order = [cls.name for cls in STEP_CLASSES]
    for stage in order:
        units = [u for w in executor.load_output(Shard(0, 1), stage) for u in w.units]
        later = order[order.index(stage) + 1 :]
        for name in later:
            if name in written:
                assert all(getattr(u, written[name]) is None for u in units), (stage, name)
        if stage in written:
            assert any(getattr(u, written[stage]) is not None for u in units)


class _Toy:
    def __init__(self, name):
        self.name = name


class _ToyFlow:
    """Two stages: ``a`` keeps every item, ``b`` drops one for a temporary reason."""

    def run(self, items, stats):
        for x in items:
            stats["a"].seen()
            stats["a"].kept()
            x["a"] = True
            stats["b"].seen()
            if x["v"] == 2:
                stats["b"].drop(str(x["v"]), "annotator_timeout")
                continue
            x["b"] = True
            stats["b"].kept()
        return items

    def view(self, item, later):
        return {k: v for k, v in item.items() if k not in later}


def test_a_stage_with_a_temporary_failure_leaves_only_the_stages_before_it_committed(tmp_path):
    codec = Codec(lambda x: dict(x), lambda d: dict(d))
    ex = Executor(tmp_path, [_Toy("a"), _Toy("b")], codec, frozenset({"annotator_timeout"}))
    with pytest.raises(StageIncomplete):
        ex.run_shard(Shard(0, 1), [{"v": 1}, {"v": 2}], _ToyFlow())
    assert ex.is_done(Shard(0, 1), "a") and not ex.is_done(Shard(0, 1), "b")
    # Stage a is written as it left the items: nothing of stage b in it.
    assert ex.load_output(Shard(0, 1), "a") == [{"v": 1, "a": True}, {"v": 2, "a": True}]


# ---------------------------------------------------------------------------------------------
# One budget, history first


def test_the_gate_lets_waiters_in_by_priority_then_arrival():
    async def scenario():
        gate = PriorityGate(1)
        order = []

        async def job(name, priority):
            async with gate.slot(priority):
                order.append(name)
                await asyncio.sleep(0)

        async with gate.slot(0):  # every job below has to wait
            tasks = [
                asyncio.create_task(job(n, p))
                for n, p in (("t1", 4), ("h1", 0), ("r1", 1), ("t2", 4), ("h2", 0))
            ]
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["h1", "h2", "r1", "t1", "t2"]


def test_a_cancelled_waiter_gives_its_slot_on():
    async def scenario():
        gate = PriorityGate(1)
        got = []

        async def job(name):
            async with gate.slot(0):
                got.append(name)

        async with gate.slot(0):
            first = asyncio.create_task(job("cancelled"))
            second = asyncio.create_task(job("second"))
            await asyncio.sleep(0)
            first.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        async with gate.slot(0):  # the slot came back: no leak
            got.append("after")
        return got

    assert asyncio.run(scenario()) == ["second", "after"]


def test_the_longest_path_goes_first_and_the_budget_is_never_exceeded(tmp_path):
    """Against a real HTTP endpoint with 2 slots: queued history pairs with a long chain still
    to follow overtake judge requests (one rationale to follow) that arrived before them."""
    answer = (
        "<think>Compared the two screens.</think>\n<summary>\nProgress Summary: Opened it.\n"
        "Last Action Result: It is open.\n</summary>"
    )
    with ScriptedServer(default=Reply(content=answer), latency_s=0.05) as server:
        cfg = BackendConfig(
            kind="openai",
            base_url=server.base_url,
            model="scripted",
            concurrency=2,
            sampling=SamplingConfig(),
        )
        client = OpenAIClient(server.base_url, "scripted", concurrency=8, max_retries=0)
        ann = Annotator(cfg, FrameConfig(), tmp_path, None, 1, backend=client, prefetch=0)

        async def one(stage, i, following=None):
            msg = ChatMessage("user", [TextPart(f"{stage} {i}")])
            result = await ann.annotate(AnnotatorRequest(stage, [msg], {}, following), _ok)
            assert result.ok

        async def scenario():
            jobs = [one("judge", i) for i in range(6)] + [one("history", i, 5) for i in range(3)]
            await asyncio.gather(*jobs)
            await client.aclose()

        asyncio.run(scenario())
        ann.close()
        assert server.max_in_flight <= 2
        sent = [request_text(body).split()[0] for body in server.requests]
    # The first two judges took the two slots; the three history requests queued after the
    # other four judges and still went out next.
    assert sent == ["judge"] * 2 + ["history"] * 3 + ["judge"] * 4, sent
    # Without a chain to follow, a step's transition (three requests may follow it) goes
    # before its judge (one) and its rationale (none).
    ranks = [priority(AnnotatorRequest(s, [])) for s in ("transitions", "judge", "rationale_bad")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 3


# ---------------------------------------------------------------------------------------------
# Paying only for what is exported


def test_transitions_are_paid_only_for_steps_with_a_planned_sample(corpus, tmp_path):
    cfg = _cfg(corpus, tmp_path / "o")
    stats = run(cfg, None)
    tr = stats["stages"]["transitions"]
    assert tr.get("skipped_repeated_step", 0) + tr.get("skipped_good_bad_ratio", 0) > 0
    # Every step that has a critique sample had its transition; no other step was paid for.
    ctx, works = _context(cfg)
    planned = planned_items(ctx, works)
    ctx.loop.close()
    assert tr["in"] == planned["transitions"]
    records = [r for s in SPLITS for r in read_records(Path(cfg.out) / "dataset/records" / s)]
    stepped = {(r.trajectory_id, r.step_index) for r in records if r.kind == "critique"}
    assert len(stepped) <= tr["kept"]
    assert stats["stages"]["rationale"].get("dropped_repeated_step", 0) == 0


def test_history_chains_stop_where_the_planned_cap_stops_them(corpus, tmp_path):
    cfg = _cfg(corpus, tmp_path / "o", "export.history_critique_ratio=0.3")
    stats = run(cfg, None)
    h = stats["stages"]["history"]
    assert h["skipped_history_critique_ratio"] > 0
    ctx, works = _context(cfg)
    ctx.loop.close()
    assert h["in"] == sum(ctx.history_pairs.values())
    # What was paid for is what the export keeps: whole chains from their first pair on.
    assert stats["stages"]["export"].get("dropped_mix_ratio", 0) <= 1
    records = [r for s in SPLITS for r in read_records(Path(cfg.out) / "dataset/records" / s)]
    by_traj: dict[str, list[int]] = {}
    for r in records:
        if r.kind == "history":
            by_traj.setdefault(r.trajectory_id, []).append(r.step_index)
    assert by_traj
    for tid, steps in by_traj.items():
        assert sorted(steps) == list(range(len(steps))), tid


def test_a_plan_that_misses_the_distribution_is_refused_before_any_request(
    corpus, tmp_path, capsys, monkeypatch
):
    # The planner balances the dimensions itself (caps at max_dimension_ratio), so a plan off
    # its target takes a planner that cannot: every planned Bad moved to one dimension.
    real = run_module.build_plan

    def lopsided(cfg, *args, **kwargs):
        warn = dataclasses.replace(cfg.perturb, unreachable_dimension="warn")
        plan = real(dataclasses.replace(cfg, perturb=warn), *args, **kwargs)
        return {
            sid: dataclasses.replace(p, dimension="Semantic Error", candidates=())
            if p.dimension
            else p
            for sid, p in plan.items()
        }

    monkeypatch.setattr(run_module, "build_plan", lopsided)
    c, t = corpus
    out = tmp_path / "o"
    code = main(
        [
            "--config",
            str(DEMO),
            f"corpus={c}",
            f"out={out}",
            f"trajectories={t}",
            "perturb.unreachable_dimension=error",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the plan already misses the dimension distribution, before any request" in err
    assert "Suboptimal Path: 0.000 planned vs" in err and err.count("error:") == 1
    assert not (out / "cache").exists() and not (out / "work").exists()


# ---------------------------------------------------------------------------------------------
# Usage and progress


def test_the_servers_usage_is_counted_per_stage_and_again_from_the_cache(tmp_path):
    answer = (
        "<think>Compared the two screens.</think>\n<summary>\nProgress Summary: Opened it.\n"
        "Last Action Result: It is open.\n</summary>"
    )
    reply = Reply(content=answer, prompt_tokens=1200, completion_tokens=80)
    with ScriptedServer(default=reply) as server:
        cfg = BackendConfig(
            kind="openai", base_url=server.base_url, model="scripted", sampling=SamplingConfig()
        )
        results = []
        for _ in range(2):  # the second answer comes from the cache
            client = OpenAIClient(server.base_url, "scripted", max_retries=0)
            ann = Annotator(cfg, FrameConfig(), tmp_path, tmp_path / "cache", 1, backend=client)
            msg = ChatMessage("user", [TextPart("summarise")])
            results.append(asyncio.run(ann.annotate(AnnotatorRequest("history", [msg]), _ok)))
            ann.close()
        assert server.request_count == 1
    assert [(r.prompt_tokens, r.completion_tokens) for r in results] == [(1200, 80)] * 2
    usage = annotator_usage(
        {"history": {"calls": 2, "prompt_tokens": 2400, "completion_tokens": 160}, "export": {}},
        4,
    )
    assert usage["total"] == {"calls": 2, "prompt_tokens": 2400, "completion_tokens": 160}
    assert usage["calls_per_exported_sample"] == 0.5 and list(usage["stages"]) == ["history"]


def _ok(text, reasoning):
    return validate_history(text, reasoning)


def test_the_run_records_answers_per_stage_and_per_exported_sample(corpus, tmp_path):
    stats = run(_cfg(corpus, tmp_path / "o"), None)
    usage = stats["annotator_usage"]
    assert set(usage["stages"]) == {"transitions", "history", "perturb", "judge", "rationale"}
    assert usage["total"]["calls"] == sum(stats["stages"][s]["calls"] for s in usage["stages"])
    assert usage["calls_per_exported_sample"] == round(
        usage["total"]["calls"] / stats["samples"], 3
    )
    report = (tmp_path / "o" / "dataset" / "report.html").read_text(encoding="utf-8")
    assert "Annotator answers per exported sample" in report


def test_progress_bars_show_items_answers_tokens_retries_and_drops():
    stats = {"transitions": StageStats("transitions"), "history": StageStats("history")}
    stats["transitions"].seen(3)
    stats["transitions"].kept(2)
    stats["transitions"].drop("x", "contract_bad")
    stats["transitions"].add("calls", 4)
    stats["transitions"].add("llm_retries", 1)
    stats["transitions"].add("prompt_tokens", 25_000)
    err = io.StringIO()
    saved, sys.stderr = sys.stderr, err
    try:
        with stage_bars(stats, {"transitions": 3, "history": 5}, enabled=True):
            pass
    finally:
        sys.stderr = saved
    text = err.getvalue()
    assert "3/3" in text and "0/5" in text
    assert "answers=4 tokens=25k retries=1 dropped=1" in text
    # Not a terminal: no bars at all.
    with stage_bars(stats, {"transitions": 3}):
        pass


def test_stage_counters_balance_with_the_flow(corpus, tmp_path):
    stats = run(_cfg(corpus, tmp_path / "o"), None)
    for name, counts in stats["stages"].items():
        dropped = sum(v for k, v in counts.items() if k.startswith("dropped_"))
        assert counts["in"] == counts["kept"] + dropped, name
    assert json.loads((tmp_path / "o" / "dataset" / "stats.json").read_text())["stages"]


def test_a_missing_marker_reruns_that_stage_and_every_later_one(tmp_path):
    # Found in review: with markers a and c present and b missing, b ran on c's output.
    codec = Codec(lambda x: dict(x), lambda d: dict(d))
    ex = Executor(tmp_path, [_Toy("a"), _Toy("b")], codec, frozenset({"annotator_timeout"}))
    flow = _ToyFlow()
    items = [{"v": 1}, {"v": 3}]
    ex.run_shard(Shard(0, 1), items, flow)
    ex.marker_path(Shard(0, 1), "a").unlink()
    again = ex.run_shard(Shard(0, 1), [{"v": 1}, {"v": 3}], flow)
    assert again == [{"v": 1, "a": True, "b": True}, {"v": 3, "a": True, "b": True}]
    assert ex.load_output(Shard(0, 1), "a") == [{"v": 1, "a": True}, {"v": 3, "a": True}]
