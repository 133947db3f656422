"""The shortcut audit, the rationale and history checks every annotator faces, and the demo
export end to end: it passes its own audit, with the paper's sampling and a usable report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _sample_run import demo_config

from data_gen.annotator import Rejected
from data_gen.audit import (
    AuditSettings,
    ShortcutAuditError,
    check_audit,
    linked_groups,
    probe_auc,
    probe_text,
    shortcut_audit,
)
from data_gen.run import load_work, run
from data_gen.steps.history import history_validator
from data_gen.steps.rationale import critique_validator
from hivig.contracts import render_critique_target, render_history_target
from hivig.records import Labels, SFTRecord, TextPart, read_records
from hivig.taxonomy import DIMENSIONS

# ---------------------------------------------------------------------------------------------
# The audit on synthetic records


def _record(i: int, verdict: str, step: str, dim: str | None = None) -> SFTRecord:
    text = "User Instruction (Goal): t\nTrajectory:\nNone\nCurrent Observation: x\n" + (
        f"Current Proposed Step:\n{step}"
    )
    return SFTRecord(
        id=f"r{i}:{verdict}",
        kind="critique",
        platform="web",
        prompt_version="critic_critique_v1",
        trajectory_id=f"t{i}",
        episode_key=f"e{i % 10}",
        step_index=0,
        split="train",
        images=(),
        system="s",
        user=(TextPart(text),),
        target="<think>x</think>",
        labels=Labels(
            verdict=verdict,  # type: ignore[arg-type]
            error_dimension=dim,
            generator="programmatic" if verdict == "Bad" else None,
        ),
    )


def _records(leak: bool) -> list[SFTRecord]:
    out = []
    for i in range(60):
        x = 100 + (i * 37) % 700
        good = f'Action: Click item {i % 7}\n{{"coordinate": [{x}, 200]}}'
        other = 100 + ((i + 5) * 37) % 700  # drawn like the Good points, elsewhere
        bad = f'Action: Click item {i % 7}\n{{"coordinate": [{other}, 200]}}'
        if leak:
            bad += " zzleak."
        out += [_record(i, "Good", good), _record(i, "Bad", bad, "Grounding/Spatial Error")]
    return out


def test_a_textual_shortcut_is_found_and_fails_the_gate():
    audit = shortcut_audit(_records(leak=True), AuditSettings(max_auc=0.7))
    row = audit["families"]["text_blind"]["step"]
    assert row["auc"] > 0.95 and any("zzleak" in f for f in row["top_bad"])
    # Grounding/Spatial Error is text-blind by nature: its family and its own row are gated
    # (both probes read the step); the pointing family reports the same leak.
    assert audit["failed"] == [
        "text_blind/step",
        "text_blind/history",
        "grounding_spatial_error/step",
        "grounding_spatial_error/history",
    ]
    assert audit["families"]["pointing"]["step"]["auc"] > 0.95
    assert audit["dimensions"]["grounding_spatial_error"]["step"]["auc"] > 0.95
    with pytest.raises(ShortcutAuditError, match="text_blind/step"):
        check_audit(audit)
    # Gated by its key, the dimension alone fails too.
    alone = shortcut_audit(
        _records(leak=True), AuditSettings(max_auc=0.7, gated=("grounding_spatial_error",))
    )
    assert alone["failed"] == ["grounding_spatial_error/step", "grounding_spatial_error/history"]


def test_no_shortcut_no_failure():
    audit = shortcut_audit(_records(leak=False), AuditSettings(max_auc=0.7))
    assert audit["families"]["pointing"]["step"]["auc"] < 0.7
    assert audit["failed"] == []
    check_audit(audit)
    # Families without samples are reported as too small, never scored or gated.
    assert audit["families"]["cognitive"]["step"]["auc"] is None


def test_probe_texts():
    r = _records(leak=False)[0]
    assert probe_text(r, "step").startswith("Action: Click item 0")
    assert probe_text(r, "history").startswith(probe_text(r, "step"))


def test_the_history_probe_sees_words_copied_from_the_history():
    import dataclasses

    out = []
    for r in _records(leak=False):
        words = f"Open the panel number {int(r.trajectory_id[1:]) % 9} now"
        history = f"Step 1:\nAction: {words}\n<tool_call>x</tool_call>"
        text = r.user[0].text.replace("Trajectory:\nNone", f"Trajectory:\n{history}")
        if r.labels.verdict == "Bad":  # the Bad repeats the earlier step's words
            text = text.replace("Action: Click item", f"Action: {words} item")
        else:
            text = text.replace(
                "Action: Click item", f"Action: Close the panel {len(out) % 9} item"
            )
        out.append(dataclasses.replace(r, user=(TextPart(text),)))
    audit = shortcut_audit(out, AuditSettings(max_auc=0.7))
    row = audit["families"]["pointing"]["history"]
    assert row["auc"] > 0.9 and any("seen_" in f for f in row["top_bad"])


# ---------------------------------------------------------------------------------------------
# Checks every annotator's rationale and history answer must pass


def _critique(explanation: str, think: str = "a\n\nb\n\nc") -> str:
    return render_critique_target(think, "Bad", "Grounding/Spatial Error", explanation)


@pytest.mark.parametrize(
    ("explanation", "reason"),
    [
        ("Click at [512, 300] instead.", "explanation_coordinates"),
        ("This is a Visual Hallucination of the list.", "explanation_dimension"),
    ],
)
def test_rationale_checks_apply_to_any_annotator(explanation, reason):
    validate = critique_validator("Bad", "Grounding/Spatial Error")
    got = validate(_critique(explanation), None)
    assert isinstance(got, Rejected) and got.reason == reason
    ok = validate(_critique("The point misses the button, so nothing happens."), None)
    assert not isinstance(ok, Rejected)


def test_rationale_may_not_echo_the_masked_intent():
    hidden = "Open the Downloads folder in the sidebar"
    text = _critique("The click misses.", think=f"The agent wants to {hidden.lower()}.\n\nb\n\nc")
    got = critique_validator("Bad", "Grounding/Spatial Error", hidden)(text, None)
    assert isinstance(got, Rejected) and got.reason == "echoes_masked_intent"
    # Negative control: the same answer for an unmasked sample is fine.
    assert not isinstance(
        critique_validator("Bad", "Grounding/Spatial Error")(text, None), Rejected
    )


def test_history_target_may_not_quote_the_masked_intent():
    hidden = "Open the Downloads folder in the sidebar"
    target = render_history_target(
        "I compare the screens.", f"{hidden}", f"'{hidden}' was carried out."
    )
    got = history_validator(hidden)(target, None)
    assert isinstance(got, Rejected) and got.reason == "echoes_masked_intent"
    assert not isinstance(history_validator(None)(target, None), Rejected)


# ---------------------------------------------------------------------------------------------
# The demo export end to end (60 trajectories, the demo config)


@pytest.fixture(scope="module")
def demo(sample60, tmp_path_factory):
    cfg = demo_config(sample60, tmp_path_factory.mktemp("demo"))
    stats = run(cfg, None)
    out = Path(cfg.out)
    records = [
        r for s in ("train", "val", "test") for r in read_records(out / "dataset/records" / s)
    ]
    return cfg, stats, out, records


def test_demo_passes_its_shortcut_audit(demo):
    _, stats, _, _ = demo
    audit = stats["shortcut_audit"]
    assert audit["failed"] == []
    assert audit["families"]["text_blind"]["step"]["auc"] <= audit["settings"]["max_auc"]
    # Every dimension has its own paired AUC row.
    assert len(audit["dimensions"]) == len(DIMENSIONS)


def test_demo_sampling_follows_the_paper(demo):
    cfg, stats, _, records = demo
    # Good:Bad 1:1, history:critique 20k:32k.
    assert stats["good"] == stats["bad"]
    ratio = stats["by_kind"]["history"] / stats["by_kind"]["critique"]
    assert abs(ratio - cfg.export.history_critique_ratio) < 0.01
    # Only successful trajectories by default.
    works, quarantine = load_work(cfg)
    assert all(w.trajectory.outcome == "success" for w in works)
    assert any(q["reason"] == "not_successful" for q in quarantine)
    assert {r.trajectory_id for r in records} <= {w.trajectory.id for w in works}
    # Within [0.5, 1.5] of the target share where the corpus can carry it.
    for name, row in stats["dimension_target_vs_achieved"].items():
        assert row["achieved"] <= 1.5 * row["target"] + 1e-9, name
    # The few screens where Timing (a visible loading state) and Procedural Prerequisite
    # Neglect (a focus click on a visible text field) are true cannot carry their share.
    # Observation Neglect (a list that shows the target) and Visual Hallucination (an element
    # that only a later or earlier screen has, dead space here) are rarer still on it.
    assert set(stats["distribution_out_of_bounds"]) <= {
        "Timing and Latency Neglect",
        "Procedural Prerequisite Neglect",
        "Observation Neglect",
        "Visual Hallucination",
    }


def test_demo_masking_does_not_depend_on_the_label(demo):
    _, _, _, records = demo
    crit = [r for r in records if r.kind == "critique"]
    good = [r.labels.intent_masked for r in crit if r.labels.verdict == "Good"]
    bad = [r.labels.intent_masked for r in crit if r.labels.verdict == "Bad"]
    assert abs(sum(good) / len(good) - sum(bad) / len(bad)) < 0.03


def _intent(record) -> str | None:
    step = "".join(p.text for p in record.user if hasattr(p, "text"))
    m = re.search(r"Previous Proposed Step:\nAction: (.*)", step)
    return m.group(1) if m else None


def test_demo_history_targets_never_quote_a_masked_intent(demo):
    cfg, _, _, records = demo
    works, _ = load_work(cfg)
    steps = {w.trajectory.id: w.trajectory.steps for w in works}
    masked = [r for r in records if r.kind == "history" and r.labels.intent_masked]
    assert masked
    for r in masked:
        hidden = steps[r.trajectory_id][r.step_index].intent
        assert _intent(r) is None
        if hidden and len(hidden) >= 12:
            assert hidden.lower() not in r.target.lower(), r.id


def test_demo_explanations_name_no_dimension_and_no_coordinates(demo):
    _, _, _, records = demo
    names = [d.name.lower() for d in DIMENSIONS]
    for r in records:
        if r.kind != "critique":
            continue
        explanation = r.target.split("Explanation:", 1)[1].lower()
        assert not any(n in explanation for n in names), r.id
        assert not re.search(r"\[\s*\d+\s*,\s*\d+\s*\]", explanation), r.id


def test_demo_report_is_navigable(demo):
    _, _, out, _ = demo
    page = (out / "dataset" / "report.html").read_text(encoding="utf-8")
    assert "<nav>" in page and "href='#audit'" in page and "id='audit'" in page
    assert "id='fdim'" in page and "id='fplat'" in page  # filters by dimension and platform
    assert "target='_blank'><img" in page  # frames open full size on click
    # No "None" fields (prompt text that says "None" is the prompt's, not a field).
    assert "<td>None</td>" not in page and "generator: None" not in page
    assert "annotator: None" not in page
    # Each Bad card sits beside the Good card of its step (same screenshot).
    pairs = re.findall(r"<div class='pair' data-dims='([^']*)'", page)
    assert any(p.startswith("Good|") for p in pairs)
    # No empty folders in the dataset.
    for folder in (out / "dataset").rglob("*"):
        if folder.is_dir():
            assert any(folder.iterdir()), folder
    stats = json.loads((out / "dataset" / "stats.json").read_text())
    assert "shortcut_audit" in stats


def test_audit_command_on_a_finished_run(demo, capsys):
    from data_gen.__main__ import main

    _, _, out, _ = demo
    assert main(["audit", "--data", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pointing/step" in printed and "text_blind/step" in printed and "failed" in printed
    assert "visual_hallucination/step" in printed  # every dimension has its row
    # A threshold the demo cannot meet fails loudly (exit 1), naming the family.
    assert main(["audit", "--data", str(out), "--max-auc", "0.5"]) == 1
    assert "text_blind" in capsys.readouterr().out.split("failed", 1)[1]
    assert main(["audit", "--data", str(out), "--gated", "no_such_family"]) == 2
    assert main(["audit", "--data", str(out / "nothing")]) == 2


def test_a_bad_that_copies_another_episodes_step_shares_its_fold():
    # Paired episodes, each one's Good the other's Bad word for word (Visual Hallucination's
    # habit steps). Folded by episode alone, a probe learns the words as Bad on one episode and
    # is scored on them as the other's Good: far below 0.5, though the words say nothing.
    words = [f"item {c}" for c in "ABCDEFGHIJKLMNOPQRST"]
    texts, labels, groups = [], [], []
    for k in range(0, len(words), 2):
        a, b = f"Action: Tap {words[k]}", f"Action: Tap {words[k + 1]}"
        for episode, good, bad in ((f"e{k}", a, b), (f"e{k + 1}", b, a)):
            texts += [good, bad]
            labels += [0, 1]
            groups += [episode, episode]
    linked = linked_groups(texts, labels, groups)
    assert len(set(linked)) == len(set(groups)) // 2
    assert all(linked[i] == linked[i + 2] for i in range(0, len(texts), 4))
    assert probe_auc(texts, labels, groups, AuditSettings())["auc"] < 0.3
    assert 0.35 <= probe_auc(texts, labels, linked, AuditSettings())["auc"] <= 0.65
    # Negative control: Bads of their own words keep every episode its own group.
    own = [t if y == 0 else t + " now" for t, y in zip(texts, labels, strict=True)]
    assert linked_groups(own, labels, groups) == groups
