"""What a training target may say about a screen: only what the critic's input shows.

The element sidecar knows more than a screenshot draws: an icon's name ("Back" drawn as "<"), a
bar's label, role tokens such as ``button_disabled``; the generators know how a sample was made.
None of it may reach a target, and a marker is spoken of only where one is drawn. A reversed drag
whose intent says where it goes is Action-Operation Misalignment by the taxonomy's own exclusion,
so it is never labelled Parameter Vector Miscalibration.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from data_gen.annotator import offline_answer
from data_gen.perturb import PROGRAMMATIC, BadStep, GenParams, StepView
from data_gen.perturb.elements import Element, element_from_json, role_words
from data_gen.perturb.properties import violation
from data_gen.steps.rationale import (
    PROVENANCE,
    SIDECAR_TOKENS,
    ScreenFacts,
    critique_validator,
    screen_facts,
)
from data_gen.steps.transitions import screen_change
from hivig.contracts import render_critique_target
from hivig.records import SPLITS, read_records

BACK = Element("Back", "button", (10, 40, 40, 70), "<")
BAR = Element("Export progress", "progress", (300, 500, 700, 520), "")
PUBLISH = Element("Publish", "button_disabled", (800, 900, 900, 950))
OK = Element("OK", "button", (400, 400, 500, 450))


def test_elements_are_described_by_what_the_screen_draws():
    assert BACK.described() == "the '<' button"
    assert BAR.described() == "the progress indicator"
    assert PUBLISH.described() == "the 'Publish' greyed-out button"
    assert role_words("listitem") == "list item" and role_words("odd_role") == "odd role"
    # The sidecar keeps the drawn text, and reads old lines (no text) as before.
    assert element_from_json(BACK.to_json()) == BACK
    assert element_from_json({"label": "OK", "role": "button", "box": [1, 2, 3, 4]}).text is None


def test_a_transition_names_what_appears_by_its_drawn_text():
    after = (BACK, BAR, Element("Saved", "button", (1, 1, 5, 5)))
    change = screen_change((), after)
    names = [label for label, _ in change["appeared"]]
    assert "<" in names and "Saved" in names
    assert "Back" not in names and "Export progress" not in names


def _target(explanation: str) -> str:
    return render_critique_target(
        f"The step acts on the screen. {explanation}", "Good", None, explanation
    )


def _check(explanation: str, facts: ScreenFacts) -> str | None:
    got = critique_validator("Good", None, None, None, facts)(_target(explanation), None)
    return getattr(got, "reason", None)


def test_every_target_is_held_to_what_the_critic_can_see():
    facts = screen_facts((BACK, BAR, PUBLISH, OK), "Click OK to confirm\n<\nPublish\nOK", True)
    assert facts.undrawn == ("Back", "Export progress")
    assert _check("Pressing 'Back' returns to the list.", facts) == "undrawn_label"
    assert _check("The 'Export progress' bar is full.", facts) == "undrawn_label"
    assert _check("The button_disabled cannot be pressed.", facts) == "sidecar_token"
    assert _check("The intent is kept while the point moves.", facts) == "provenance_phrase"
    assert _check("The expert clicks elsewhere.", facts) == "provenance_phrase"
    unmarked = ScreenFacts(facts.undrawn, marked=False)
    assert _check("Under the marker lies the list.", unmarked) == "marker_not_drawn"
    # What the screen and the input do show passes.
    assert _check("The '<' button returns to the list; 'OK' confirms.", unmarked) is None
    assert _check("Under the marker lies the 'OK' button.", facts) is None


def test_words_the_critics_input_holds_may_be_repeated():
    # Found in review: a task about an "expert mode", or the word "textbox" in the input, made
    # every answer about it fail; a rationale saying no marker is drawn is no claim of one.
    visible = "Turn on expert mode in Settings\nType your name into the textbox\nlistitem"
    facts = screen_facts((OK,), visible, False)
    assert _check("The step turns on the expert mode the goal asks for.", facts) is None
    assert _check("Typing into the textbox fills in the name.", facts) is None
    assert _check("There is no marker; the wait acts on the whole screen.", facts) is None
    assert _check("The listitem row is open.", facts) is None  # the input holds the word
    bare = screen_facts((OK,), "Click OK", False)
    assert _check("The expert clicks OK.", bare) == "provenance_phrase"
    assert _check("The listitem is open.", bare) == "sidecar_token"
    assert _check("The point lies beside the marker.", bare) == "marker_not_drawn"


def test_a_name_the_next_screen_draws_may_be_predicted():
    later = (Element("Close", "button", (600, 600, 700, 650)),)
    close_icon = Element("Close", "button", (960, 0, 1000, 30), "X")
    assert screen_facts((close_icon,), "Wait", True).undrawn == ("Close",)
    assert screen_facts((close_icon,), "Wait", True, later).undrawn == ()


def test_the_offline_writer_speaks_of_a_marker_only_where_one_is_drawn():
    base = {
        "task": "Save the file",
        "calls_text": "<tool_call>...</tool_call>",
        "intent": "Click OK",
        "next_state": "A dialog will open.",
        "has_point": True,
    }
    for salt in range(12):  # the writer varies its wording by a hash of the oracle
        oracle = {**base, "task": f"Save the file {salt}", "marked": False}
        text, _ = offline_answer("rationale_good", oracle, 0)
        assert "marker" not in text
        assert "at the call's point" in text
    marked = [
        offline_answer("rationale_good", {**base, "task": f"t{s}", "marked": True}, 0)[0]
        for s in range(12)
    ]
    assert any("marker" in text for text in marked)


def _drag_view(intent: str) -> StepView:
    calls = (
        {"action": "mouse_move", "coordinate": [100, 300]},
        {"action": "left_click_drag", "coordinate": [700, 300]},
    )
    return StepView(
        sample_id="t:002",
        platform="windows",
        space="computer_use",
        task="Tidy the downloads",
        intent=intent,
        calls=calls,
        is_final=False,
        elements=(),
    )


@pytest.mark.parametrize("seed", range(12))
def test_a_drag_whose_intent_says_where_it_goes_is_never_reversed(seed):
    gen = PROGRAMMATIC["Parameter Vector Miscalibration"]
    bad = gen(
        _drag_view("Drag report.pdf onto the Archive folder"), random.Random(seed), GenParams()
    )
    start, end = bad.calls[0]["coordinate"], bad.calls[1]["coordinate"]
    assert start == [100, 300] and end != [100, 300]  # shrunk, never run backwards


def test_a_reversed_drag_against_its_stated_destination_is_not_a_vector_error():
    view = _drag_view("Drag report.pdf onto the Archive folder")
    reversed_calls = (
        {"action": "mouse_move", "coordinate": [700, 300]},
        {"action": "left_click_drag", "coordinate": [100, 300]},
    )
    bad = BadStep(
        "Parameter Vector Miscalibration", "annotator", "annotator", view.intent, "", reversed_calls
    )
    assert "Misalignment" in (violation(view, bad) or "")
    # With no destination in words, running it backwards is a miscalibrated vector.
    plain = _drag_view("Drag the selection")
    bad = BadStep(
        "Parameter Vector Miscalibration",
        "annotator",
        "annotator",
        plain.intent,
        "",
        reversed_calls,
    )
    assert violation(plain, bad) is None


def test_an_exported_dataset_holds_no_unseen_fact(one_shard_offline):
    out = one_shard_offline
    records = [r for s in SPLITS for r in read_records(out / "dataset" / "records" / s)]
    critique = [r for r in records if r.kind == "critique"]
    markerless = [r for r in critique if not any(i.marks for i in r.images)]
    assert critique and markerless
    for r in records:
        assert not SIDECAR_TOKENS.search(r.target), r.id
        assert not PROVENANCE.search(r.target), r.id
    for r in markerless:
        assert not re.search(r"\bmarker\b", r.target, re.IGNORECASE), r.id
        assert "The point sits on" not in r.target, r.id
    for r in critique:
        # Found by reading 36 Bads of a fresh seed: a doubled phrase, and an overlay that the
        # generated screens never show.
        assert (
            "empty space under the marker" not in r.target.split("Under the marker lies")[-1][:40]
        )
        assert "blocking overlay" not in r.target, r.id


@pytest.fixture(scope="module")
def one_shard_offline(tmp_path_factory):
    from data_gen.config import DataGenConfig
    from data_gen.run import run
    from data_gen.sample_corpus import SampleConfig, make_sample
    from hivig.config import load_config

    root = tmp_path_factory.mktemp("facts")
    make_sample(root / "c", SampleConfig(trajectories=30, seed=0), progress=False)
    demo = Path(__file__).resolve().parents[2] / "configs" / "data_gen" / "demo.yaml"
    overrides = [f"corpus={root / 'c'}", f"out={root / 'o'}", "export.audit_max_auc=1.0"]
    run(load_config(DataGenConfig, demo, overrides), None)
    return root / "o"
