"""Every Bad is wrong in its own dimension, by the definition the critic is trained on, and no
training target states a fact the critic's input does not show.

Each case below is one the hand audit of the previous generators found false (the named target
visible for Visual Hallucination, a sibling command for Constraint Neglect, a click on the clock
for Semantic Error, "scroll down the list" with no list, a focus click on no text field, an
answer read off a loading screen, the real scroll magnitude and element boxes in rationales).
The corpus-wide tests run every generator on every step of a generated corpus and check the
screen's elements directly, not through the property checks alone.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from _sample_run import demo_config

from data_gen.annotator import offline_answer
from data_gen.audit import (
    DEFAULT_GATED,
    DIMENSION_AUDITS,
    TEXT_BLIND,
    AuditSettings,
    shortcut_audit,
)
from data_gen.perturb import DRAFTERS, PROGRAMMATIC, ElementIndex, GenParams, StepView
from data_gen.perturb.base import BadStep
from data_gen.perturb.calls import primary_point, render_calls
from data_gen.perturb.elements import Element, target_at
from data_gen.perturb.plan import draft_step, generator_rng
from data_gen.perturb.programmatic import mentions, on_screen_labels
from data_gen.perturb.properties import violation
from data_gen.perturb.semantic import (
    INTERACTIVE_ROLES,
    label_core,
    scroll_region,
    stated_in_goal,
)
from data_gen.run import load_work, run
from data_gen.steps.rationale import critique_validator, privileged_numbers
from data_gen.steps.transitions import validate_transition
from data_gen.steps.work import critique_candidate, note_expert_steps, step_view
from hivig.contracts import render_critique_target
from hivig.messages import ImageRef
from hivig.prompts import build_perturbation_messages, build_rationale_bad_messages
from hivig.records import read_records
from hivig.taxonomy import DIMENSIONS, lookup_dimension

VH = "Visual Hallucination"
CN = "Constraint Neglect"
SE = "Semantic Error"
ON = "Observation Neglect"


@pytest.fixture(scope="module")
def views(sample60, tmp_path_factory):
    cfg = demo_config(sample60, tmp_path_factory.mktemp("validity"), "keep_failed=true")
    works, _ = load_work(cfg)
    elements = ElementIndex.load(Path(cfg.corpus) / cfg.elements_file)
    note_expert_steps(elements, works)
    return [
        step_view(w.trajectory, k, elements)
        for w in works
        for k in range(len(w.trajectory.steps))
        if critique_candidate(w.trajectory, k)
    ]


def _bads(views, dimension):
    out = []
    for v in views:
        rng = generator_rng(0, v.sample_id, dimension)
        if dimension in PROGRAMMATIC:
            bad = PROGRAMMATIC[dimension](v, rng, GenParams())
        else:
            draft = DRAFTERS[dimension](v, rng)
            bad = None if draft is None else draft_step(dimension, v, draft)
        if bad is not None and violation(v, bad) is None:
            out.append((v, bad))
    return out


def _expert_target(v):
    hit = primary_point(v.calls)
    return None if hit is None else target_at(v.elements, *hit[1]["coordinate"])


def _point(bad):
    hit = primary_point(list(bad.calls))
    return None if hit is None else tuple(hit[1]["coordinate"])


# -------------------------------------------------------------------------------------------
# Visual Hallucination: the named element is not on the current screen


def test_hallucination_names_an_element_this_screen_does_not_show(views):
    bads = _bads(views, VH)
    assert len(bads) >= 10
    for v, b in bads:
        # The previous generator kept the expert's intent, which names the visible target.
        assert not [e for e in v.elements if e.label and mentions(e.label, b.intent)], b.intent
        assert target_at(v.elements, *_point(b)) is None
        ghost = b.extra["ghost"]
        assert mentions(ghost, b.intent) and ghost.lower() not in on_screen_labels(v.elements)
    # Its ghosts come from screens of the same platform, never another platform's layout, and
    # every platform that has one is represented.
    shown = {}
    for v in views:
        shown.setdefault(v.platform, set()).update(e.label for e in v.elements)
    for v, b in bads:
        assert b.extra["ghost"] in shown[v.platform], (v.platform, b.extra["ghost"])
    assert {v.platform for v, _ in bads} == {"windows", "mac", "ubuntu", "web", "android"}
    assert {b.method for _, b in bads} == {"habit_ghost", "habit_step"}


def _screen(*elements):
    return StepView(
        sample_id="t:002",
        platform="android",
        space="mobile_use",
        task="Save the note",
        intent="Tap Save",
        calls=({"action": "click", "coordinate": [150, 120]},),
        is_final=False,
        elements=elements,
    )


def test_hallucination_check_rejects_a_visible_named_target():
    save = Element("Save", "button", (100, 100, 200, 140))
    v = _screen(save)
    blank = ({"action": "click", "coordinate": [700, 700]},)
    assert "visible on this screen" in violation(
        v, BadStep(VH, "x", "programmatic", "Tap Save", "", blank)
    )
    ok = BadStep(VH, "x", "programmatic", "Tap Share", "", blank)
    assert violation(v, ok) is None


# -------------------------------------------------------------------------------------------
# Constraint Neglect: an attribute the goal states is broken


def test_constraint_neglect_breaks_what_the_goal_states(views):
    bads = _bads(views, CN)
    assert len(bads) >= 10
    for v, b in bads:
        right, wrong = _expert_target(v), target_at(v.elements, *_point(b))
        assert stated_in_goal(right.label, v.task), (v.task, right.label)
        assert not stated_in_goal(wrong.label, v.task), (v.task, wrong.label)
        assert wrong.role == right.role and label_core(wrong.label) != label_core(right.label)
        assert right.role not in {"menuitem", "button", "menu"}  # no sibling commands


def test_constraint_check_rejects_a_sibling_command():
    trash = Element("Move to Trash", "menuitem", (100, 100, 300, 130))
    copy = Element("Copy", "menuitem", (100, 140, 300, 170))
    v = StepView(
        sample_id="t:003",
        platform="mac",
        space="computer_use",
        task="Delete budget_3.pdf",
        intent="Click Move to Trash",
        calls=({"action": "left_click", "coordinate": [200, 115]},),
        is_final=False,
        elements=(trash, copy),
    )
    bad = BadStep(
        CN,
        "annotator",
        "annotator",
        "Click Copy",
        "",
        ({"action": "left_click", "coordinate": [200, 155]},),
    )
    assert "goal states no attribute" in violation(v, bad)
    a = Element("budget_3.pdf", "file", (100, 300, 400, 330))
    b = Element("budget_4.pdf", "file", (100, 340, 400, 370))
    v2 = StepView(
        **{
            **v.__dict__,
            "intent": "Click budget_3.pdf",
            "calls": ({"action": "left_click", "coordinate": [200, 315]},),
            "elements": (a, b),
        }
    )
    good = BadStep(
        CN,
        "annotator",
        "annotator",
        "Click budget_4.pdf",
        "",
        ({"action": "left_click", "coordinate": [200, 355]},),
    )
    assert violation(v2, good) is None


# -------------------------------------------------------------------------------------------
# Semantic Error, Observation Neglect, Procedural Prerequisite Neglect, Timing


def test_semantic_error_hits_a_clickable_element_never_the_clock(views):
    bads = _bads(views, SE)
    assert bads
    for v, b in bads:
        assert target_at(v.elements, *_point(b)).role in INTERACTIVE_ROLES
    clock = Element("10:42", "clock", (900, 0, 1000, 30))
    ok = Element("OK", "button", (100, 100, 200, 140))
    v = _screen(ok, clock)
    bad = BadStep(
        SE,
        "annotator",
        "annotator",
        "Tap 10:42",
        "",
        ({"action": "click", "coordinate": [950, 15]},),
    )
    assert "does nothing when clicked" in violation(v, bad)


def test_observation_neglect_scrolls_a_list_that_shows_the_target(views):
    bads = _bads(views, ON)
    assert bads
    for v, _ in bads:
        assert scroll_region(v, _expert_target(v)) is not None
    save = Element("Save", "button", (100, 100, 200, 140))
    swipe = ({"action": "swipe", "coordinate": [500, 700], "coordinate2": [500, 300]},)
    bad = BadStep(ON, "annotator", "annotator", "Swipe up on the list to scroll down", "", swipe)
    assert "nothing to scroll" in violation(_screen(save), bad)


def test_prerequisite_focus_click_is_on_a_visible_text_field(views):
    pre = _bads(views, "Procedural Prerequisite Neglect")
    assert pre
    for v, _ in pre:
        assert _expert_target(v).role == "textbox"
    button = Element("Next", "button", (100, 100, 200, 140))
    v = StepView(
        **{
            **_screen(button).__dict__,
            "next_intent": "Type hello",
            "next_calls": ({"action": "type", "text": "hello"},),
        }
    )
    bad = BadStep(
        "Procedural Prerequisite Neglect", "x", "programmatic", "Type hello", "", v.next_calls
    )
    assert "text field" in violation(v, bad)


def test_timing_needs_a_loading_state_and_never_answers():
    spinner = Element("Loading...", "progress", (400, 400, 600, 440))
    total = Element("Total: 62 units", "listitem", (100, 100, 400, 140))
    base = StepView(
        sample_id="t:004",
        platform="web",
        space="computer_use",
        task="Tell me the total",
        intent="Wait 2 seconds for the report to load",
        calls=({"action": "wait", "time": 2},),
        is_final=False,
        next_intent="Report the total",
        next_calls=({"action": "answer", "text": "62"},),
        elements=(spinner,),
        next_elements=(total,),
    )
    answer = BadStep(
        "Timing and Latency Neglect", "x", "programmatic", base.next_intent, "", base.next_calls
    )
    assert "later screen" in violation(base, answer)
    assert (
        PROGRAMMATIC["Timing and Latency Neglect"](
            base, generator_rng(0, "t:004", "t"), GenParams()
        )
        is None
    )
    idle = StepView(
        **{
            **base.__dict__,
            "elements": (total,),
            "next_intent": "Click Total",
            "next_calls": ({"action": "left_click", "coordinate": [200, 120]},),
        }
    )
    click = BadStep(
        "Timing and Latency Neglect", "x", "programmatic", idle.next_intent, "", idle.next_calls
    )
    assert "no loading state" in violation(idle, click)


# -------------------------------------------------------------------------------------------
# No privileged facts


def test_generator_notes_state_no_number_the_critic_cannot_see(views):
    # The note feeds the offline rationale; the expert's magnitude or a sidecar box in it was
    # the previous generators' leak ("a scroll of -500 px became -25 px", "[120, 40, 220, 80]").
    n = 0
    for dim in list(PROGRAMMATIC) + list(DRAFTERS):
        for v, b in _bads(views, dim):
            visible = f"{v.task}\n{b.intent}\n{b.text or render_calls(list(b.calls), v.space)}"
            visible += "\n" + "\n".join(e.label for e in v.elements)
            assert privileged_numbers(b.note, visible) == [], (dim, b.note)
            n += 1
    assert n > 200


def _critique(think, verdict="Good", dim=None, expl="The dialog will close."):
    return render_critique_target(think, verdict, dim, expl)


def test_rationale_checks_cover_the_reasoning_and_privileged_numbers():
    visible = 'Goal: scroll the list\n<tool_call>{"pixels": -25}</tool_call>'
    validate = critique_validator("Bad", "Parameter Vector Miscalibration", None, visible)
    leak = _critique("A scroll of -500 px became -25 px.", "Bad", "Parameter Vector Miscalibration")
    assert validate(leak, None).reason == "privileged_fact"
    box = _critique(
        "The element spans [120, 40, 220, 80].", "Bad", "Parameter Vector Miscalibration"
    )
    assert validate(box, None).reason == "privileged_fact"
    fine = _critique(
        "The wheel turns by 25 px, far too little.", "Bad", "Parameter Vector Miscalibration"
    )
    assert not hasattr(validate(fine, None), "reason")
    # A Thinking model's separate reasoning becomes the <think>: same word checks.
    text = "<criticism>\nOverall Grading: Good\nExplanation: The dialog will close.\n</criticism>"
    good = critique_validator("Good", None, None, visible)
    assert good(text, "The ideal move is this one.").reason == "forbidden_word"
    assert good(text, "The view will change as the list scrolls.") is not None
    assert not hasattr(good(text, "The view will change as the list scrolls."), "reason")


def test_transition_without_its_labels_is_retried_not_silently_none():
    text = "<next_state>\nA dialog will open.\n</next_state>"
    assert validate_transition(text, "[Action Mechanism] A click.").reason == (
        "missing_transition_labels"
    )
    both = "[Action Mechanism] A click.\n[Structural Effect] A dialog opens."
    assert not hasattr(validate_transition(text, both), "reason")


def test_bad_rationale_prompt_gets_the_reference_intent_only():
    shot = ImageRef("s.png")
    msgs = build_rationale_bad_messages(
        "Save the file",
        "windows",
        "",
        shot,
        "Action: Click Cancel\n<tool_call>x</tool_call>",
        lookup_dimension(SE),
        "Click Save",
        "mech",
        "effect",
    )
    user = msgs[1].text()
    assert "Hidden Reference Intent: Click Save" in user
    assert "Hidden Correct Step" not in user
    assert "Hidden Definition: " + lookup_dimension(SE).definition in user


def test_perturbation_prompt_says_none_for_a_missing_thought():
    msgs = build_perturbation_messages(
        "Save", "web", "", ImageRef("s.png"), "", "Action: Click Save", DIMENSIONS[:2]
    )
    assert re.search(r"Chosen Thought[^\n]*:\nnone\n", msgs[1].text())


def test_definitions_carry_their_exclusion_clauses():
    for d in DIMENSIONS:
        assert len(d.definition) >= 250, d.name
    assert "not Constraint Neglect" in lookup_dimension(CN).definition
    assert "not a fixed offset" in lookup_dimension("Grounding/Spatial Error").definition


# -------------------------------------------------------------------------------------------
# The offline annotator's text and the audit, on a whole run


@pytest.fixture(scope="module")
def demo_records(sample60, tmp_path_factory):
    cfg = demo_config(sample60, tmp_path_factory.mktemp("validity_run"))
    stats = run(cfg, None)
    out = Path(cfg.out)
    records = [
        r for s in ("train", "val", "test") for r in read_records(out / "dataset/records" / s)
    ]
    return cfg, stats, records


@pytest.mark.slow
def test_no_exported_target_states_a_privileged_number(demo_records):
    cfg, _, records = demo_records
    elements = ElementIndex.load(Path(cfg.corpus) / cfg.elements_file)
    critiques = [r for r in records if r.kind == "critique"]
    assert critiques
    for r in critiques:
        user = "\n".join(p.text for p in r.user if hasattr(p, "text"))
        labels = "\n".join(e.label for i in r.images for e in elements.get(i.path))
        assert privileged_numbers(r.target, user + "\n" + labels) == [], r.id


@pytest.mark.slow
def test_good_rationales_describe_their_own_next_state(demo_records):
    _, _, records = demo_records
    goods = [r for r in records if r.kind == "critique" and r.labels.verdict == "Good"]
    states = Counter(r.target.split("\n\n")[1] for r in goods)
    # The previous offline writer gave 319 of 363 Goods one next-state sentence.
    assert states.most_common(1)[0][1] / len(goods) < 0.35


@pytest.mark.slow
def test_audit_reports_every_dimension_and_gates_the_text_blind_ones(demo_records):
    _, stats, records = demo_records
    audit = stats["export"]["shortcut_audit"] if "export" in stats else stats["shortcut_audit"]
    assert set(audit["dimensions"]) == set(DIMENSION_AUDITS)
    # Every dimension has enough pairs for its own AUC (none is reported as too small).
    small = [k for k, row in audit["dimensions"].items() if row["step"]["auc"] is None]
    assert small == []
    # Gated by default: the text-blind family pooled, and alone its members whose own probe
    # stays clear of the gate (Grounding/Spatial Error, Constraint Neglect).
    assert audit["settings"]["gated"] == list(DEFAULT_GATED)
    assert set(audit["families"]["text_blind"]["dimensions"]) == set(TEXT_BLIND)
    assert audit["families"]["text_blind"]["step"]["auc"] <= 0.7
    gated = {k for k, row in audit["dimensions"].items() if row["gated"]}
    assert gated == {"grounding_spatial_error", "constraint_neglect"}
    assert {lookup_dimension(k).name for k in gated} <= set(TEXT_BLIND)
    assert all(audit["dimensions"][k]["step"]["auc"] <= 0.7 for k in gated)
    assert audit["failed"] == []
    # A leaky dimension under its own key's gate fails.
    strict = shortcut_audit(records, AuditSettings(max_auc=0.7, gated=("suboptimal_path",)))
    assert "suboptimal_path/step" in strict["failed"]


def test_offline_bad_explanations_vary_within_a_dimension():
    base = {
        "calls_text": "<tool_call>x</tool_call>",
        "dimension": SE,
        "consequence": "The wrong action succeeds.",
        "rule": "the label matches",
        "note": "x",
    }
    texts = {
        offline_answer("rationale_bad", {**base, "task": f"task {i}"}, 0)[0] for i in range(12)
    }
    explanations = {t.rsplit("Explanation:", 1)[1] for t in texts}
    assert len(explanations) >= 2
