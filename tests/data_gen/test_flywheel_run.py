"""The flywheel in ``data_gen run``: an agent's runs become Goods, real Bads and hard cases.

Result folders are written in OSWorld's layout (``traj.jsonl`` lines with ``step_num``,
``action``, ``response``, ``screenshot_file``; ``result.txt``), ingested by ``ingest-runs`` with
``diagnosis.json`` files shaped like ``serve.diagnose``'s, and run through the whole pipeline
with the offline annotator next to a generated ScaleCUA sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from data_gen.flywheel import HARD_BAD_ON_SUCCESS, HARD_GOOD_ON_ROOT, mix_surplus_runs
from data_gen.run import load_work_and_runs, run
from data_gen.runs import ingest_runs
from data_gen.runs.diagnoses import CUADEBUG_TO_DIMENSION, dimension_for
from hivig.records import read_records
from hivig.taxonomy import DIMENSIONS
from tests._sample_run import demo_config, ingested_sample

OK_STEPS = [
    ("pyautogui.click(1234, 567)", "Click the Reports tab"),
    ("pyautogui.typewrite('q3 summary')", "Type the report name"),
    ("DONE", "The report is open"),
]
FAILED_STEPS = [
    ("pyautogui.click(300, 200)", "Open the File menu"),
    ("pyautogui.click(1500, 900)", "Click the Export button"),
    ("pyautogui.typewrite('out.pdf')", "Type the file name"),
    ("DONE", "The file is exported"),  # the agent claims success; the evaluator says 0.0
]


def _png(path: Path, shade: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (1920, 1080), (shade, 90, 255 - shade)).save(path)
    return path.name


def osworld_task(folder: Path, steps: list[tuple[str, str]], score: str, task: str) -> None:
    """One OSWorld result folder (``results/{action}/{obs}/{model}/{domain}/{example}/``)."""
    _png(folder / "step_0.png", 7)
    rows = []
    for n, (code, op) in enumerate(steps, 1):
        shot = _png(folder / f"step_{n}_20250101@1000{n:02d}.png", 7 + 37 * n)
        rows.append(
            {
                "step_num": n,
                "action_timestamp": f"20250101@1000{n:02d}",
                "action": code,
                "response": f"<think>\nstep {n}\n</think>\n<operation>\n{op}\n</operation>",
                "reward": 0,
                "done": code == "DONE",
                "info": {},
                "screenshot_file": shot,
            }
        )
    (folder / "traj.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "task.json").write_text(json.dumps({"instruction": task}))
    (folder / "result.txt").write_text(score + "\n")


def diagnosis(folder: Path, out: Path, step: int, l2: str, name: str) -> None:
    """A ``diagnosis.json`` with the fields ``serve.diagnose`` writes (``DiagnosisResult``)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": 1,
        "root_cause_step": step,
        "error": {"l1": l2[0], "l1_name": "x", "l2": l2, "l2_name": name, "hivig_dimension": None},
        "evidence": [],
        "correction": "Click the Export entry of the File menu that is open on screen.",
        "confidence": 0.7,
        "method": "cheap_signals",
        "per_step_summaries": [],
        "candidates_considered": [step],
        "ranking": [],
        "inspections": [],
        "backend": {"model": None},
        "input": {"kind": "osworld", "path": str(folder), "task": None, "outcome": "failure"},
        "steps": [],
        "skipped": [],
        "notes": [],
    }
    (out / "diagnosis.json").write_text(json.dumps(doc))


def _sidecar(runs: Path, task_id: str, model: str) -> Path:
    for path in (runs / "episodes").rglob("*.json"):
        side = json.loads(path.read_text())
        if side["task_id"] == task_id and side["agent_model"] == model:
            return path
    raise AssertionError(task_id)


def _add_verdict(path: Path, step: int, verdict: str) -> None:
    side = json.loads(path.read_text())
    side["verdicts"].append({"step": step, "source_ref": "test", "verdict": verdict})
    path.write_text(json.dumps(side))


@pytest.fixture(scope="module")
def flywheel(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("flywheel")
    results = tmp / "results" / "pyautogui" / "screenshot"
    for model in ("agent-a", "agent-b"):  # the same tasks run by two agents
        chrome = results / model / "chrome"
        osworld_task(chrome / "ok-task", OK_STEPS, "1.0", "Open the Q3 report")
        osworld_task(chrome / "export-task", FAILED_STEPS, "0.0", "Export the sheet as PDF")
    # agent-a's failure is diagnosed at step 2 (the Export click), a grounding slip.
    diag = tmp / "diag"
    diagnosis(results / "agent-a" / "chrome" / "export-task", diag / "a", 2, "G1", "grounding")
    diagnosis(results / "agent-b" / "chrome" / "ok-task", diag / "b", 1, "G1", "grounding")
    diagnosis(tmp / "elsewhere", diag / "c", 1, "G1", "grounding")
    runs = tmp / "RUNS"
    stats = ingest_runs("osworld", tmp / "results", runs, diagnoses=diag)
    # The recorded critic: Good on agent-a's root cause, Bad on a step of a successful run.
    _add_verdict(_sidecar(runs, "export-task", "agent-a"), 1, "good")
    _add_verdict(_sidecar(runs, "ok-task", "agent-a"), 0, "bad")
    sample = ingested_sample(tmp / "scalecua", trajectories=4, seed=3)
    cfg = demo_config(sample, tmp / "o", f"runs.corpus={runs}", "export.report_cards=4")
    result = run(cfg, None)
    assert result is not None
    records = {
        r.id: r
        for s in ("train", "val", "test")
        for r in read_records(tmp / "o/dataset/records" / s)
    }
    rows = [json.loads(x) for x in (tmp / "o/dataset/provenance.jsonl").read_text().splitlines()]
    return {
        "tmp": tmp,
        "runs": runs,
        "ingest": stats,
        "stats": result,
        "records": records,
        "prov": {r["id"]: r for r in rows},
        "ledger": json.loads((tmp / "o/runs.json").read_text()),
        "quarantine": [
            json.loads(x) for x in (tmp / "o/input_quarantine.jsonl").read_text().splitlines()
        ],
        "cfg": cfg,
    }


def _run_rows(fw: dict, task_id: str, model: str | None = None) -> list[dict]:
    return [
        r
        for r in fw["prov"].values()
        if r["source"] == "run" and r["task_id"] == task_id and model in (None, r["agent_model"])
    ]


def test_diagnoses_are_matched_to_their_run_and_accounted(flywheel):
    d = flywheel["ingest"]["diagnoses"]
    assert d == {
        "files": 3,
        "matched": 1,
        "dropped": {"no_matching_run": 1, "run_not_failed": 1},
    }
    side = json.loads(_sidecar(flywheel["runs"], "export-task", "agent-a").read_text())
    assert side["outcome"] == "failure" and side["terminate_status"] == "success"
    assert side["diagnosis"]["root_cause_index"] == 1
    assert side["diagnosis"]["dimension"] == "grounding_spatial_error"


def test_failed_run_yields_a_real_bad_at_the_root_cause(flywheel):
    rows = _run_rows(flywheel, "export-task", "agent-a")
    assert [(r["kind"], r["verdict"]) for r in rows] == [("critique", "Bad")]
    record = flywheel["records"][rows[0]["id"]]
    assert record.step_index == 1  # diagnose's step 2, 1-based
    assert record.labels.error_dimension == "Grounding/Spatial Error"
    # The proposed step is the agent's own executed click, not a perturbation of it.
    user = "".join(p.text for p in record.user if hasattr(p, "text"))
    assert "Click the Export button" in user and "Open the File menu" in user
    assert "Type the file name" not in user  # steps after the root cause are not used
    assert rows[0]["hard_case"] == HARD_GOOD_ON_ROOT
    assert rows[0]["outcome"] == "failure" and rows[0]["benchmark"] == "osworld"
    # The record itself says where it came from and what kind of Bad it is.
    assert record.labels.generator == "run"
    assert (record.provenance.source, record.provenance.benchmark) == ("run", "osworld")
    assert record.provenance.task_id == "export-task"
    assert record.provenance.hard_case == HARD_GOOD_ON_ROOT


def test_claimed_success_that_failed_is_never_a_good(flywheel):
    # agent-b's export-task ends in DONE (terminate success) but scored 0.0, undiagnosed.
    assert _run_rows(flywheel, "export-task", "agent-b") == []
    reasons = {q["reason"] for q in flywheel["quarantine"]}
    assert "no_diagnosis" in reasons
    assert not [r for r in _run_rows(flywheel, "export-task") if r["verdict"] == "Good"]


def test_successful_run_yields_goods_history_and_perturbations(flywheel):
    rows = _run_rows(flywheel, "ok-task")
    kinds = {(r["kind"], r["verdict"]) for r in rows}
    assert ("critique", "Good") in kinds and ("history", None) in kinds
    assert ("critique", "Bad") in kinds  # a perturbation of a successful run's step
    bads = [flywheel["records"][r["id"]] for r in rows if r["verdict"] == "Bad"]
    assert all(b.labels.generator in ("programmatic", "annotator", "run") for b in bads)
    hard = [r for r in rows if r["hard_case"]]
    assert [(r["agent_model"], r["verdict"], r["hard_case"]) for r in hard] == [
        ("agent-a", "Good", HARD_BAD_ON_SUCCESS)
    ]
    assert flywheel["records"][hard[0]["id"]].step_index == 0


def test_every_record_has_provenance(flywheel):
    assert set(flywheel["prov"]) == set(flywheel["records"])
    sources = {r["source"] for r in flywheel["prov"].values()}
    assert sources == {"run", "scalecua"}
    for row in flywheel["prov"].values():
        record = flywheel["records"][row["id"]].provenance
        assert (record.source, record.task_id, record.hard_case) == (
            row["source"],
            row.get("task_id"),
            row["hard_case"],
        )
        if row["source"] == "run":
            assert row["benchmark"] == "osworld" and row["task_id"] in ("ok-task", "export-task")
    assert set(flywheel["stats"]["sources"]) == {"run", "scalecua"}


def test_no_task_crosses_splits(flywheel):
    by_task: dict[str, set[str]] = {}
    for row in flywheel["prov"].values():
        if row["source"] == "run":
            by_task.setdefault(row["task_id"], set()).add(row["split"])
    assert by_task and all(len(s) == 1 for s in by_task.values())
    # Many runs of few tasks, routed by load_work: every run of a task shares one split.
    works, _, _ = load_work_and_runs(flywheel["cfg"])
    runs = [w for w in works if w.origin]
    assert len(runs) == 3
    for task in {w.origin["task_id"] for w in runs}:
        assert len({w.split for w in runs if w.origin["task_id"] == task}) == 1


def test_run_counts_are_accounted(flywheel):
    led = flywheel["ledger"]
    t, s = led["trajectories"], led["steps"]
    assert t["in"] == 4 == t["kept"] + sum(t["dropped"].values())
    assert t["dropped"] == {"no_diagnosis": 1} and t["kept_failure"] == 1
    assert s["in"] == 3 + 3 + 4 + 4
    assert s["success_steps"] == 6 and s["root_cause"] == 1 and s["history_only"] == 1
    assert s["after_root_cause_unused"] == 2 and s["dropped_no_diagnosis"] == 4
    for name, c in flywheel["stats"]["stages"].items():
        dropped = sum(v for k, v in c.items() if k.startswith("dropped_"))
        assert c["in"] == c["kept"] + dropped, name
    # The real Bad went through the judge and the rationale like a synthetic one.
    judge = flywheel["stats"]["stages"]["judge"]
    assert judge["in"] >= 1 and judge.get("unjudged", 0) == 0


def test_mapping_table_covers_cuadebug_and_the_taxonomy():
    assert len(CUADEBUG_TO_DIMENSION) == 30
    assert {v for v in CUADEBUG_TO_DIMENSION.values() if v} == {d.key for d in DIMENSIONS}
    assert dimension_for("S4") is None and dimension_for(None) is None
    assert dimension_for("R10") == "termination_misjudgment"


def test_mix_ratio_caps_runs_per_scalecua_trajectory():
    ids = [f"r{i}" for i in range(10)]
    assert len(mix_surplus_runs(ids, 8, 0.25, 0)) == 8  # 2 runs kept for 8 ScaleCUA
    assert mix_surplus_runs(ids, 8, 0.0, 0) == set() == mix_surplus_runs(ids, 0, 0.25, 0)
    assert mix_surplus_runs(ids, 8, 0.25, 0) == mix_surplus_runs(list(reversed(ids)), 8, 0.25, 0)


def test_missing_diagnoses_folder_is_one_line_and_exit_2(tmp_path, capsys):
    from data_gen.runs import main

    osworld_task(tmp_path / "r" / "a" / "b" / "m" / "d" / "t", OK_STEPS, "1.0", "Open it")
    code = main(
        ["--format", "osworld", "--root", str(tmp_path / "r"), "--out", str(tmp_path / "o")]
        + ["--diagnoses", str(tmp_path / "nope")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--diagnoses" in err[0]
