"""The offline critic evaluation (train.critic_eval): config, metrics, backends, outputs, CLI."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _sample_run import ingested_demo_config

from data_gen.run import run as run_data_gen
from hivig.config import ConfigError, load_config
from hivig.contracts import render_critique_target, render_history_target
from hivig.messages import ImageRef, PointMark, TextPart
from hivig.records import (
    ImageSlot,
    Labels,
    SFTRecord,
    read_records,
    records_dir,
    write_manifest,
    write_records,
)
from hivig.tiny import save_tiny_checkpoint, synthetic_screenshot
from tests.fakes.openai_server import Reply, ScriptedServer, request_text
from train import critic_eval as ce
from train.critic_eval import (
    CHANGED,
    NO_CHANGE,
    Answer,
    CriticEvalConfig,
    OraclePredictor,
    compute_metrics,
    evaluate_predictor,
    main,
    parse_backend_spec,
    select_records,
    transition_class,
)
from train.critic_eval.specs import unique_names

ROOT = Path(__file__).resolve().parents[2]
SMALL_FRAME = ["--min-pixels", "1024", "--max-pixels", "65536"]
GOOD_ANSWER = (
    "<think>\nLooks fine.\n</think>\n<criticism>\nOverall Grading: Good\n"
    "Explanation: The step moves the task forward.\n</criticism>"
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A data_gen output (offline annotator) whose test split holds half of the episodes."""
    root = tmp_path_factory.mktemp("bench_gen")
    cfg = ingested_demo_config(root, 10, 1, "export.test_share=0.5", "export.val_share=0.0")
    run_data_gen(cfg, None)
    return root / "o"


@pytest.fixture(scope="module")
def test_records(generated) -> list[SFTRecord]:
    return read_records(records_dir(generated) / "test")


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))


def _predictions(out: Path, name: str) -> list[dict]:
    lines = (out / "predictions" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _ratios(node, path=""):
    """Every (path, value) of a metric that is a share of samples (not a count)."""
    names = ("accuracy", "precision", "recall", "f1", "rate", "agreement", "detected_bad")
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "confusion":
                continue
            sub = f"{path}.{key}" if path else key
            if isinstance(value, dict):
                yield from _ratios(value, sub)
            elif any(n in key for n in names):
                yield sub, value


# ---------------------------------------------------------------------------------------------
# Oracle on the generated held-out split


def test_oracle_scores_100_percent_on_every_metric(generated, test_records, tmp_path):
    out = tmp_path / "oracle"
    assert main(["--data", str(generated), "--backend", "oracle", "--out", str(out)]) == 0
    m = _metrics(out)
    assert m["split"] == "test" and m["records"] == len(test_records) and m["skipped"] == {}
    oracle = m["backends"]["oracle"]
    kinds = Counter(r.kind for r in test_records)
    assert (
        oracle["critique"]["n"] == kinds["critique"] and oracle["history"]["n"] == kinds["history"]
    )
    assert oracle["critique"]["n_bad"] == sum(r.labels.verdict == "Bad" for r in test_records)
    seen = 0
    for path, value in _ratios(oracle):
        if value is None:  # an empty group (a dimension absent from the split)
            continue
        seen += 1
        expected = 0.0 if path.endswith(("failure_rate", "error_rate")) else 1.0
        assert value == expected, path
    assert seen > 40
    # The headline figures exist (not None) and the groups cover the split.
    crit, hist = oracle["critique"], oracle["history"]
    for key in ("verdict_accuracy", "bad_precision", "bad_recall", "bad_f1", "dimension_accuracy"):
        assert crit[key] == 1.0
    assert hist["well_formed_rate"] == hist["last_result_agreement"] == 1.0
    assert set(crit["per_platform"]) == {r.platform for r in test_records if r.kind == "critique"}
    assert crit["intent"]["masked"]["n"] > 0 and crit["intent"]["unmasked"]["n"] > 0
    assert sum(d["n"] for d in crit["per_dimension"].values()) == crit["n_bad"]
    # Every off-diagonal confusion cell is empty.
    for part in (crit, hist):
        conf = part["confusion"]
        off = sum(v for i, line in enumerate(conf["matrix"]) for j, v in enumerate(line) if i != j)
        assert off == 0 and sum(map(sum, conf["matrix"])) == part["n"]
    rows = _predictions(out, "oracle")
    assert len(rows) == len(test_records) and all(r["correct"] for r in rows)
    assert (out / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| verdict accuracy | 100.0 % |" in report and "| Bad F1 | 100.0 % |" in report
    assert (out / "run_info.json").is_file()
    saved = load_config(CriticEvalConfig, out / "config.yaml")  # the run's settings reload
    assert saved == CriticEvalConfig(data=str(generated), out=str(out), backends=["oracle"])


def test_a_wrong_label_costs_the_oracle_exactly_its_samples(test_records, tmp_path):
    """Negative control: flip one Bad record to Good in the data and the oracle must miss it."""
    flipped = next(r for r in test_records if r.labels.verdict == "Bad")
    good_like = next(r for r in test_records if r.labels.verdict == "Good")
    records = [
        dataclasses.replace(r, target=good_like.target) if r.id == flipped.id else r
        for r in test_records
    ]
    transitions = {r.id: (CHANGED if r.kind == "history" else None) for r in records}
    result = evaluate_predictor(records, OraclePredictor(), transitions)
    crit = result.metrics["critique"]
    n, n_bad = crit["n"], crit["n_bad"]
    assert crit["verdict_accuracy"] == pytest.approx((n - 1) / n)
    assert crit["bad_recall"] == pytest.approx((n_bad - 1) / n_bad)
    assert crit["bad_precision"] == 1.0
    dim = crit["per_dimension"][flipped.labels.error_dimension]
    assert dim["accuracy"] == pytest.approx((dim["n"] - 1) / dim["n"])


# ---------------------------------------------------------------------------------------------
# A backend that always says Good, over HTTP (the openai path, model discovered)


def test_always_good_backend_gives_the_counted_numbers(generated, test_records, tmp_path):
    out = tmp_path / "good"
    crit = [r for r in test_records if r.kind == "critique"]
    n_hist = len(test_records) - len(crit)
    n_good = sum(r.labels.verdict == "Good" for r in crit)
    masked = [r for r in crit if r.labels.intent_masked]
    with ScriptedServer(default=Reply(content=GOOD_ANSWER), model="always-good") as server:
        argv = ["--data", str(generated), "--backend", f"openai:{server.base_url}"]
        assert main([*argv, "--out", str(out), *SMALL_FRAME, "--concurrency", "4"]) == 0
        assert server.request_count == len(test_records)
    m = _metrics(out)["backends"]["openai:always-good"]
    c, h = m["critique"], m["history"]
    assert c["verdict_accuracy"] == pytest.approx(n_good / len(crit))
    assert c["bad"] == {
        "precision": None,  # no Bad prediction at all
        "recall": 0.0,
        "f1": 0.0,
        "tp": 0,
        "fp": 0,
        "fn": len(crit) - n_good,
        "tn": n_good,
    }
    assert c["dimension_accuracy"] == 0.0 and c["dimension_accuracy_detected"] is None
    assert c["parse_failure_rate"] == 0.0 and c["verdict_accuracy_parsed"] == c["verdict_accuracy"]
    masked_good = sum(r.labels.verdict == "Good" for r in masked)
    assert c["intent"]["masked"]["verdict_accuracy"] == pytest.approx(masked_good / len(masked))
    for platform, group in c["per_platform"].items():
        of = [r for r in crit if r.platform == platform]
        assert group["verdict_accuracy"] == pytest.approx(
            sum(r.labels.verdict == "Good" for r in of) / len(of)
        )
    # A critique answer to a history prompt has no <summary>: every history sample fails.
    assert h["n"] == n_hist and h["well_formed_rate"] == 0.0 and h["last_result_agreement"] == 0.0
    assert h["parse_failure_rate"] == 1.0 and h["failures"] == {"contract_missing_tag": n_hist}
    good_col = c["confusion"]["columns"].index("Good")
    assert sum(line[good_col] for line in c["confusion"]["matrix"]) == len(crit)


# ---------------------------------------------------------------------------------------------
# Hand-made records, scripted answers, hand-computed numbers


def _crit(case, platform, verdict, dim, masked, image):
    target = render_critique_target(f"Reasoning for {case}.", verdict, dim, "Consequence and rule.")
    return SFTRecord(
        id=case,
        kind="critique",
        platform=platform,
        prompt_version="critic_critique_v1",
        trajectory_id=f"t-{case}",
        episode_key=f"e-{case}",
        step_index=0,
        split="test",
        images=(ImageRef(image, (PointMark(500, 500),)),),
        system="You judge GUI actions.",
        user=(ImageSlot(0), TextPart(f"Case {case}.")),
        target=target,
        labels=Labels(
            verdict=verdict,
            error_dimension=dim,
            intent_masked=masked,
            generator="programmatic" if verdict == "Bad" else None,
        ),
    )


def _hist(case, before, after, result, masked=False):
    return SFTRecord(
        id=case,
        kind="history",
        platform="windows",
        prompt_version="critic_history_v1",
        trajectory_id=f"t-{case}",
        episode_key=f"e-{case}",
        step_index=1,
        split="test",
        images=(ImageRef(before), ImageRef(after)),
        system="You track the history.",
        user=(ImageSlot(0), ImageSlot(1), TextPart(f"Case {case}.")),
        target=render_history_target(f"Comparing for {case}.", "Opened the menu.", result),
        labels=Labels(intent_masked=masked),
    )


def _history_answer(result):
    return render_history_target("Compared the two screens.", "Some progress.", result)


SE, GS, CN, VH = (
    "Semantic Error",
    "Grounding/Spatial Error",
    "Constraint Neglect",
    "Visual Hallucination",
)

# case -> (record factory arguments, scripted answer)
CRITIQUE_CASES = {
    "c1": (("web", "Good", None, False), GOOD_ANSWER),
    "c2": (("web", "Good", None, True), render_critique_target("x", "Bad", SE, "y")),
    "c3": (("web", "Bad", SE, False), render_critique_target("x", "Bad", SE, "y")),
    "c4": (("android", "Bad", GS, True), render_critique_target("x", "Bad", VH, "y")),
    "c5": (("android", "Bad", CN, False), GOOD_ANSWER),
    "c6": (("android", "Good", None, False), "I think the step is fine."),
}


@pytest.fixture()
def hand_made(tmp_path) -> tuple[Path, list[SFTRecord], dict[str, str]]:
    """Records with known labels on real image files, written as a dataset, with answers."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, seed in (("a.png", 1), ("b.png", 2)):
        synthetic_screenshot(160, 96, seed).save(corpus / name)
    shutil.copy(corpus / "a.png", corpus / "a_copy.png")  # another file, the same pixels
    no_change = "'Open the menu' produced no visible change on the screen."
    changed = "'Open the menu' was carried out and the screen changed."
    records = [_crit(case, *args, "a.png") for case, (args, _) in CRITIQUE_CASES.items()]
    records += [
        _hist("h1", "a.png", "b.png", changed),
        _hist("h2", "a.png", "a_copy.png", no_change, masked=True),
        _hist("h3", "a.png", "b.png", changed),
        _hist("h4", "b.png", "a.png", changed),
        _hist("h5", "b.png", "a.png", no_change),  # a label the pixels contradict
        _hist("h6", "a.png", "missing.png", changed),  # unreadable: left out for every backend
    ]
    answers = {case: answer for case, (_, answer) in CRITIQUE_CASES.items()}
    answers |= {
        "h1": _history_answer("The click opened the menu; the screen changed."),
        "h2": _history_answer("The click produced no visible change."),
        "h3": _history_answer("Nothing happened after the click."),
        "h4": _history_answer("'Keep settings unchanged' was clicked and the dialog closed."),
        "h5": "<summary>Progress Summary: x</summary>",
        "h6": _history_answer("Irrelevant."),
    }
    data = tmp_path / "data"
    write_records(records, records_dir(data) / "test")
    write_manifest(records_dir(data), corpus)
    return data, records, answers


def _scripted(answers):
    def respond(body):
        text = request_text(body)
        case = next(c for c in answers if f"Case {c}." in text)
        return answers[case]

    return respond


def test_scripted_answers_give_hand_computed_numbers(hand_made, tmp_path):
    data, records, answers = hand_made
    out = tmp_path / "out"
    with ScriptedServer(respond=_scripted(answers)) as server:
        spec = f"openai:{server.base_url}@scripted"
        assert main(["--data", str(data), "--backend", spec, "--out", str(out), *SMALL_FRAME]) == 0
    metrics = _metrics(out)
    assert metrics["skipped"] == {"image_not_found": 1} and metrics["scored"] == 11
    m = metrics["backends"]["openai:scripted"]
    c = m["critique"]
    # c1 right, c2 FP, c3 TP + dimension, c4 TP wrong dimension, c5 FN, c6 unparseable.
    assert c["n"] == 6 and c["parsed"] == 5
    assert c["verdict_accuracy"] == pytest.approx(3 / 6)
    assert c["verdict_accuracy_parsed"] == pytest.approx(3 / 5)
    assert c["bad"] == {
        "precision": pytest.approx(2 / 3),
        "recall": pytest.approx(2 / 3),
        "f1": pytest.approx(2 / 3),
        "tp": 2,
        "fp": 1,
        "fn": 1,
        "tn": 1,
    }
    assert c["dimension_accuracy"] == pytest.approx(1 / 3)
    assert c["dimension_accuracy_detected"] == pytest.approx(1 / 2)
    assert c["parse_failure_rate"] == pytest.approx(1 / 6)
    assert c["failures"] == {"contract_missing_tag": 1}
    per_dim = c["per_dimension"]
    assert per_dim[SE] == {"n": 1, "accuracy": 1.0, "detected_bad": 1.0, "predicted": 2}
    assert per_dim[GS] == {"n": 1, "accuracy": 0.0, "detected_bad": 1.0, "predicted": 0}
    assert per_dim[CN] == {"n": 1, "accuracy": 0.0, "detected_bad": 0.0, "predicted": 0}
    assert per_dim[VH] == {"n": 0, "accuracy": None, "detected_bad": None, "predicted": 1}
    web, android = c["per_platform"]["web"], c["per_platform"]["android"]
    assert web["verdict_accuracy"] == pytest.approx(2 / 3) and web["dimension_accuracy"] == 1.0
    assert android["verdict_accuracy"] == pytest.approx(1 / 3)
    assert android["dimension_accuracy"] == 0.0 and android["bad_f1"] == pytest.approx(2 / 3)
    masked, shown = c["intent"]["masked"], c["intent"]["unmasked"]
    assert (masked["n"], masked["verdict_accuracy"], masked["dimension_accuracy"]) == (2, 0.5, 0.0)
    assert (shown["n"], shown["verdict_accuracy"], shown["dimension_accuracy"]) == (4, 0.5, 0.5)
    conf = c["confusion"]
    cell = {
        (t, p): conf["matrix"][i][j]
        for i, t in enumerate(conf["rows"])
        for j, p in enumerate(conf["columns"])
    }
    assert cell[("Good", "Good")] == 1 and cell[("Good", SE)] == 1
    assert cell[("Good", "Unparsed")] == 1 and cell[(GS, VH)] == 1 and cell[(CN, "Good")] == 1
    assert sum(conf["matrix"][conf["rows"].index(SE)]) == 1

    h = m["history"]
    # h1 right (changed), h2 right (identical pixels in another file), h3 wrong ("nothing
    # happened" after a change), h4 right (the quoted "unchanged" is the label, not the
    # result), h5 has no Last Action Result: unparseable.
    assert h["n"] == 5 and h["parsed"] == 4
    assert h["well_formed_rate"] == pytest.approx(4 / 5)
    assert h["last_result_agreement"] == pytest.approx(3 / 5)
    assert h["last_result_agreement_parsed"] == pytest.approx(3 / 4)
    assert h["per_transition"][CHANGED] == {
        "n": 4,
        "well_formed_rate": 0.75,
        "last_result_agreement": 0.5,
    }
    assert h["per_transition"][NO_CHANGE]["last_result_agreement"] == 1.0
    assert h["target_agreement"] == pytest.approx(4 / 5)  # h5's label says no change
    assert h["intent"]["masked"]["n"] == 1 and h["intent"]["masked"]["last_result_agreement"] == 1
    assert h["failures"] == {"contract_missing_field": 1}
    rows = {r["id"]: r for r in _predictions(out, "openai_scripted")}
    assert set(rows) == {r.id for r in records} - {"h6"}
    assert rows["h2"]["truth"] == {"transition": NO_CHANGE, "target_transition": NO_CHANGE}
    assert rows["h3"]["pred"]["transition"] == NO_CHANGE and not rows["h3"]["correct"]
    assert rows["c4"]["pred"] == {"verdict": "Bad", "dimension": VH}


def test_oracle_agreement_is_bounded_by_the_labels(hand_made, tmp_path):
    data, records, _ = hand_made
    out = tmp_path / "oracle"
    assert main(["--data", str(data), "--backend", "oracle", "--out", str(out)]) == 0
    m = _metrics(out)["backends"]["oracle"]
    assert m["critique"]["verdict_accuracy"] == 1.0 and m["critique"]["bad_f1"] == 1.0
    # h5's label contradicts its pixels: the oracle repeats the label and misses exactly it.
    assert m["history"]["well_formed_rate"] == 1.0
    assert m["history"]["last_result_agreement"] == m["history"]["target_agreement"] == 4 / 5
    assert m["history"]["per_transition"][NO_CHANGE]["last_result_agreement"] == 1.0


def test_backend_errors_are_counted_not_raised(hand_made, tmp_path):
    data, _, answers = hand_made
    refuse = {"c1", "h1"}

    def respond(body):
        case = next(c for c in answers if f"Case {c}." in request_text(body))
        return Reply(status=400) if case in refuse else answers[case]

    out = tmp_path / "errors"
    with ScriptedServer(respond=respond) as server:
        spec = f"openai:{server.base_url}@scripted"
        assert main(["--data", str(data), "--backend", spec, "--out", str(out), *SMALL_FRAME]) == 0
    m = _metrics(out)["backends"]["openai:scripted"]
    assert m["critique"]["backend_error_rate"] == pytest.approx(1 / 6)
    assert m["critique"]["failures"]["backend_http_status"] == 1
    assert m["critique"]["verdict_accuracy"] == pytest.approx(2 / 6)  # c1 was right before
    assert m["history"]["failures"]["backend_http_status"] == 1


def test_a_server_that_answers_nothing_exits_1(hand_made, tmp_path):
    data, _, _ = hand_made
    with ScriptedServer(default=Reply(status=400)) as server:
        spec = f"openai:{server.base_url}@scripted"
        out = tmp_path / "down"
        assert main(["--data", str(data), "--backend", spec, "--out", str(out)]) == 1
    assert _metrics(out)["backends"]["openai:scripted"]["critique"]["backend_error_rate"] == 1.0


# ---------------------------------------------------------------------------------------------
# Tiny random checkpoint, side by side with the oracle


@pytest.mark.slow
def test_tiny_checkpoint_runs_end_to_end_beside_the_oracle(generated, tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    out = tmp_path / "cmp"
    argv = ["--data", str(generated), "--compare", "oracle", f"transformers:{ckpt}"]
    assert main([*argv, "--out", str(out), "--limit", "4", "--max-tokens", "8"]) == 0
    metrics = _metrics(out)
    assert list(metrics["backends"]) == ["oracle", "transformers:tiny"]
    tiny = metrics["backends"]["transformers:tiny"]
    assert tiny["critique"]["n"] == 2 and tiny["history"]["n"] == 2  # interleaved limit
    for part in ("critique", "history"):
        p = tiny[part]
        failed = sum(p["failures"].values())
        assert p["parsed"] + failed == p["n"]
        assert p["parse_failure_rate"] == pytest.approx(
            sum(v for k, v in p["failures"].items() if k.startswith("contract_")) / p["n"]
        )
        assert p["backend_error_rate"] == 0.0
        assert 0.0 <= p["well_formed_rate" if part == "history" else "verdict_accuracy"] <= 1.0
    assert tiny["truncated"] >= 0 and tiny["completion_tokens_mean"] <= 8
    rows = _predictions(out, "transformers_tiny")
    assert len(rows) == 4 and all(isinstance(r["text"], str) for r in rows)
    assert all(r["finish_reason"] in ("stop", "length") for r in rows)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| metric | oracle | transformers:tiny |" in report
    assert (out / "confusion.png").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------
# Units


def test_transition_class_rule():
    assert transition_class("'Save' produced no visible change on the screen.") == NO_CHANGE
    assert transition_class("The click did not respond; silently failed.") == NO_CHANGE
    assert transition_class("The page remained the same.") == NO_CHANGE
    assert transition_class("The dialog stays unchanged.") == NO_CHANGE
    assert transition_class("Nothing happened.") == NO_CHANGE
    assert transition_class("The menu opened; the screen changed accordingly.") == CHANGED
    assert transition_class("'Leave unchanged' was selected and the panel closed.") == CHANGED
    assert transition_class("The user's 'no change' option was picked and it closed.") == CHANGED
    assert transition_class("Typed the text; it didn't change anything.") == NO_CHANGE


def test_backend_specs():
    assert parse_backend_spec("oracle").kind == "oracle"
    spec = parse_backend_spec("openai:http://h:8000/v1@Qwen/Qwen3-VL-8B")
    assert (spec.target, spec.model, spec.label) == (
        "http://h:8000/v1",
        "Qwen/Qwen3-VL-8B",
        "openai:Qwen/Qwen3-VL-8B",
    )
    assert parse_backend_spec("openai:https://h/v1/").target == "https://h/v1"
    assert parse_backend_spec("openai:http://h:8000@m").model == "m"
    for bad in ("gpt", "oracle:x", "openai:h:8000", "openai:http://h/v1@", "transformers:"):
        with pytest.raises(ce.CriticEvalError):
            parse_backend_spec(bad)


def test_limit_interleaves_the_tasks(test_records):
    chosen = select_records(test_records, 5)
    assert [r.kind for r in chosen] == ["critique", "history"] * 2 + ["critique"]
    assert select_records(test_records, 0) == test_records
    assert select_records(test_records, 5) == chosen  # deterministic


def test_metrics_of_no_rows_are_empty_not_errors():
    m = compute_metrics([])
    assert m["critique"]["verdict_accuracy"] is None and m["history"]["n"] == 0
    assert m["latency_s_median"] is None


def test_failed_answers_are_never_right(test_records):
    record = next(r for r in test_records if r.kind == "critique")
    row = ce.score_sample(record, Answer("", error="backend_timeout", finish_reason=""), None)
    assert row["failure"] == "backend_timeout" and not row["correct"] and row["pred"] is None


# ---------------------------------------------------------------------------------------------
# User mistakes: one line, exit 2


def _user_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_user_errors_exit_2_with_one_line(generated, tmp_path, capsys):
    out = ["--out", str(tmp_path / "o")]
    data = ["--data", str(generated)]
    assert "no such file" in _user_error(
        capsys, ["--data", str(tmp_path / "nope"), "--backend", "oracle", *out]
    )
    assert "expected oracle" in _user_error(capsys, [*data, "--backend", "gpt4", *out])
    assert "not a checkpoint" in _user_error(
        capsys, [*data, "--backend", f"transformers:{tmp_path}", *out]
    )
    assert "openai:" in _user_error(capsys, [*data, "--backend", "openai:localhost:8000", *out])
    assert "name a backend" in _user_error(capsys, [*data, *out])
    assert "'val'" in _user_error(capsys, [*data, "--split", "val", "--backend", "oracle", *out])
    assert "--limit" in _user_error(capsys, [*data, "--backend", "oracle", "--limit", "-1", *out])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot write" in _user_error(
        capsys, [*data, "--backend", "oracle", "--out", str(blocker / "sub")]
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"limit": -1}, "`limit` (--limit) must be >= 0, got -1"),
        ({"max_tokens": 0}, "`max_tokens` (--max-tokens) must be >= 1"),
        ({"concurrency": 0}, "`concurrency` (--concurrency) must be >= 1"),
        ({"temperature": -0.5}, "`temperature` (--temperature) must be >= 0"),
        ({"timeout_s": 0.0}, "`timeout_s` (--timeout) must be > 0"),
        ({"min_pixels": -1}, "`min_pixels` (--min-pixels)"),
        ({"max_pixels": -1}, "`max_pixels` (--max-pixels)"),
        ({"backends": []}, "name a backend"),
        ({"data": ""}, "`data` (--data)"),
        ({"out": ""}, "`out` (--out)"),
    ],
)
def test_config_rejects_a_bad_value_naming_field_and_flag(change, named):
    good = {"data": "d", "out": "o", "backends": ["oracle"]}
    CriticEvalConfig(**good)
    with pytest.raises(ConfigError) as err:
        CriticEvalConfig(**{**good, **change})
    assert named in str(err.value) and "\n" not in str(err.value)


def test_config_loads_from_yaml_values(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text(
        "data: runs/gen\nout: runs/eval\nbackends: [oracle, 'openai:http://h:8000/v1@m']\n"
        "limit: 10\nseed: 3\n",
        encoding="utf-8",
    )
    cfg = load_config(CriticEvalConfig, path)
    assert cfg.backends == ["oracle", "openai:http://h:8000/v1@m"] and cfg.limit == 10
    assert (cfg.seed, cfg.concurrency, cfg.max_tokens) == (3, 8, 2048)  # the dataclass defaults
    with pytest.raises(ConfigError, match="`concurrency` \\(--concurrency\\) must be >= 1"):
        load_config(CriticEvalConfig, path, ["concurrency=0"])
    with pytest.raises(ConfigError, match="max_token"):
        load_config(CriticEvalConfig, path, ["max_token=5"])  # a misspelt key


def test_flags_left_out_take_the_config_defaults(tmp_path):
    args = ce.cli._parser().parse_args(
        ["--data", "d", "--out", "o", "--backend", "oracle", "--compare", "a", "b"]
    )
    assert ce.build_config(args) == CriticEvalConfig(
        data="d", out="o", backends=["oracle", "a", "b"]
    )
    args = ce.cli._parser().parse_args(
        ["--data", "d", "--out", "o", "--backend", "oracle"]
        + ["--timeout", "5", "--max-tokens", "16", "--seed", "1", "--no-progress"]
    )
    cfg = ce.build_config(args)
    assert (cfg.timeout_s, cfg.max_tokens, cfg.seed) == (5.0, 16, 1)


def test_a_bad_flag_value_exits_2_without_a_traceback(generated, tmp_path, capsys):
    argv = ["--data", str(generated), "--backend", "oracle", "--out", str(tmp_path / "o")]
    assert "`concurrency` (--concurrency)" in _user_error(capsys, [*argv, "--concurrency", "0"])
    assert "`timeout_s` (--timeout)" in _user_error(capsys, [*argv, "--timeout", "0"])
    # A value of the wrong type is argparse's: its usage line, then one error line.
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--limit", "many"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith("argument --limit: invalid int value: 'many'")
    assert not (tmp_path / "o").exists()  # nothing written before the settings are valid


def test_an_unreachable_server_without_a_model_name_is_a_user_error(generated, tmp_path, capsys):
    with ScriptedServer() as server:
        url = server.base_url
    msg = _user_error(
        capsys,
        ["--data", str(generated), "--backend", f"openai:{url}", "--out", str(tmp_path / "o")],
    )
    assert "openai:URL@MODEL" in msg


@pytest.mark.slow
def test_module_entry_point(tmp_path):
    cmd = [sys.executable, "-m", "train.critic_eval", "--data", str(tmp_path / "x"), "--out", "o"]
    proc = subprocess.run(
        [*cmd, "--backend", "oracle"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error: --data")


def test_backend_names_stay_apart():
    specs = [
        ce.BackendSpec("transformers", "runs/a/final"),
        ce.BackendSpec("transformers", "runs/b/final"),
        ce.BackendSpec("oracle"),
        ce.BackendSpec("oracle"),
    ]
    assert unique_names(specs) == [
        "transformers:a/final",
        "transformers:b/final",
        "oracle#1",
        "oracle#2",
    ]


def test_train_evaluate_dispatches_here(generated, tmp_path, capsys):
    from train.cli import main as train_main

    out = tmp_path / "via_train"
    argv = ["evaluate", "--data", str(generated), "--backend", "oracle", "--out", str(out)]
    assert train_main([*argv, "--limit", "3"]) == 0
    assert _metrics(out)["backends"]["oracle"]["n"] == 3
    capsys.readouterr()  # the first run's progress lines
    assert (
        train_main(
            ["evaluate", "--data", str(tmp_path / "nope"), "--backend", "oracle", "--out", str(out)]
        )
        == 2
    )
    assert capsys.readouterr().err.strip().startswith("error: --data")
