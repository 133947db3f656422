"""data_gen against the strict contracts: separate reasoning, required and renderable thinks,
targets and step texts only from hivig, and dimensions only from the taxonomy."""

from __future__ import annotations

import ast
import asyncio
import json
import re
from pathlib import Path

import pytest
from _sample_run import ingested_demo_config

from data_gen.annotator import Annotator, AnnotatorRequest, Rejected, offline_answer
from data_gen.config import DataGenConfig, PerturbConfig, UnknownDimensionError
from data_gen.perturb import ANNOTATOR_DIMENSIONS, DRAFTERS, PROGRAMMATIC
from data_gen.run import run
from data_gen.steps import work as _work
from data_gen.steps.history import validate_history
from data_gen.steps.judge import validate_judge
from data_gen.steps.perturb import perturbation_validator
from data_gen.steps.rationale import UI_RULES, critique_validator
from data_gen.steps.transitions import validate_transition
from hivig.actions import action_from_arguments
from hivig.backends import Generation, Usage
from hivig.config import BackendConfig, ConfigError, FrameConfig, load_config
from hivig.contracts import parse_critique, parse_history, render_history_target
from hivig.prompts import PromptError, format_raw_step, format_step
from hivig.records import SPLITS, read_records
from hivig.taxonomy import DIMENSIONS

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"
# The pipeline's own modules (ingest and the sample corpus read and write external formats).
OWN_SOURCES = sorted(
    [
        ROOT / "data_gen" / f"{name}.py"
        for name in (
            *("run", "config", "executor", "annotator", "export", "report"),
            *("inputs", "planning", "resume", "merge", "cli_run", "step_unit", "estimate"),
        )
    ]
    + [*(ROOT / "data_gen" / "steps").glob("*.py"), *(ROOT / "data_gen" / "perturb").glob("*.py")]
)

SUMMARY = (
    "<summary>\nProgress Summary: Opened the menu.\nLast Action Result: It opened.\n</summary>"
)
GOOD = "<criticism>\nOverall Grading: Good\nExplanation: The button opens the menu.\n</criticism>"
# Reasoning as a reasoning model returns it in a separate field: it may mention the tags freely.
TAGGY = "The format puts reasoning in </think> and then <think> would open another block."
EMPTY_THINK = re.compile(r"<think>\s*</think>", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Item: separate reasoning is passed to the parsers, never wrapped back into tags


def test_separate_reasoning_is_not_rewrapped_into_tags():
    judge = json.dumps(
        {
            "better_candidate": "A",
            "predicted_error_dimension": "Semantic Error",
            "reasoning_summary": "B misreads the label.",
        }
    )
    out = validate_judge(judge, TAGGY)
    assert not isinstance(out, Rejected), out  # wrapping it in tags gave duplicate_think
    assert out.think == TAGGY
    labelled = f"[Action Mechanism] {TAGGY}\n[Structural Effect] A menu opens."
    tr = validate_transition("<next_state>\nA menu will open.\n</next_state>", labelled)
    assert not isinstance(tr, Rejected), tr
    assert tr.next_state == "A menu will open."


def test_empty_inline_think_with_separate_reasoning_uses_the_reasoning():
    # Some servers leave an empty tag pair in the content after splitting the reasoning off.
    out = validate_history("<think>\n</think>\n" + SUMMARY, "Compared the two screenshots.")
    assert not isinstance(out, Rejected), out
    parsed, target = out
    assert parsed.think == "Compared the two screenshots."
    assert parse_history(target) == parsed
    good = critique_validator("Good", None)("<think></think>\n" + GOOD, "The menu opens.")
    assert not isinstance(good, Rejected), good
    assert parse_critique(good[1]).think == "The menu opens."


@pytest.mark.parametrize("text", [SUMMARY, "<think>\n \n</think>\n" + SUMMARY])
def test_targets_without_reasoning_are_rejected_as_missing_think(text):
    out = validate_history(text, None)
    assert isinstance(out, Rejected) and out.reason == "missing_think"
    assert isinstance(validate_history(text, "   "), Rejected)
    crit = critique_validator("Good", None)(text.replace(SUMMARY, GOOD), None)
    assert isinstance(crit, Rejected) and crit.reason == "missing_think"


def test_unrenderable_reasoning_is_rejected_not_raised():
    # Parses (separate reasoning is never scanned), but think tags may not enter a target.
    hist = validate_history(SUMMARY, TAGGY)
    assert isinstance(hist, Rejected) and hist.reason == _work.UNRENDERABLE_TARGET
    crit = critique_validator("Good", None)(GOOD, TAGGY)
    assert isinstance(crit, Rejected) and crit.reason == _work.UNRENDERABLE_TARGET
    # Negative control: the same answer with clean reasoning is accepted.
    assert not isinstance(critique_validator("Good", None)(GOOD, "Fine reasoning."), Rejected)


def test_perturbation_with_separate_reasoning():
    view = _step_view()
    obj = {
        "dimension_violated": "Semantic Error",
        "rejected_thought": "Sign up looks like the login.",
        "rejected_proposed_step": format_raw_step(
            "Click Sign Up",
            '<tool_call>\n{"name": "computer_use", "arguments": '
            '{"action": "left_click", "coordinate": [10, 10]}}\n</tool_call>',
        ),
    }
    out = perturbation_validator(view, "Semantic Error")(json.dumps(obj), TAGGY)
    assert not isinstance(out, Rejected), out
    assert out[0].think == TAGGY


def _step_view():
    from data_gen.perturb import StepView

    return StepView(
        sample_id="t:000",
        platform="ubuntu",
        space="computer_use",
        task="Log in",
        intent="Click Log In",
        calls=({"action": "left_click", "coordinate": [500, 500]},),
        is_final=False,
        next_intent="",
        next_calls=(),
        answered_before=False,
        elements=(),
        earlier_elements=(),
        next_elements=(),
    )


class _Backend:
    """Returns one scripted generation per call (text, reasoning)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = 0

    async def generate(self, messages, sampling, request_hash=None):
        text, reasoning = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return Generation(
            text=text,
            reasoning=reasoning,
            usage=Usage(0, 0),
            finish_reason="stop",
            model="m",
            sampling=sampling,
            request_hash=f"h{self.calls}",
            latency_s=0.0,
        )


def _annotator(tmp_path, backend, attempts=3):
    cfg = BackendConfig(kind="openai", base_url="http://127.0.0.1:1", model="m")
    return Annotator(cfg, FrameConfig(), tmp_path, None, attempts, backend=backend)


def test_annotator_retries_missing_think_then_keeps_the_valid_answer(tmp_path):
    backend = _Backend([(SUMMARY, None), (SUMMARY, "Compared the screens.")])
    ann = _annotator(tmp_path, backend)
    result = asyncio.run(ann.annotate(AnnotatorRequest("history", []), validate_history))
    assert result.ok and result.attempts == 2
    parsed, target = result.value
    assert parsed.think == "Compared the screens." and not EMPTY_THINK.search(target)
    # The exclusion record keeps separate reasoning separate (not re-wrapped into tags).
    assert json.loads(result.raw[1]) == {"reasoning": "Compared the screens.", "text": SUMMARY}


def test_annotator_drops_unrenderable_answers_with_a_reason(tmp_path):
    backend = _Backend([(GOOD, TAGGY)])
    ann = _annotator(tmp_path, backend, attempts=2)
    result = asyncio.run(
        ann.annotate(AnnotatorRequest("rationale_good", []), critique_validator("Good", None))
    )
    assert not result.ok and backend.calls == 2
    assert result.reason == "contract_unrenderable_target"


# ---------------------------------------------------------------------------------------------
# A run whose annotator misbehaves: nothing empty or tagged reaches a target, all is accounted


def _misbehaving(stage, oracle, attempt):
    text, reasoning = offline_answer(stage, oracle, attempt)
    pick = sum(json.dumps(oracle, sort_keys=True).encode()) % 3
    if stage == "history" and pick == 0 and attempt == 0:
        # Empty reasoning on the first attempt: retried, then the valid answer is kept.
        return "<think>\n\n</think>\n" + text.split("</think>", 1)[1].lstrip(), None
    if stage == "rationale_good" and pick == 1:
        return text.split("</think>", 1)[1].lstrip(), None  # never any reasoning
    if stage == "rationale_bad" and pick == 2:
        return text.split("</think>", 1)[1].lstrip(), TAGGY  # reasoning that cannot render
    if stage in ("transitions", "judge") and pick == 0:
        return text, "Tags such as </think> and <think> are mentioned here.\n" + (reasoning or "")
    return text, reasoning


@pytest.fixture(scope="module")
def misbehaving_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("strict")
    cfg = ingested_demo_config(root, 4, 5, "annotator.max_attempts=2")
    mp = pytest.MonkeyPatch()
    mp.setattr("data_gen.run.offline_answer", _misbehaving)
    try:
        stats = run(cfg, None)
    finally:
        mp.undo()
    return root / "o", stats


def _exported_targets(out: Path) -> list[str]:
    targets = [r.target for s in SPLITS for r in read_records(out / "dataset" / "records" / s)]
    for split in SPLITS:
        for row in json.loads((out / "dataset" / "sharegpt" / f"{split}.json").read_text()):
            targets += [c["value"] for c in row["conversations"] if c["from"] == "gpt"]
    return targets


def test_no_exported_target_has_an_empty_or_tagged_think(misbehaving_run):
    out, _ = misbehaving_run
    targets = _exported_targets(out)
    assert targets
    for target in targets:
        assert not EMPTY_THINK.search(target), target
        parsed = parse_critique(target) if "<criticism>" in target else parse_history(target)
        assert parsed.think and parsed.think.strip(), target
        assert "<think>" not in parsed.think and "</think>" not in parsed.think
    # Negative control: the scan does catch an empty block.
    assert EMPTY_THINK.search("<think>\n  \n</think>\n" + GOOD)


def test_misbehaving_answers_are_retried_or_dropped_with_reasons(misbehaving_run):
    _, stats = misbehaving_run
    stages = stats["stages"]
    rationale = stages["rationale"]
    assert rationale.get("dropped_contract_missing_think", 0) > 0
    assert rationale.get("dropped_contract_unrenderable_target", 0) > 0
    assert stages["history"].get("llm_retries", 0) > 0
    assert not any(k.startswith("dropped_contract") for k in stages["history"])
    # Separate reasoning that mentions the tags is valid for transitions and the judge.
    for stage in ("transitions", "judge"):
        assert not any(k.startswith("dropped_contract") for k in stages[stage]), stages[stage]


# ---------------------------------------------------------------------------------------------
# Item: targets and step texts come from hivig only


def _string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


@pytest.mark.parametrize("path", OWN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_target_or_step_format_is_written_by_hand(path):
    for text in _string_constants(path):
        # An HTML disclosure widget's <summary> (the data report) is markup, not a target.
        text = re.sub(r"<details[^>]*><summary>", "<details>", text)
        for fragment in ("<think>", "</think>", "<summary>", "<criticism>", "Action: "):
            assert fragment not in text, f"{path.name} writes {fragment!r} itself: {text!r}"


def test_offline_targets_are_the_contract_renderings():
    oracle = {"task": "Open the menu", "intent": "Click Menu", "no_change": False, "done": ["x"]}
    text, reasoning = offline_answer("history", oracle, 0)
    parsed = parse_history(text, reasoning, require_think=True)
    assert render_history_target(parsed.think, parsed.progress, parsed.last_result) == text


def test_format_raw_step_matches_format_step():
    calls = [{"action": "left_click", "coordinate": [1, 2]}, {"action": "type", "text": "hi"}]
    actions = [action_from_arguments(c, "computer_use") for c in calls]
    rendered = format_step(None, actions, "computer_use")
    for intent in ("  Click   the box ", "", None):
        for mask in (False, True):
            assert format_raw_step(intent, rendered, mask) == format_step(
                intent, actions, "computer_use", mask_intent=mask
            )
    broken = (
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "leftclick"\n</tool_call>'
    )
    assert format_raw_step("Click OK", broken) == f"Action: Click OK\n{broken}"
    assert format_raw_step("Click OK", broken, True) == broken
    with pytest.raises(PromptError):
        format_raw_step("Click OK", "  ")
    assert not hasattr(_work, "raw_step_text")


# ---------------------------------------------------------------------------------------------
# Item: dimensions only from hivig.taxonomy


def test_generator_registries_follow_the_taxonomy():
    programmatic = {d.name for d in DIMENSIONS if "programmatic" in d.generators}
    assert set(PROGRAMMATIC) == programmatic
    assert set(ANNOTATOR_DIMENSIONS) == {d.name for d in DIMENSIONS} - programmatic
    assert set(DRAFTERS) == set(ANNOTATOR_DIMENSIONS)
    assert set(UI_RULES) == set(DIMENSIONS)


@pytest.mark.parametrize("path", OWN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dimension_name_is_spelled_out_in_code(path):
    names = {d.name for d in DIMENSIONS}
    assert not names & set(_string_constants(path)), path.name


def test_dimension_weights_by_key_or_name():
    cfg = PerturbConfig(dimension_weights={"visual_hallucination": 2.0, "Semantic Error": 1.0})
    assert cfg.weights_by_name() == {"Semantic Error": 1.0, "Visual Hallucination": 2.0}
    assert set(PerturbConfig().weights_by_name()) == {d.name for d in DIMENSIONS}
    with pytest.raises(UnknownDimensionError, match="grounding_error"):
        PerturbConfig(dimension_weights={"grounding_error": 1.0})
    with pytest.raises(ConfigError, match="twice"):
        PerturbConfig(dimension_weights={"semantic_error": 1.0, "Semantic Error": 2.0})


def test_dimension_weight_override_by_key():
    cfg = load_config(DataGenConfig, DEMO, ["perturb.dimension_weights.suboptimal_path=0"])
    assert cfg.perturb.weights_by_name()["Suboptimal Path"] == 0.0
    with pytest.raises(UnknownDimensionError):
        load_config(DataGenConfig, DEMO, ["perturb.dimension_weights.memory_error=1"])


def test_offline_answer_that_cannot_render_is_a_drop_reason(tmp_path):
    ann = Annotator(
        BackendConfig(kind="offline"), FrameConfig(), tmp_path, None, 1, offline=offline_answer
    )
    oracle = {"task": "t", "intent": "Type </think> into the box", "no_change": False}
    result = asyncio.run(ann.annotate(AnnotatorRequest("history", [], oracle), validate_history))
    assert not result.ok and result.reason == "offline_unrenderable"
    oracle["intent"] = "Type hello into the box"  # negative control
    assert asyncio.run(ann.annotate(AnnotatorRequest("history", [], oracle), validate_history)).ok
