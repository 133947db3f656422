"""Labels a critic can trust: every generator's sample is true to its dimension (checked on every
sample it emits over a generated corpus), no wording gives the label away, masking is paired."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _sample_run import demo_config

from data_gen.perturb import DRAFTERS, PROGRAMMATIC, ElementIndex, GenParams, StepView
from data_gen.perturb.calls import primary_point, render_calls
from data_gen.perturb.elements import Element, target_at
from data_gen.perturb.plan import draft_step, eligible_dimensions, generator_rng
from data_gen.perturb.programmatic import points_of
from data_gen.perturb.properties import CHECKS, intent_contradiction, violation
from data_gen.run import build_plan, gen_params, load_work
from data_gen.steps.perturb import perturbation_validator
from data_gen.steps.work import critique_candidate, note_expert_steps, sample_id, step_view
from hivig.taxonomy import DIMENSIONS


@pytest.fixture(scope="module")
def corpus(sample60, tmp_path_factory):
    """Views of every critique step of a 60-trajectory sample corpus, with the run config."""
    cfg = demo_config(sample60, tmp_path_factory.mktemp("labels"), "keep_failed=true")
    works, _ = load_work(cfg)
    elements = ElementIndex.load(Path(cfg.corpus) / cfg.elements_file)
    note_expert_steps(elements, works)  # as the plan does: the views hold the habit ghosts
    views = [
        step_view(w.trajectory, k, elements)
        for w in works
        for k in range(len(w.trajectory.steps))
        if critique_candidate(w.trajectory, k)
    ]
    outcomes = {w.trajectory.id: w.trajectory.outcome for w in works}
    return cfg, works, elements, views, outcomes


def _emitted(views, seed=0):
    """Every Bad step every programmatic generator emits on every step (not just planned)."""
    for v in views:
        for dim, gen in PROGRAMMATIC.items():
            bad = gen(v, generator_rng(seed, v.sample_id, dim), GenParams())
            if bad is not None:
                yield v, bad


def test_every_dimension_states_a_property():
    assert set(CHECKS) == {d.name for d in DIMENSIONS}


def test_every_programmatic_sample_is_true_to_its_dimension(corpus):
    _, _, _, views, _ = corpus
    emitted = list(_emitted(views))
    assert {b.dimension for _, b in emitted} == set(PROGRAMMATIC)
    problems = [(v.sample_id, b.dimension, violation(v, b)) for v, b in emitted]
    assert [p for p in problems if p[2] is not None] == []


def test_every_offline_draft_is_true_to_its_dimension(corpus):
    _, _, _, views, _ = corpus
    n = 0
    for v in views:
        for dim, drafter in DRAFTERS.items():
            draft = drafter(v, generator_rng(0, v.sample_id, dim))
            if draft is None:
                continue
            n += 1
            bad = draft_step(dim, v, draft)
            # The planner only plans drafts that pass; count the ones that would not.
            why = violation(v, bad)
            assert why is None or dim != "Semantic Error" or "types" not in why, (v.sample_id, why)
    assert n > 50


def test_timing_never_moves_the_next_action_onto_an_unready_screen(corpus):
    _, _, _, views, _ = corpus
    timing = [(v, b) for v, b in _emitted(views) if b.dimension == "Timing and Latency Neglect"]
    assert timing
    for v, b in timing:
        for point in points_of(list(b.calls)):
            now, later = target_at(v.elements, *point), target_at(v.next_elements, *point)
            assert now is not None and later is not None and now.label == later.label


def test_no_intent_contradicts_its_call_outside_misalignment(corpus):
    _, _, _, views, _ = corpus
    for _v, b in _emitted(views):
        if b.dimension != "Action-Operation Misalignment" and b.calls is not None:
            assert intent_contradiction(b.intent, list(b.calls)) is None, (b.dimension, b.intent)
    # A reversed wheel under "Scroll down" contradicts its words: Misalignment, not a
    # miscalibrated vector; the generator shrinks instead where the intent names a direction.
    assert intent_contradiction("Scroll down the list", [{"action": "scroll", "pixels": 500}])
    pvm = [b for _, b in _emitted(views) if b.dimension == "Parameter Vector Miscalibration"]
    assert pvm and all(intent_contradiction(b.intent, list(b.calls)) is None for b in pvm)
    # Negative controls of the checker itself: the two contradictions the audit found.
    assert intent_contradiction("Report that the total is 62", [{"action": "terminate"}])
    assert intent_contradiction("Click the Name field", [{"action": "type", "text": "x"}])
    assert (
        intent_contradiction(
            "Tap the Label field and type Gym",
            [
                {"action": "click", "coordinate": [1, 2]},
                {"action": "type", "text": "Gym"},
            ],
        )
        is None
    )


def test_prerequisite_only_where_the_next_step_has_no_focus_click(corpus):
    _, _, _, views, _ = corpus
    pre = [(v, b) for v, b in _emitted(views) if b.dimension == "Procedural Prerequisite Neglect"]
    assert pre
    for v, _ in pre:
        assert primary_point(v.calls) is not None
        assert not points_of(list(v.next_calls))


def test_no_bad_intent_copies_an_earlier_step_or_the_future(corpus):
    _, works, _, views, _ = corpus
    steps = {w.trajectory.id: w.trajectory.steps for w in works}
    for v, b in _emitted(views):
        tid, k = v.sample_id.rsplit(":", 1)
        k = int(k)
        earlier = {s.intent for s in steps[tid][:k] if s.intent}
        assert not b.intent or b.intent not in earlier, (b.dimension, b.intent)
        if b.dimension == "Termination Misjudgment":
            future = {s.intent for s in steps[tid][k + 1 :] if s.intent}
            assert b.intent not in future or not b.intent


def test_action_after_completion_only_after_success(corpus):
    _, _, _, views, outcomes = corpus
    after = [(v, b) for v, b in _emitted(views) if b.method == "action_after_completion"]
    assert after
    for v, _ in after:
        assert outcomes[v.sample_id.rsplit(":", 1)[0]] == "success"


def test_offline_drafts_read_like_the_corpus(corpus):
    _, _, _, views, _ = corpus
    template = ("which is the control", " entries", "one character at a time", "look for")
    for v in views:
        for dim, drafter in DRAFTERS.items():
            draft = drafter(v, generator_rng(0, v.sample_id, dim))
            if draft is None:
                continue
            intent, calls, _, _ = draft
            # The corpus' intents have no final period (a label may end in an ellipsis).
            assert not intent.endswith(".") or intent.endswith("..."), intent
            assert not any(t in intent for t in template), intent
            if dim == "Observation Neglect" and v.platform in ("windows", "mac", "ubuntu"):
                # Desktop experts move the pointer before the wheel; so does the draft.
                assert calls[0]["action"] == "mouse_move", calls


def test_masking_is_paired_and_label_independent(corpus):
    cfg, works, elements, _, _ = corpus
    plan = build_plan(cfg, works, elements, offline=True)
    with_bad = [p for p in plan.values() if p.dimension and p.critique]
    assert with_bad and all(p.good_masked == p.bad_masked for p in with_bad if p.good)
    goods = [p.good_masked for p in plan.values() if p.critique and p.good]
    bads = [p.bad_masked for p in with_bad]
    assert abs(sum(goods) / len(goods) - sum(bads) / len(bads)) < 0.05


def test_plan_meets_the_target_distribution_and_ratio(corpus):
    cfg, works, elements, views, _ = corpus
    plan = build_plan(cfg, works, elements, offline=True)
    bads = [p.dimension for p in plan.values() if p.dimension]
    goods = [sid for sid, p in plan.items() if p.critique and p.good]
    assert len(goods) == len(bads)  # Good:Bad 1:1 by default
    share = 1 / len(DIMENSIONS)
    # Distinct steps only: instruction variants repeat a step, and a repeat is planned once.
    seen: dict[str, set] = {}
    for v, b in _emitted(views):
        seen.setdefault(b.dimension, set()).add((v.screenshot, v.intent))
    # The offline drafters are feasible only where their Bad is true (a list that shows the
    # target, a goal that names it): count those steps the same way.
    for v in views:
        for dim, drafter in DRAFTERS.items():
            draft = drafter(v, generator_rng(0, v.sample_id, dim))
            if draft is not None and violation(v, draft_step(dim, v, draft)) is None:
                seen.setdefault(dim, set()).add((v.screenshot, v.intent))
    feasible = {d: len(steps) for d, steps in seen.items()}
    counts = {d: bads.count(d) for d in {d.name for d in DIMENSIONS}}
    target = share * len(bads)
    for d, n in counts.items():
        assert n <= 1.5 * target + 1, d
        if feasible.get(d, 0) < target or n >= 0.5 * target:
            continue
        # Below half its share although enough steps could express it: only because those
        # steps went to dimensions that are short themselves (Visual Hallucination, Constraint
        # and Observation Neglect all need a list), never to one above its share.
        holders = {
            plan[v.sample_id].dimension
            for v in views
            if (v.screenshot, v.intent) in seen[d] and plan[v.sample_id].dimension not in (None, d)
        }
        assert all(counts[h] <= target + 1 for h in holders), (d, n, holders)


def test_repeated_steps_of_variants_are_planned_once_good_and_bad_alike(corpus):
    cfg, works, elements, _, _ = corpus
    plan = build_plan(cfg, works, elements, offline=True)
    repeats = [p for p in plan.values() if p.repeat_of is not None]
    assert repeats
    assert all(not p.critique and p.dimension is None for p in repeats)


def test_annotator_steps_are_rendered_canonically_and_checked():
    ok = Element("OK", "button", (400, 400, 500, 450))
    cancel = Element("Cancel", "button", (600, 400, 700, 450))
    view = StepView(
        sample_id="t:001",
        platform="windows",
        space="computer_use",
        task="Save",
        intent="Click OK",
        calls=({"action": "left_click", "coordinate": [450, 425]},),
        is_final=False,
        elements=(ok, cancel),
    )
    # The model's own formatting: key order, spacing, a float.
    step = (
        'Action: Click Cancel\n<tool_call>\n{"arguments":{"coordinate":[650.0,425],'
        '"action":"left_click"},"name":"computer_use"}\n</tool_call>'
    )
    answer = json.dumps(
        {
            "dimension_violated": "Semantic Error",
            "rejected_thought": "The Cancel button fits.",
            "rejected_proposed_step": step,
        }
    )
    validate = perturbation_validator(view, ["Semantic Error", "Constraint Neglect"])
    parsed, intent, text, calls = validate(answer, None)
    assert text == render_calls(calls, "computer_use")  # the one canonical renderer
    assert '"arguments":{' not in text and intent == "Click Cancel"
    # A dimension that was not offered is refused; a contradiction is a property violation.
    assert validate(answer.replace("Semantic Error", "Observation Neglect"), None).reason == (
        "dimension_mismatch"
    )
    typed = answer.replace("Click Cancel", "Type the name into Cancel")
    assert validate(typed, None).reason == "property_violated"


def test_property_checks_catch_the_audited_mislabels():
    from data_gen.perturb.base import BadStep

    name = Element("Name", "textbox", (100, 100, 400, 140))
    spinner = Element("Loading", "image", (400, 400, 600, 600))
    base = StepView(
        sample_id="t:001",
        platform="windows",
        space="computer_use",
        task="Fill the form",
        intent="Wait for the form",
        calls=({"action": "wait", "time": 2},),
        is_final=False,
        next_intent="Click the Name field",
        next_calls=({"action": "left_click", "coordinate": [250, 120]},),
        elements=(spinner,),
        next_elements=(name,),
        earlier_intents=("Open the form",),
    )
    # The next click moved onto the loading screen, where Name is not shown yet.
    timing = BadStep(
        "Timing and Latency Neglect", "x", "programmatic", base.next_intent, "", base.next_calls
    )
    assert "not on the current screen" in violation(base, timing)
    # An intent to report an answer over a bare terminate.
    term = BadStep(
        "Termination Misjudgment",
        "premature_terminate",
        "programmatic",
        "Report the total",
        "",
        ({"action": "terminate", "status": "success"},),
    )
    assert violation(base, term)
    # A hallucination that repeats an earlier step's words.
    ghost = BadStep(
        "Visual Hallucination",
        "x",
        "annotator",
        "Open the form",
        "",
        ({"action": "left_click", "coordinate": [800, 800]},),
    )
    assert "earlier step" in violation(base, ghost)
    assert random.Random(0)  # keeps the import honest for generators seeded per sample


def test_annotator_is_offered_the_feasible_dimensions_by_deficit(corpus):
    from data_gen.perturb import ANNOTATOR_DIMENSIONS

    cfg, works, elements, _, _ = corpus
    plan = build_plan(cfg, works, elements, offline=True)
    offered = [p for p in plan.values() if p.dimension in ANNOTATOR_DIMENSIONS]
    assert offered
    views = {
        sample_id(w.trajectory.id, k): step_view(w.trajectory, k, elements)
        for w in works
        for k in range(len(w.trajectory.steps))
    }
    params = gen_params(cfg)
    maskable = {d.name: d.maskable for d in DIMENSIONS}
    for sid, p in plan.items():
        if p.dimension not in ANNOTATOR_DIMENSIONS:
            continue
        assert p.candidates[0] == p.dimension  # the plan's pick first, then by deficit
        # Every feasible dimension is offered, of either family, and only feasible ones.
        feasible = set(eligible_dimensions(views[sid], cfg.seed, params, offline=True))
        if p.bad_masked:  # a hidden intent rules out the dimensions that need it
            feasible = {d for d in feasible if maskable[d]} | {p.dimension}
        assert set(p.candidates) == feasible, sid
    assert any(len(p.candidates) > 1 for p in offered)
    # Not only the annotator family: programmatic dimensions feasible there are offered too.
    assert any(set(p.candidates) & set(PROGRAMMATIC) for p in offered)
    # Programmatic dimensions stay exact: no choice is offered.
    assert all(not p.candidates for p in plan.values() if p.dimension in PROGRAMMATIC)
