"""A step's typed state (``data_gen.step_unit``) and the work-file JSON it is stored as."""

from __future__ import annotations

import json

from data_gen.perturb import BadStep
from data_gen.step_unit import JudgeVerdict, StepUnit, Transition, sample_from_json
from data_gen.steps.work import WORK_CODEC, Work
from hivig.actions import action_from_arguments
from hivig.messages import ChatMessage, ImagePart, ImageRef, PointMark, TextPart
from hivig.records import Labels, record_from_messages
from hivig.trajectory import Source, Step, Trajectory

ORIGIN = {"source": "scalecua", "hard_case": None}


def _sample(sid: str, kind: str, labels: Labels, marks=()):
    messages = [
        ChatMessage("system", [TextPart("You are a critic.")]),
        ChatMessage(
            "user",
            [TextPart("Goal: open it\n"), ImagePart(ImageRef("a/0.png", marks, "desktop"))],
        ),
    ]
    return record_from_messages(
        messages,
        "<think>t</think>",
        id=sid,
        kind=kind,
        platform="web",
        prompt_version="critic_critique_v1",
        trajectory_id="t1",
        episode_key="e1",
        step_index=0,
        split="train",
        labels=labels,
    )


# The layout the work files have always had (a run written before the units were typed).
STORED_UNIT = {
    "index": 0,
    "transition": {
        "next_state": "A dialog opens.",
        "mechanism": "m",
        "effect": "e",
        "think": None,
        "no_change": False,
        "terminal": False,
        "prompt_version": "annotator_transition_v1",
        "request_hashes": ["h1"],
    },
    "bad": {
        "dimension": "Semantic Error",
        "method": "swap",
        "generator": "programmatic",
        "intent": "Click Cancel",
        "text": "<tool_call>x</tool_call>",
        "calls": [{"action": "left_click", "coordinate": [1, 2]}],
        "thought": "",
        "note": "n",
        "extra": {},
    },
    "judge": {
        "expert_slot": "A",
        "better": "A",
        "dimension": "Semantic Error",
        "request_hashes": ["h2"],
        "prompt_version": "annotator_judge_v1",
        "accepted": True,
        "vetoes_good": False,
    },
}


def test_a_stored_unit_loads_typed_and_is_written_back_byte_for_byte():
    unit = StepUnit.from_json(STORED_UNIT)
    assert isinstance(unit.transition, Transition) and unit.transition.request_hashes == ("h1",)
    assert isinstance(unit.bad, BadStep) and unit.bad.dimension == "Semantic Error"
    assert isinstance(unit.judge, JudgeVerdict) and unit.judge.accepted
    assert unit.history is None and unit.critique is None  # stages not run yet
    again = unit.to_json(lambda s: ORIGIN)
    assert json.dumps(again, sort_keys=True) == json.dumps(STORED_UNIT, sort_keys=True)


def test_every_judge_shape_and_a_final_transition_keep_their_stored_form():
    for stored in (
        {"accepted": True, "skipped": True},
        {"accepted": False, "reason": "annotator_timeout"},
        STORED_UNIT["judge"],
    ):
        assert JudgeVerdict.from_json(stored).to_json() == stored
    # An exclusion message quotes the verdict: the key order is part of the file.
    assert list(JudgeVerdict.from_json(STORED_UNIT["judge"]).to_json()) == list(
        STORED_UNIT["judge"]
    )
    final = Transition("The task ends.", no_change=True, terminal=True)
    assert "prompt_version" not in final.to_json()
    assert Transition.from_json(final.to_json()) == final


def test_samples_stay_records_and_the_work_codec_round_trips_them():
    history = _sample("t1:000:history", "history", Labels(intent_masked=True))
    good = _sample("t1:000:good", "critique", Labels("Good"), (PointMark(10, 20),))
    click = action_from_arguments({"action": "left_click", "coordinate": [100, 200]})
    steps = [Step(0, "a/0.png", None, "Open it", [click])]
    source = Source("ScaleCUA-Data", "a.jsonl")
    traj = Trajectory("t1", "e1", source, "web", "open it", 1280, 720, steps, "success")
    work = Work(traj, "train", [StepUnit(0, history=history, critique=[good])])
    stored = WORK_CODEC.to_json(work)
    unit_json = stored["units"][0]
    # A history sample's labels are its masking alone, as the files have always held them.
    assert unit_json["history"]["labels"] == {"intent_masked": True}
    assert unit_json["critique"][0]["origin"] == ORIGIN
    back = WORK_CODEC.from_json(json.loads(json.dumps(stored)))
    assert back.units[0].history == history and back.units[0].critique == [good]
    assert back.units[0].samples() == [history, good]
    assert sample_from_json(unit_json["critique"][0]) == good


def test_a_stored_sample_this_version_refuses_is_set_aside_not_a_failed_load():
    # An earlier version stored samples unchecked and dropped a bad one at export; its work
    # files still load: the sample is kept out and travels on as (id, reason) to the export.
    good = _sample("t1:000:critique:good", "critique", Labels(verdict="Good"))
    stored = json.loads(json.dumps(STORED_UNIT))
    bad = _sample_json(good)
    bad["id"] = "t1:000:critique:bad"
    bad["messages"][1]["content"][0]["text"] = "Goal: open <image> it\n"  # a literal image token
    stored["critique"] = [_sample_json(good), bad]
    unit = StepUnit.from_json(stored)
    assert [s.id for s in unit.critique] == [good.id]
    assert [sid for sid, _ in unit.invalid] == ["t1:000:critique:bad"]
    again = StepUnit.from_json(unit.to_json(lambda s: ORIGIN))
    assert again.invalid == unit.invalid and [s.id for s in again.critique] == [good.id]


def _sample_json(record):
    from data_gen.step_unit import sample_to_json

    return json.loads(json.dumps(sample_to_json(record, ORIGIN)))
