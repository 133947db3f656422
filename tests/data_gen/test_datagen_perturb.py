"""Perturbation generators (all 12 dimensions) and the corpus-wide plan."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from data_gen.perturb import DRAFTERS, PROGRAMMATIC, GenParams, StepView, plan_corpus
from data_gen.perturb.calls import parse_calls, primary_point
from data_gen.perturb.elements import Element, ElementIndex, target_at
from data_gen.perturb.plan import UnreachableDimensionError, eligible_dimensions, target_shares
from hivig.actions import ActionError, marks_for_tool_calls
from hivig.messages import ArrowMark, PointMark
from hivig.taxonomy import DIMENSIONS

P = GenParams()
OK = Element("OK", "button", (400, 400, 500, 450))
CANCEL = Element("Cancel", "button", (600, 400, 700, 450))
NAME = Element("Name", "textbox", (100, 100, 400, 140))
ROW1 = Element("Alpha", "listitem", (100, 600, 400, 640))
ROW2 = Element("Beta", "listitem", (100, 640, 400, 680))
DIALOG = Element("Save", "dialog", (50, 50, 950, 950))
SCREEN = (DIALOG, OK, CANCEL, NAME, ROW1, ROW2)


def view(calls, *, intent="Click OK to confirm", space="computer_use", elements=SCREEN, **kw):
    return StepView(
        sample_id=kw.pop("sample_id", "t:001"),
        platform="android" if space == "mobile_use" else "windows",
        space=space,
        task=kw.pop("task", "Save the file"),
        intent=intent,
        calls=tuple(calls),
        is_final=kw.pop("is_final", False),
        elements=elements,
        **kw,
    )


def rng():
    return random.Random(0)


CLICK_OK = {"action": "left_click", "coordinate": [450, 425]}


# ---------------------------------------------------------------------------------------------
# Programmatic generators


@pytest.mark.parametrize("seed", range(6))
def test_parameter_vector_reverses_or_shrinks(seed):
    bad = PROGRAMMATIC["Parameter Vector Miscalibration"](
        view([{"action": "scroll", "pixels": -400}]), random.Random(seed), P
    )
    px = bad.calls[0]["pixels"]
    assert px == 400 or (px < 0 and abs(px) < 400)
    assert parse_calls(bad.text) == list(bad.calls)


def test_parameter_vector_swipe_and_drag():
    swipe = {"action": "swipe", "coordinate": [500, 800], "coordinate2": [500, 200]}
    bad = PROGRAMMATIC["Parameter Vector Miscalibration"](
        view([swipe], space="mobile_use"), rng(), P
    )
    assert bad.calls[0] != swipe and bad.calls[0]["coordinate"] in ([500, 800], [500, 200])
    drag = [
        {"action": "mouse_move", "coordinate": [100, 100]},
        {"action": "left_click_drag", "coordinate": [700, 100]},
    ]
    bad = PROGRAMMATIC["Parameter Vector Miscalibration"](view(drag), rng(), P)
    marks = marks_for_tool_calls(bad.text)
    assert isinstance(marks[-1], ArrowMark) and marks[-1] != ArrowMark(100, 100, 700, 100)
    # Negative control: nothing to miscalibrate on a click.
    assert PROGRAMMATIC["Parameter Vector Miscalibration"](view([CLICK_OK]), rng(), P) is None


@pytest.mark.parametrize("seed", range(8))
def test_action_formulation_error_is_an_invalid_call(seed):
    bad = PROGRAMMATIC["Action Formulation Error"](view([CLICK_OK]), random.Random(seed), P)
    assert bad.calls is None
    assert isinstance(parse_calls(bad.text), ActionError)
    assert bad.intent == "Click OK to confirm"


STOP = {"action": "terminate", "status": "success"}


def test_termination_variants():
    gen = PROGRAMMATIC["Termination Misjudgment"]
    early = gen(view([CLICK_OK], final_intent="The file is saved"), rng(), P)
    assert early.method == "premature_terminate" and early.calls[0]["action"] == "terminate"
    # No words: the episode's closing words would be future information in the input.
    assert early.intent == ""
    answer = gen(view([{"action": "answer", "text": "42"}], is_final=True), rng(), P)
    # No words either: an intent to report the answer with a bare terminate would contradict
    # its call, which is Action-Operation Misalignment.
    assert answer.method == "terminate_instead_of_answer" and answer.intent == ""
    # Terminate after an answer is the correct ending: its Bad is a redundant action, never
    # another terminate, and it copies no earlier step's words.
    done = gen(
        view(
            [STOP],
            is_final=True,
            answered_before=True,
            earlier_intents=("Press OK",),
            earlier_calls=((CLICK_OK,),),
            earlier_elements=(SCREEN,),
        ),
        rng(),
        P,
    )
    assert done.method == "action_after_completion" and done.calls[0]["action"] != "terminate"
    assert done.intent == ""
    # "After the goal was met" is false where the expert gave up: no such sample then.
    failed = {"action": "terminate", "status": "failure"}
    assert gen(view([failed], is_final=True), rng(), P) is None


def test_no_premature_terminate_after_the_expert_answered():
    gen = PROGRAMMATIC["Termination Misjudgment"]
    after = view([CLICK_OK], answered_before=True, final_intent="The task is complete")
    assert gen(after, rng(), P) is None
    # Negative control: the same step before any answer is a premature terminate.
    before = view([CLICK_OK], answered_before=False, final_intent="The task is complete")
    assert gen(before, rng(), P).method == "premature_terminate"


def test_timing_acts_instead_of_the_expert_wait():
    # The next step clicks the Name field, which the loading screen already shows there.
    nxt = ({"action": "left_click", "coordinate": [250, 120]},)
    wait = [{"action": "wait", "time": 2.0}]
    gen = PROGRAMMATIC["Timing and Latency Neglect"]
    spinner = Element("Loading...", "progress", (600, 700, 800, 740))
    busy = (*SCREEN, spinner)
    v = view(wait, next_calls=nxt, next_intent="Click Name", next_elements=(NAME,), elements=busy)
    bad = gen(v, rng(), P)
    assert bad.method == "act_instead_of_wait"
    assert bad.calls == nxt and bad.intent == "Click Name"
    # Negative control: the same step on a screen that shows no loading state is no Timing.
    idle = view(wait, next_calls=nxt, next_intent="Click Name", next_elements=(NAME,))
    assert gen(idle, rng(), P) is None
    # Negative control: where the next step's target is not on the loading screen yet, moving
    # it onto this screen would be Visual Hallucination, so Timing declines.
    menu_item = Element("Save As...", "menuitem", (20, 200, 200, 240))
    nxt2 = ({"action": "left_click", "coordinate": [100, 220]},)
    v2 = view(
        wait,
        next_calls=nxt2,
        next_intent="Choose Save As",
        next_elements=(menu_item,),
        elements=busy,
    )
    assert gen(v2, rng(), P) is None


def test_timing_never_targets_an_element_not_on_screen():
    # Chaining the next click (on an element that only renders later) would be Visual
    # Hallucination by definition, so Timing comes only from a skipped wait.
    menu_item = Element("Save As...", "menuitem", (20, 200, 200, 240))
    nxt = ({"action": "left_click", "coordinate": [100, 220]},)
    gen = PROGRAMMATIC["Timing and Latency Neglect"]
    v = view([CLICK_OK], next_calls=nxt, next_intent="Choose Save As", next_elements=(menu_item,))
    assert gen(v, rng(), P) is None


def test_prerequisite_types_without_focus():
    typed = ({"action": "type", "text": "report"},)
    gen = PROGRAMMATIC["Procedural Prerequisite Neglect"]
    click = [{"action": "left_click", "coordinate": [200, 120]}]
    bad = gen(view(click, next_calls=typed, next_intent="Type report"), rng(), P)
    assert bad.calls == typed and bad.intent == "Type report"
    assert gen(view([CLICK_OK]), rng(), P) is None
    # A next step with its own focus click neglects nothing when this click is skipped.
    own = ({"action": "left_click", "coordinate": [200, 120]}, *typed)
    assert (
        gen(view(click, next_calls=own, next_intent="Click Name and type report"), rng(), P) is None
    )
    # Without the next step's own words the Bad would need the click's intent ("Click the
    # field") over a bare type: a contradiction, so none is built.
    assert gen(view(click, next_calls=typed, next_intent=""), rng(), P) is None


@pytest.mark.parametrize("seed", range(6))
def test_grounding_near_miss_is_outside_the_box_in_dead_space(seed):
    bad = PROGRAMMATIC["Grounding/Spatial Error"](view([CLICK_OK]), random.Random(seed), P)
    x, y = bad.calls[0]["coordinate"]
    assert not OK.contains(x, y)
    assert target_at(SCREEN, x, y) is None  # dead space, not another element
    dist = max(OK.box[0] - x, x - OK.box[2], OK.box[1] - y, y - OK.box[3])
    assert P.near_miss_margin <= dist <= 1.5 * P.near_miss_margin
    assert marks_for_tool_calls(bad.text) == [PointMark(x, y)]


def test_grounding_needs_a_verified_box():
    assert PROGRAMMATIC["Grounding/Spatial Error"](view([CLICK_OK], elements=()), rng(), P) is None


def test_misalignment_keeps_intent_and_moves_to_another_element():
    bad = PROGRAMMATIC["Action-Operation Misalignment"](view([CLICK_OK]), rng(), P)
    x, y = bad.calls[0]["coordinate"]
    hit = target_at(SCREEN, x, y)
    assert hit is not None and hit != OK
    assert bad.intent == "Click OK to confirm"
    assert (
        PROGRAMMATIC["Action-Operation Misalignment"](view([CLICK_OK], intent=""), rng(), P) is None
    )


HABIT = (700, 800, 900, 850)  # where an "OK" button sits on other screens of the corpus


CLICK_ALPHA = {"action": "left_click", "coordinate": [250, 620]}
GAMMA = ("Gamma", "listitem", 100, 680, 400, 720)  # the third row of the list on another screen


def test_hallucination_acts_on_an_item_that_similar_screens_show_and_this_one_does_not():
    v = view([CLICK_ALPHA], intent="Click Alpha in the list", habit_ghosts=(GAMMA,))
    bad = PROGRAMMATIC["Visual Hallucination"](v, rng(), P)
    assert bad.method == "habit_ghost" and bad.intent == "Click Gamma in the list"
    x, y = bad.calls[0]["coordinate"]
    assert target_at(SCREEN, x, y) is None and 100 <= x <= 400 and 680 <= y <= 720
    assert bad.extra["ghost"] == "Gamma"
    # Negative controls: a ghost this screen shows (Beta), one of another kind (a button),
    # another column, and a step whose intent does not name its target.
    for ghost in (
        ("Beta", "listitem", 100, 680, 400, 720),
        ("Gamma", "button", 100, 680, 400, 720),
        ("Gamma", "listitem", 500, 680, 800, 720),
    ):
        v2 = view([CLICK_ALPHA], intent="Click Alpha in the list", habit_ghosts=(ghost,))
        assert PROGRAMMATIC["Visual Hallucination"](v2, rng(), P) is None, ghost
    v3 = view([CLICK_ALPHA], intent="Pick the first row", habit_ghosts=(GAMMA,))
    assert PROGRAMMATIC["Visual Hallucination"](v3, rng(), P) is None


def test_a_ghost_whose_own_place_is_taken_goes_to_the_next_row_of_the_list():
    rows = (
        Element("Ada", "contact", (100, 500, 400, 560)),
        Element("Ben", "contact", (100, 580, 400, 640)),
    )
    on_ben = ("Cleo", "contact", 100, 580, 400, 640)  # where Ben is on this screen
    tap_ada = {"action": "left_click", "coordinate": [250, 530]}
    v = view([tap_ada], intent="Tap Ada", elements=rows, habit_ghosts=(on_ben,))
    bad = PROGRAMMATIC["Visual Hallucination"](v, rng(), P)
    x, y = bad.calls[0]["coordinate"]
    assert bad.intent == "Tap Cleo" and target_at(rows, x, y) is None
    assert 100 <= x <= 400 and 660 <= y <= 720  # the row after Ben


def test_hallucination_leaves_terminal_steps_to_termination():
    gen = PROGRAMMATIC["Visual Hallucination"]
    kw = {"intent": "Click Alpha in the list", "habit_ghosts": (GAMMA,)}
    assert gen(view([STOP], is_final=True, **kw), rng(), P) is None
    assert gen(view([{"action": "answer", "text": "4"}], **kw), rng(), P) is None
    assert gen(view([CLICK_ALPHA], **kw), rng(), P) is not None


def test_habit_ghosts_come_from_the_same_kind_of_screen():
    from data_gen.perturb.elements import ElementIndex

    chrome = [Element(n, "button", (10 * i, 0, 10 * i + 9, 20)) for i, n in enumerate("ABCDE")]
    rows = lambda *names: [  # noqa: E731
        Element(n, "contact", (100, 100 + 50 * i, 900, 140 + 50 * i)) for i, n in enumerate(names)
    ]
    other_kind = [Element(n, "button", (0, 500, 99, 520)) for n in ("X", "Y", "Z", "A", "B")]
    index = ElementIndex(
        {
            "here.png": (*chrome, *rows("Ada", "Ben")),
            "there.png": (*chrome, *rows("Ada", "Cleo", "Dev")),
            "else.png": (*other_kind, *rows("Eve")),
        }
    )
    ghosts = index.habit_ghosts("here.png")
    assert {g[0] for g in ghosts} == {"Cleo", "Dev"}  # not Ada (shown), not Eve (other screen)
    assert ("Cleo", "contact", 100, 150, 900, 190) in ghosts
    assert index.habit_ghosts("here.png") is ghosts  # worked out once per screen


def _app(*buttons):
    """A screen of one app: its shared chrome plus ``buttons`` as ``(label, box)``."""
    chrome = [Element(n, "menu", (100 * i, 0, 100 * i + 90, 30)) for i, n in enumerate("FEVH")]
    return (*chrome, *(Element(label, "button", box) for label, box in buttons))


def _expert(episode, screenshot, label, point, role="button", split="train"):
    from data_gen.perturb.elements import ExpertStep

    calls = f'[{{"action": "left_click", "coordinate": [{point[0]}, {point[1]}]}}]'
    return ExpertStep(episode, split, screenshot, point, label, role, f"Click {label}", calls)


def _note(index, steps, test=()):
    splits = {s: "test" if s in test else "train" for s in index.by_path}
    index.note_steps(steps, splits)


def test_habit_steps_pair_steps_that_are_ghosts_of_each_other():
    save, send, print_ = (100, 400, 200, 450), (700, 400, 800, 450), (400, 800, 500, 850)
    index = ElementIndex(
        {
            "a.png": _app(("Save", save)),
            "b.png": _app(("Send", send)),
            "c.png": _app(("Print", print_)),
            "d.png": _app(("Save", save), ("Send", send)),
            "other.png": (Element("Send", "button", send),),  # another app's screen
        }
    )
    steps = {
        "a": _expert("t1", "a.png", "Save", (150, 425)),
        "b": _expert("t2", "b.png", "Send", (750, 425)),
        "c": _expert("t3", "c.png", "Print", (450, 825)),
        "d": _expert("t4", "d.png", "Send", (750, 425)),
        "same": _expert("t1", "b.png", "Send", (750, 425)),  # the same episode as "a"
        "other": _expert("t5", "other.png", "Send", (750, 425)),
    }
    _note(index, steps.values())
    pairs = {k: index.habit_steps(s) for k, s in steps.items()}
    # Each step in one pair at most, both of a pair ghosts on the other's screen, never a step
    # of the same episode, of a screen that shares nothing, or one whose element is shown here.
    partners = {k: p[0] for k, p in pairs.items() if p}
    assert len(partners) % 2 == 0 and partners
    for k, other in partners.items():
        assert other != steps[k] and other.episode != steps[k].episode
        assert index.habit_steps(other) == (steps[k],)
        assert index.ghost_of(steps[k], other) and index.ghost_of(other, steps[k])
        assert other.screenshot != "other.png"
    # "d" shows Save and Send: neither "a" nor "b" is a ghost there, "c" (Print) is.
    assert pairs["d"] in ((), (steps["c"],))
    assert not pairs["other"]


def test_a_step_of_another_kind_or_too_near_is_no_habit_ghost():
    index = ElementIndex(
        {
            "a.png": _app(("Save", (100, 400, 200, 450))),
            "b.png": _app(("Name", (700, 400, 800, 450))),
            "c.png": _app(("Send", (215, 400, 300, 450))),  # 40 units from Save: a near miss
        }
    )
    a = _expert("t1", "a.png", "Save", (150, 425))
    field = _expert("t2", "b.png", "Name", (750, 425), role="textbox")
    near = _expert("t3", "c.png", "Send", (240, 425))
    _note(index, [a, field, near])
    assert index.habit_steps(a) == () and index.habit_steps(field) == ()
    assert not index.ghost_of(a, near)


def test_habit_ghosts_stay_within_their_split():
    save, send = (100, 400, 200, 450), (700, 400, 800, 450)
    index = ElementIndex({"a.png": _app(("Save", save)), "b.png": _app(("Send", send))})
    a = _expert("t1", "a.png", "Save", (150, 425))
    b = _expert("t2", "b.png", "Send", (750, 425), split="test")
    _note(index, [a, b], test={"b.png"})
    assert index.habit_steps(a) == () and index.habit_steps(b) == ()
    _note(index, [a, dataclasses.replace(b, split="train")])
    assert index.habit_steps(a) == (dataclasses.replace(b, split="train"),)


def test_hallucination_proposes_the_paired_habit_step_as_it_is():
    calls = '[{"action": "left_click", "coordinate": [800, 120]}]'
    v = view([CLICK_OK], habit_steps=(("Send", "Click Send", calls),))
    bad = PROGRAMMATIC["Visual Hallucination"](v, rng(), P)
    assert bad.method == "habit_step" and bad.intent == "Click Send"
    assert list(bad.calls) == [{"action": "left_click", "coordinate": [800, 120]}]
    assert bad.extra["ghost"] == "Send"
    # Negative controls: a point on an element here, or one next to the expert's target.
    for point in ("[650, 425]", "[520, 425]"):
        on = calls.replace("[800, 120]", point)
        v2 = view([CLICK_OK], habit_steps=(("Send", "Click Send", on),))
        assert PROGRAMMATIC["Visual Hallucination"](v2, rng(), P) is None, point


# ---------------------------------------------------------------------------------------------
# Offline drafters (annotator family)


def test_offline_drafters_produce_divergent_valid_calls():
    rows = Element("list", "list", (90, 590, 410, 690))
    v = view(
        [{"action": "left_click", "coordinate": [250, 620]}, {"action": "type", "text": "ab"}],
        elements=(*SCREEN, rows),
    )
    # Constraint Neglect needs a goal that names the expert's element (Alpha).
    v = StepView(**{**v.__dict__, "task": "Open Alpha"})
    on_ok = view([CLICK_OK])
    for dim, drafter in DRAFTERS.items():
        # Semantic Error misreads a control of the same kind (Cancel for OK).
        draft = drafter(on_ok if dim == "Semantic Error" else v, rng())
        assert draft is not None, dim
        intent, calls, thought, note = draft
        assert intent and thought and note and calls
        assert calls != list(v.calls)
    semantic = DRAFTERS["Semantic Error"](on_ok, rng())[1][0]["coordinate"]
    assert target_at(SCREEN, *semantic) == CANCEL
    # Negative control: a list entry is no control whose meaning is misread.
    assert DRAFTERS["Semantic Error"](v, rng()) is None
    constraint = DRAFTERS["Constraint Neglect"](v, rng())[1][0]["coordinate"]
    assert target_at(SCREEN, *constraint) == ROW2  # the sibling the goal does not name
    # Negative control: a goal that names neither row states no constraint to neglect.
    plain = StepView(**{**v.__dict__, "task": "Save the file"})
    assert DRAFTERS["Constraint Neglect"](plain, rng()) is None


def test_drafters_decline_without_ground():
    bare = view([{"action": "key", "keys": ["enter"]}], elements=())
    assert all(d(bare, rng()) is None for d in DRAFTERS.values())


# ---------------------------------------------------------------------------------------------
# Plan


def test_target_shares_floor():
    shares = target_shares({"a": 100.0, "b": 1.0, "c": 0.0}, 0.2)
    assert set(shares) == {"a", "b"} and shares["b"] == pytest.approx(0.2)
    assert sum(shares.values()) == pytest.approx(1.0)


def _views(n):
    out = []
    for i in range(n):
        calls = [
            [{"action": "left_click", "coordinate": [450, 425]}],
            [{"action": "scroll", "pixels": -300}],
            [{"action": "wait", "time": 1.0}],
            [{"action": "left_click", "coordinate": [200, 120]}],
            [{"action": "left_click", "coordinate": [250, 620]}],
            [{"action": "type", "text": "hello"}],
        ][i % 6]
        out.append(
            view(
                calls,
                # The row click names its row, so a layout-habit ghost (Gamma) can stand in.
                intent="Click Alpha" if i % 6 == 4 else "Click OK to confirm",
                habit_ghosts=(GAMMA,),
                sample_id=f"t{i:04d}:000",
                next_calls=({"action": "type", "text": "hello"},),
                next_intent="Type hello",
                final_intent="The task is complete",
                earlier_elements=((Element("Gone", "button", (700, 800, 900, 850)),),),
                earlier_intents=("Click Gone",),
                earlier_calls=(({"action": "left_click", "coordinate": [800, 825]},),),
                habit_boxes=(HABIT,),
                screenshot=f"s{i}.png",
                # A list that scrolls, a loading bar, a goal naming Alpha: every dimension
                # has a screen where it is true.
                elements=(*SCREEN, ROWS, SPINNER),
                task="Open Alpha",
            )
        )
    return out


ROWS = Element("list", "list", (90, 590, 410, 690))
SPINNER = Element("Loading...", "progress", (600, 700, 800, 740))


def test_plan_covers_all_dimensions_and_masks_exactly():
    views = _views(400)
    plan = plan_corpus(views, **_plan_kwargs(intent_mask_rate=0.3))
    dims = Counter(p.dimension for p in plan.values() if p.dimension)
    assert set(dims) == {d.name for d in DIMENSIONS}
    assert min(dims.values()) / sum(dims.values()) >= 0.03
    samples = [(p.good_masked, None) for p in plan.values() if p.good]
    samples += [(p.bad_masked, p.dimension) for p in plan.values() if p.dimension]
    rate = sum(m for m, _ in samples) / len(samples)
    assert abs(rate - 0.3) < 0.01
    # Masking goes by step: a step's Good and Bad are masked together or not at all.
    assert all(p.good_masked == p.bad_masked for p in plan.values() if p.dimension)
    assert not any(
        m for m, d in samples if d in ("Action-Operation Misalignment", "Visual Hallucination")
    )
    # Deterministic: the same inputs give the same plan.
    again = plan_corpus(list(reversed(views)), **_plan_kwargs(intent_mask_rate=0.3))
    assert again == plan


def test_eligibility_negative_control():
    v = view([{"action": "key", "keys": ["enter"]}], elements=())
    dims = eligible_dimensions(v, 0, P, offline=True)
    assert "Grounding/Spatial Error" not in dims and "Parameter Vector Miscalibration" not in dims
    assert "Action Formulation Error" in dims
    # A model can attempt the semantic dimensions anywhere; the offline writer cannot.
    assert set(DRAFTERS) <= set(eligible_dimensions(v, 0, P, offline=False))


def test_element_sidecar_loading(tmp_path):
    path = tmp_path / "elements.jsonl"
    path.write_text(
        '{"screenshot": "a.png", "elements": '
        '[{"label": "OK", "role": "button", "box": [1, 2, 3, 4]},'
        ' {"label": "bad", "box": [5, 5, 1, 1]}]}\nnot json\n'
    )
    index = ElementIndex.load(path)
    assert index.get("a.png") == (Element("OK", "button", (1, 2, 3, 4)),)
    assert index.malformed == 2
    assert ElementIndex.load(tmp_path / "missing.jsonl").get("a.png") == ()
    assert primary_point([{"action": "type", "text": "x"}]) is None


def test_platform_weights_downsample_the_overrepresented_platform():
    views = [view([CLICK_OK], sample_id=f"w{i:04d}:000") for i in range(300)]
    views += [
        view(
            [{"action": "click", "coordinate": [450, 425]}],
            space="mobile_use",
            sample_id=f"a{i:04d}:000",
        )
        for i in range(100)
    ]
    plan = plan_corpus(
        views,
        **_plan_kwargs(intent_mask_rate=0.3, platform_weights={"windows": 1.0, "android": 1.0}),
    )
    kept = Counter(v.platform for v in views if plan[v.sample_id].critique)
    assert kept["android"] == 100  # the rare platform is kept whole
    assert 75 <= kept["windows"] <= 125  # the common one is cut to about the same count
    dropped = [p for p in plan.values() if not p.critique]
    assert all(p.dimension is None and not p.good_masked for p in dropped)


def test_config_rejects_unknown_dimension_names():
    from data_gen.config import PerturbConfig
    from hivig.config import ConfigError

    with pytest.raises(ConfigError, match="unknown dimension"):
        PerturbConfig(dimension_weights={"Memory & State Tracking Error": 1.0})


def _plan_kwargs(**kw):
    return {
        "seed": 0,
        "params": P,
        "offline": True,
        "dimension_weights": {d.name: 1.0 for d in DIMENSIONS},
        "min_share": 0.03,
        "bad_share": 1.0,
        "platform_weights": {},
        "intent_mask_rate": 0.0,
        "maskable": {d.name: d.maskable for d in DIMENSIONS},
        **kw,
    }


def test_each_dimension_is_on_every_platform_that_can_express_it():
    # Android steps that can carry few dimensions come first in the plan's order: filled from
    # there alone, a dimension they can carry would never reach the desktop.
    desktop = _views(240)
    mobile = [
        view(
            [{"action": "click", "coordinate": [250, 620]}],
            space="mobile_use",
            intent="Tap Alpha in the list",
            habit_ghosts=(GAMMA,),
            sample_id=f"m{i:04d}:000",
            screenshot=f"m{i}.png",
        )
        for i in range(120)
    ]
    views = desktop + mobile
    plan = plan_corpus(views, **_plan_kwargs())
    can = {(d, v.platform) for v in views for d in eligible_dimensions(v, 0, P, True)}
    have = {(p.dimension, v.platform) for v in views if (p := plan[v.sample_id]).dimension}
    assert can - have == set()
    assert ("Visual Hallucination", "android") in have and (
        "Visual Hallucination",
        "windows",
    ) in have


def test_unreachable_dimension_fails_before_work_with_its_name():
    # Without element boxes (real data without a sidecar) the element dimensions have no step.
    bare = [
        view([{"action": "scroll", "pixels": -300}], sample_id=f"t{i:03d}:000", elements=())
        for i in range(20)
    ]
    with pytest.raises(UnreachableDimensionError, match="Visual Hallucination") as err:
        plan_corpus(bare, **_plan_kwargs(unreachable="error"))
    assert "Grounding/Spatial Error" in err.value.dimensions
    # As a warning the others are still planned; with weight 0 the dimension is not required.
    plan = plan_corpus(bare, **_plan_kwargs(unreachable="warn"))
    assert any(p.dimension for p in plan.values())
    reachable = {
        d.name: 1.0
        for d in DIMENSIONS
        if d.name in ("Parameter Vector Miscalibration", "Action Formulation Error")
    }
    plan_corpus(bare, **_plan_kwargs(unreachable="error", dimension_weights=reachable))


def test_critique_marks_keep_a_drag_that_opens_its_step():
    # Rendered tool calls drop where a drag starts; the pointer the earlier steps left gives it.
    from data_gen.steps.work import step_marks, step_text
    from hivig.actions import action_from_arguments
    from hivig.trajectory import Source, Step, Trajectory

    click = action_from_arguments({"action": "left_click", "coordinate": [100, 200]})
    drag = action_from_arguments({"action": "left_click_drag", "coordinate": [700, 100]})
    steps = [Step(0, "a.png", None, "Select the file", [click])]
    steps.append(Step(1, "b.png", None, "Drag it to the folder", [drag]))
    source = Source("d", "f.jsonl")
    traj = Trajectory("t", "e", source, "windows", "Move the file", 1920, 1080, steps)
    text = step_text(traj, 1, True)
    assert marks_for_tool_calls(text) == []  # no start in the text alone
    assert step_marks(traj, 1, text) == [ArrowMark(100, 200, 700, 100)]


def test_misalignment_points_at_a_neighbour_not_the_chrome():
    # Far corner elements (window chrome on every screen) are never the slip target while
    # nearer ones exist: the coordinates alone would otherwise mark the Bad samples.
    chrome = tuple(Element(f"Tab {i}", "tab", (10 + 60 * i, 5, 60 + 60 * i, 30)) for i in range(6))
    gen = PROGRAMMATIC["Action-Operation Misalignment"]
    hits = set()
    for seed in range(40):
        bad = gen(view([CLICK_OK], elements=SCREEN + chrome), random.Random(seed), P)
        hits.add(target_at(SCREEN + chrome, *bad.calls[0]["coordinate"]).label)
    assert hits and not hits & {e.label for e in chrome}
    assert len(hits) > 1  # still a choice among the neighbours, not one fixed element
