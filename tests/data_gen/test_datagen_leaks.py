"""Bad samples must not give their label away: intents come from real expert wording, and each
generator's errors belong to its own dimension only."""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from _sample_run import demo_config

from data_gen.perturb import PROGRAMMATIC, ElementIndex
from data_gen.perturb.plan import generator_rng
from data_gen.run import build_plan, gen_params, load_work
from data_gen.steps.work import critique_candidate, step_view

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"

# (sample id, dimension, intent of the Bad step, action names of the Bad step, expert's intent)
Row = tuple[str, str, str, frozenset[str], str]

TEMPLATES = {
    "Visual Hallucination": "Click the 'Sign in' button to continue with the task.",
    "Termination Misjudgment": "The goal looks achieved, so the task can be finished.",
    "Timing and Latency Neglect": "Click Generate report, and straight away answer 62 units.",
}
"""Sentence patterns of the kind the generators must not write (negative control)."""


@pytest.fixture(scope="module")
def bad_rows(sample60, tmp_path_factory) -> list[Row]:
    """Every planned programmatic Bad step of a 60-trajectory sample corpus."""
    cfg = demo_config(sample60, tmp_path_factory.mktemp("leaks"))
    works, _ = load_work(cfg)
    elements = ElementIndex.load(Path(cfg.corpus) / cfg.elements_file)
    # The plan first: it records the expert steps the views' layout-habit ghosts come from.
    planned = build_plan(cfg, works, elements, offline=True)
    views = {
        v.sample_id: v
        for w in works
        for k in range(len(w.trajectory.steps))
        if critique_candidate(w.trajectory, k)
        for v in [step_view(w.trajectory, k, elements)]
    }
    rows = []
    for sid, plan in sorted(planned.items()):
        if plan.dimension not in PROGRAMMATIC:
            continue
        gen = PROGRAMMATIC[plan.dimension]
        bad = gen(views[sid], generator_rng(cfg.seed, sid, plan.dimension), gen_params(cfg))
        # An unparseable Bad step (Action Formulation) shows the expert's action names.
        calls = bad.calls if bad.calls is not None else views[sid].calls
        actions = frozenset(str(c.get("action")) for c in calls)
        rows.append((sid, plan.dimension, bad.intent, actions, views[sid].intent))
    return rows


def _grams(text: str) -> set[str]:
    words = re.findall(r"[a-z]+", text.lower())
    return {" ".join(words[i : i + n]) for n in (1, 2, 3) for i in range(len(words) - n + 1)}


def _accuracy(rows: list[Row], features: Callable[[Row], set[str]]) -> float:
    """Held-out accuracy of "most frequent dimension per feature", split by trajectory."""

    def fold(row: Row) -> int:
        return hashlib.sha1(row[0].split(":")[0].encode()).digest()[0] % 2

    train = [r for r in rows if fold(r) == 0]
    test = [r for r in rows if fold(r) == 1]
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    for r in train:
        for f in features(r):
            seen[f][r[1]] += 1
    majority = Counter(r[1] for r in train).most_common(1)[0][0]
    hits = 0
    for r in test:
        votes: Counter[str] = Counter()
        for f in features(r):
            if f in seen:
                top, n = seen[f].most_common(1)[0]
                votes[top] += n / sum(seen[f].values())
        hits += (votes.most_common(1)[0][0] if votes else majority) == r[1]
    return hits / len(test)


def _by_action(row: Row) -> set[str]:
    return set(row[3])


def _by_intent(row: Row) -> set[str]:
    return _grams(row[2]) | _by_action(row)


def _by_expert(row: Row) -> set[str]:
    return {f"expert:{g}" for g in _grams(row[4])} | _by_action(row)


@pytest.mark.slow
def test_intent_alone_does_not_predict_the_dimension(bad_rows):
    # The Bad step's action names are what the critic sees anyway (a sign flip needs a scroll),
    # and which dimension a step can carry follows from the expert's own step (a near miss
    # needs a click, a ghost a next screen), so the expert's words and the Bad actions set the
    # level of "chance" here; the Bad step's intent must add little on top.
    assert len({r[1] for r in bad_rows}) >= 7
    chance = _accuracy(bad_rows, _by_expert)
    assert _accuracy(bad_rows, _by_intent) <= chance + 0.05
    # Negative control: the fixed sentence patterns three generators used to write are caught.
    templated = [(s, d, TEMPLATES.get(d, i), a, e) for s, d, i, a, e in bad_rows]
    assert _accuracy(templated, _by_intent) > chance + 0.1
