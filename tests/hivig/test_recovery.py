"""Recovery target choice and the Last Action Result classifier (hivig.recovery)."""

from __future__ import annotations

import json

import pytest

from hivig.config import ConfigError
from hivig.recovery import (
    Recovery,
    RecoveryTargetConfig,
    StepRecord,
    action_result_failed,
    choose_recovery,
)

FAILED_RESULTS = [
    "The click had no visible effect; the screen is unchanged.",
    "No visible change.",
    "Nothing happened after the click.",
    "Nothing seems to have changed.",
    "The Save dialog did not open.",
    "The menu didn't open; the toolbar looks the same.",
    "The checkbox was not selected.",
    "The agent could not find the search field.",
    "Typing failed: the text field was not focused.",
    "An error dialog appeared saying the file is read-only.",
    "A wrong tab opened (Images instead of News).",
    "The page remains the same as before.",
    "The screen is identical to the previous one.",
    "The login was rejected: invalid password.",
    "Last Action Result: The page still looks the same.",
    "- **Last Action Result**: Nothing changed (silent failure).",
    "The settings page closed unexpectedly.",
    "Nothing was typed; the search field remains empty.",
    "The name field is still empty.",
]
SUCCEEDED_RESULTS = [
    "The Settings window opened.",
    "The list now shows 3 filtered items.",
    "The search field now contains 'weather'.",
    "The file was saved without errors.",
    "The error dialog closed and the editor is visible again.",
    "The app closed the error message and returned to the inbox.",
    "The Wi-Fi toggle is now on; no other changes.",
    "Scrolled down: rows 20-40 of the table are now visible.",
    "Last Action Result: The compose window opened.",
    "The Error Log page opened as intended.",
    "The Error Console now lists 2 warnings.",
    "None.",
    "",
    None,
]


@pytest.mark.parametrize("text", FAILED_RESULTS)
def test_failed_results(text):
    assert action_result_failed(text) is True


@pytest.mark.parametrize("text", SUCCEEDED_RESULTS)
def test_succeeded_results(text):
    assert action_result_failed(text) is False


def _trajectory(results, changed=None):
    """Records for steps 0..n: step 0 is the first screen, step i the result of action i-1."""
    recs = [StepRecord(0, "sha256:s0", None, progress_summary="No actions yet.")]
    for i, result in enumerate(results, start=1):
        recs.append(
            StepRecord(
                step_idx=i,
                image_ref=f"sha256:s{i}",
                last_action_result=result,
                action_text=f'{{"action": "left_click", "coordinate": [{10 * i}, 500]}}',
                intent=f"Open item {i}",
                progress_summary=f"Summary after step {i}.",
                changed=None if changed is None else changed[i - 1],
            )
        )
    return recs


OK = "The next page opened."
BAD = "A wrong dialog opened instead of the settings."
DEAD = "Nothing happened; the screen is unchanged."


def test_default_target_is_the_last_success_before_the_error():
    recs = _trajectory([OK, OK, OK, BAD], changed=[True, True, True, True])
    rec = choose_recovery(recs, task="Change the display language")
    assert isinstance(rec, Recovery)
    assert rec.target_step == 3  # E = 4, so E-1 = 3
    assert rec.target_image_ref == "sha256:s3"
    assert "step 4 failed" in rec.reason and "E-1" in rec.reason
    d = rec.to_dict()
    assert set(d) == {"target_step", "target_image_ref", "reason", "brief"}
    json.dumps(d)


def test_a_run_of_failures_goes_back_before_its_first_step():
    recs = _trajectory([OK, OK, BAD, BAD, BAD], changed=[True] * 5)
    rec = choose_recovery(recs)
    assert rec.target_step == 2
    assert "steps 3-5 failed" in rec.reason
    # A success in between ends the run: only the last failure counts.
    recs = _trajectory([OK, BAD, OK, BAD], changed=[True] * 4)
    assert choose_recovery(recs).target_step == 3


def test_brief_is_built_from_the_history_up_to_the_target():
    recs = _trajectory([OK, "The form opened.", BAD], changed=[True] * 3)
    brief = choose_recovery(recs, task="Fill the form").brief
    assert "step 2" in brief
    assert "Task: Fill the form" in brief
    assert "Progress up to step 2: Summary after step 2." in brief
    assert "Summary after step 3." not in brief  # nothing after the target's summary
    # Reached steps, oldest first, then the step to undo.
    assert brief.index("step 0 -> 1") < brief.index("step 1 -> 2") < brief.index("step 2 -> 3")
    assert "The form opened." in brief and BAD in brief
    assert "Open item 3" in brief
    assert "do not start the task over" in brief


def test_no_recovery_when_nothing_failed_or_the_screen_did_not_diverge():
    assert choose_recovery(_trajectory([OK, OK], changed=[True, True])) is None
    # The failure left the screen as it was: nothing to undo (retrying is R3's business).
    recs = _trajectory([OK, DEAD], changed=[True, False])
    assert choose_recovery(recs) is None
    assert choose_recovery(recs, diverged=True).target_step == 1
    recs = _trajectory([OK, BAD], changed=[True, True])
    assert choose_recovery(recs, diverged=False) is None
    # Unknown change flags count as diverged, and the reason says it was assumed.
    rec = choose_recovery(_trajectory([OK, BAD]))
    assert rec.target_step == 1 and "may have diverged" in rec.reason


def test_first_step_is_never_a_failure_and_a_failed_first_action_goes_to_step_0():
    recs = _trajectory([BAD], changed=[True])
    rec = choose_recovery(recs)
    assert rec.target_step == 0 and rec.target_image_ref == "sha256:s0"
    # Even a step-0 record whose text looks like a failure is the starting screen.
    recs[0] = StepRecord(0, "sha256:s0", "error", failed=True)
    assert choose_recovery(recs).target_step == 0
    assert choose_recovery(recs[:1]) is None
    assert choose_recovery([]) is None


def test_given_classification_overrides_the_text():
    recs = _trajectory([OK, OK], changed=[True, True])
    recs[2] = StepRecord(2, "sha256:s2", "The dialog opened.", failed=True, changed=True)
    assert choose_recovery(recs).target_step == 1
    recs[2] = StepRecord(2, "sha256:s2", BAD, failed=False, changed=True)
    assert choose_recovery(recs) is None


def test_start_strategy_and_min_failures():
    recs = _trajectory([OK, OK, BAD], changed=[True] * 3)
    rec = choose_recovery(recs, config=RecoveryTargetConfig(strategy="start"))
    assert rec.target_step == 0 and "full reset" in rec.reason
    assert choose_recovery(recs, config=RecoveryTargetConfig(min_failures=2)) is None
    recs = _trajectory([OK, BAD, BAD], changed=[True] * 3)
    assert choose_recovery(recs, config=RecoveryTargetConfig(min_failures=2)).target_step == 1


def test_records_in_any_order_and_repeated_steps_keep_the_last():
    recs = _trajectory([OK, OK, BAD], changed=[True] * 3)
    shuffled = [recs[2], recs[0], recs[3], recs[1]]
    assert choose_recovery(shuffled).target_step == 2
    redo = StepRecord(3, "sha256:s3b", "The settings page opened.", changed=True)
    assert choose_recovery([*recs, redo]) is None


def test_brief_respects_its_length_limits():
    long = "The next page opened and shows a very long description of many things. " * 10
    recs = _trajectory([long] * 40 + [BAD], changed=[True] * 41)
    cfg = RecoveryTargetConfig(max_brief_chars=1200, max_brief_steps=12, max_line_chars=120)
    brief = choose_recovery(recs, config=cfg).brief
    assert len(brief) <= 1200
    assert "earlier steps omitted" in brief
    assert BAD in brief  # the step to undo survives the trimming
    assert "step 39 -> 40" in brief  # the newest reached step is kept


def test_from_dict_and_bad_records():
    rec = StepRecord.from_dict(
        {"step_idx": 2, "image_ref": "sha256:x", "last_action_result": DEAD, "extra": 1}
    )
    assert rec.step_idx == 2 and rec.is_failure() is True
    for bad in ({"image_ref": "x"}, {"step_idx": -1, "image_ref": "x"}, {"step_idx": 1}):
        with pytest.raises(ValueError):
            StepRecord.from_dict(bad)


@pytest.mark.parametrize(
    "field,value", [("strategy", "random"), ("min_failures", 0), ("max_brief_chars", 10)]
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        RecoveryTargetConfig(**{field: value})
