"""What a run will cost, from the plan alone: annotator requests and prompt tokens per stage.

    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --dry-run

The plan says which steps get a sample (``data_gen.planning.build_plan``), so it says which requests
the run sends: a transition for each step with a planned sample (a final step that ends the
episode needs none), the history pairs up to the planned cap, a perturbation for each planned
Bad of an annotator dimension, a judge for each planned Bad, a rationale for each Good and Bad.
Each request's prompt is built as the stage builds it, with stand-ins where the text depends on
an earlier answer (a summary, a transition, a Bad step), and counted as the export counts
samples: image tokens exact for the frame the annotator sends, text at ``CHARS_PER_TOKEN`` bytes
per token. Completion tokens depend on the model; the bound is ``sampling.max_tokens`` each.
Validation retries come on top (at most ``annotator.max_attempts`` answers per request), and
answers already in the request cache cost nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

from data_gen.config import DataGenConfig
from data_gen.executor import Shard
from data_gen.ingest import ingest_complete
from data_gen.inputs import load_work
from data_gen.perturb import ElementIndex, StepPlan
from data_gen.perturb.semantic import ANNOTATOR_DIMENSIONS
from data_gen.planning import build_plan, check_plan, plan_history
from data_gen.report import CHARS_PER_TOKEN, ImageSizes
from data_gen.steps.transitions import unplanned_reason
from data_gen.steps.work import (
    INITIAL_SUMMARY,
    Context,
    Work,
    image,
    past_trajectory,
    sample_id,
    step_prompt_args,
    step_text,
)
from hivig.logging import get_logger
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.prompts import (
    build_history_annotation_messages,
    build_judge_messages,
    build_perturbation_messages,
    build_rationale_bad_messages,
    build_rationale_good_messages,
    build_transition_messages,
    format_raw_step,
)
from hivig.taxonomy import lookup_dimension
from hivig.vision import smart_resize

log = get_logger(__name__)

STAND_IN = "The step acts on the control under the pointer and the screen shows its effect. " * 2
"""Stand-in for a text an earlier answer writes (a mechanism, an effect, a next state): about
the length the annotator writes."""

STAGES = ("grounding", "transitions", "history", "perturb", "judge", "rationale")


class _Counter:
    """Requests and estimated prompt tokens per stage."""

    def __init__(self, cfg: DataGenConfig) -> None:
        self.sizes = ImageSizes(Path(cfg.corpus))
        self.frame = cfg.frame
        self.requests: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()

    def add(self, stage: str, messages: list[ChatMessage]) -> None:
        self.requests[stage] += 1
        self.tokens[stage] += self.prompt_tokens(messages)

    def prompt_tokens(self, messages: list[ChatMessage]) -> int:
        chars, tokens = 0, 0
        f = self.frame
        for m in messages:
            for part in m.content:
                if isinstance(part, TextPart):
                    chars += len(part.text.encode("utf-8"))
                elif isinstance(part, ImagePart):
                    size = self.sizes(part.image.path)
                    if size is not None:
                        h, w = smart_resize(size[1], size[0], f.factor, f.min_pixels, f.max_pixels)
                        tokens += (h // f.factor) * (w // f.factor)
        return tokens + math.ceil(chars / CHARS_PER_TOKEN)


def estimate_requests(cfg: DataGenConfig) -> dict[str, Any]:
    """Requests and estimated prompt tokens per stage of the whole run (nothing is sent).

    Returns:
        ``{"requests": {stage: n, "total": n}, "prompt_tokens": {stage: n, "total": n},
        "total_with_all_retries": n, "completion_tokens_at_most": n}``.
    """
    works, _ = load_work(cfg)
    path = Path(cfg.corpus) / cfg.elements_file
    elements = ElementIndex.load(path)
    plan = build_plan(cfg, works, elements, offline=cfg.annotator.backend.kind == "offline")
    check_plan(cfg, plan, works)  # a plan the run would refuse has no cost to print
    count = _Counter(cfg)
    if cfg.perturb.element_source == "annotator" or (
        cfg.perturb.element_source == "auto" and not path.exists()
    ):
        count.requests["grounding"] = sum(
            1
            for w in works
            for k in range(len(w.trajectory.steps))
            if any(a.to_arguments().get("coordinate") for a in w.trajectory.steps[k].actions)
        )
    return estimate_for(cfg, works, plan, plan_history(cfg, works, plan), count)


def estimate_for(
    cfg: DataGenConfig,
    works: list[Work],
    plan: dict[str, StepPlan],
    history: dict[str, int],
    count: _Counter | None = None,
) -> dict[str, Any]:
    """``estimate_requests`` for some work items (a shard's), from a plan already made."""
    count = count or _Counter(cfg)
    for w in works:
        if w.failed_run:  # its real Bad only: a judge and a rationale
            _real_bad(count, cfg, w)
            continue
        _history(count, w, history.get(w.id, len(w.trajectory.steps) - 1))
        for k in range(len(w.trajectory.steps)):
            if unplanned_reason(plan, w, k) is None:
                _step(count, cfg, plan[sample_id(w.id, k)], w, k)
    requests = {s: count.requests[s] for s in STAGES}
    tokens = {s: count.tokens[s] for s in STAGES}
    total = sum(requests.values())
    return {
        "requests": {**requests, "total": total},
        "prompt_tokens": {**tokens, "total": sum(tokens.values())},
        "total_with_all_retries": total * cfg.annotator.max_attempts,
        "completion_tokens_at_most": total * cfg.annotator.backend.sampling.max_tokens,
    }


def _history(count: _Counter, work: Work, pairs: int) -> None:
    traj = work.trajectory
    done: list[str] = []
    for k in range(pairs):
        summary = INITIAL_SUMMARY
        if done:  # a summary of the steps so far, as long as the annotator's would be
            summary = f"Progress Summary: {'; '.join(done)}.\nLast Action Result: {STAND_IN}"
        before, after = traj.steps[k].screenshot, traj.steps[k + 1].screenshot
        messages = build_history_annotation_messages(
            traj.task,
            traj.platform,
            summary,
            image(traj, before),
            image(traj, after),
            step_text(traj, k),
        )
        count.add("history", list(messages))
        done.append((traj.steps[k].intent or "").rstrip("."))


def _step(count: _Counter, cfg: DataGenConfig, plan: StepPlan, work: Work, k: int) -> None:
    traj = work.trajectory
    if k + 1 < len(traj.steps):  # a final step that ends the episode needs no request
        before, after = traj.steps[k].screenshot, traj.steps[k + 1].screenshot
        messages = build_transition_messages(
            traj.task, traj.platform, image(traj, before), image(traj, after), step_text(traj, k)
        )
        count.add("transitions", list(messages))
    args = step_prompt_args(traj, k)
    expert = step_text(traj, k)
    shot = image(traj, traj.steps[k].screenshot)
    critic_args = (traj.task, traj.platform, past_trajectory(traj, k), shot, expert)
    if plan.dimension is not None:
        dim = lookup_dimension(plan.dimension)
        if plan.dimension in ANNOTATOR_DIMENSIONS:
            dims = [d for d in (lookup_dimension(n) for n in plan.candidates) if d is not None]
            messages = build_perturbation_messages(
                *args, traj.steps[k].think or "", expert, dims or [dim]
            )
            count.add("perturb", list(messages))
        if cfg.judge.enabled:
            count.add("judge", list(build_judge_messages(*args, expert, expert)))
        assert dim is not None
        messages = build_rationale_bad_messages(
            *critic_args, dim, traj.steps[k].intent or "", STAND_IN, STAND_IN
        )
        count.add("rationale", list(messages))
    if plan.good and plan.repeat_of is None:
        messages = build_rationale_good_messages(*critic_args, STAND_IN, STAND_IN, STAND_IN)
        count.add("rationale", list(messages))


def _real_bad(count: _Counter, cfg: DataGenConfig, work: Work) -> None:
    """A failed run's root-cause step: judged against its diagnosed correction, then a Bad
    rationale (``data_gen.steps.judge``, ``data_gen.steps.rationale``)."""
    traj = work.trajectory
    for k, unit in enumerate(work.units):
        bad = unit.bad
        if bad is None:
            continue
        dim = lookup_dimension(bad.dimension)
        args = step_prompt_args(traj, k)
        step = format_raw_step(bad.intent, bad.text)
        correction = bad.extra.get("correction") or STAND_IN
        if cfg.judge.enabled:
            count.add("judge", list(build_judge_messages(*args, step, correction)))
        if dim is not None:
            shot = image(traj, traj.steps[k].screenshot)
            critic_args = (traj.task, traj.platform, past_trajectory(traj, k), shot, step)
            messages = build_rationale_bad_messages(
                *critic_args, dim, correction, STAND_IN, STAND_IN
            )
            count.add("rationale", list(messages))


def known_trajectories(cfg: DataGenConfig) -> Path | None:
    """The trajectory file a run would read, if it exists already (a dry run ingests nothing)."""
    if cfg.trajectories:
        return Path(cfg.trajectories) if Path(cfg.trajectories).is_file() else None
    if cfg.corpus and (Path(cfg.corpus) / "trajectories.jsonl").is_file():
        return Path(cfg.corpus) / "trajectories.jsonl"
    if cfg.out and ingest_complete(Path(cfg.out) / "ingest"):
        return Path(cfg.out) / "ingest" / "trajectories.jsonl"
    return None


def estimate_table(est: dict[str, Any]) -> list[str]:
    """One line per stage with requests and prompt tokens, then the totals."""
    lines = [f"{'stage':<12} {'requests':>9} {'prompt tokens':>14}"]
    for stage in (*STAGES, "total"):
        n, t = est["requests"][stage], est["prompt_tokens"][stage]
        if n or stage == "total":
            lines.append(f"{stage:<12} {n:>9,} {t:>14,}")
    lines.append(
        f"at most {est['total_with_all_retries']:,} requests with every validation retry; "
        f"completion tokens at most {est['completion_tokens_at_most']:,} (sampling.max_tokens each)"
    )
    return lines


def estimate_text(cfg: DataGenConfig) -> str:
    """``--dry-run``'s cost estimate, as YAML comment lines after the resolved config."""
    path = known_trajectories(cfg)
    if path is None:
        return (
            "# annotator requests: no estimate without trajectories; run `python -m data_gen "
            "ingest --root CORPUS --out DIR` and pass trajectories=DIR/trajectories.jsonl\n"
        )
    est = estimate_requests(dataclasses.replace(cfg, trajectories=str(path)))
    rows = "".join(f"#   {line}\n" for line in estimate_table(est))
    return f"# what this run will send (estimate from the plan, nothing sent):\n{rows}"


def log_estimate(cfg: DataGenConfig, shard: Shard, works: list[Work], ctx: Context) -> None:
    """Log what the shard will send, per stage, before it sends anything."""
    est = estimate_for(cfg, works, ctx.plan, ctx.history_pairs)
    log.info(
        "shard %s will send (estimate from the plan):\n%s",
        shard.name,
        "\n".join(estimate_table(est)),
    )
