"""data_gen end to end with the offline annotator: accounting, markers, splits, masking,
shard invariance, rerun idempotence, crash safety, and the >= 60-trajectory must-show run."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from data_gen.annotator import OFFLINE_MODEL
from data_gen.config import DataGenConfig
from data_gen.executor import Shard
from data_gen.ingest import ingest
from data_gen.perturb.plan import UnreachableDimensionError
from data_gen.run import main, run
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.actions import marks_for_tool_calls
from hivig.config import ConfigError, load_config
from hivig.records import SPLITS, read_records

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    make_sample(root / "c", SampleConfig(trajectories=8, seed=3), progress=False)
    ingest(root / "c", root / "i", progress=False)
    return root / "c", root / "i" / "trajectories.jsonl"


def _cfg(corpus, out, *extra):
    c, t = corpus
    return load_config(
        DataGenConfig, DEMO, [f"corpus={c}", f"out={out}", f"trajectories={t}", *extra]
    )


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def one_shard(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "one"
    stats = run(_cfg(corpus, out), None)
    return out, stats


def _records(out: Path):
    return [r for split in SPLITS for r in read_records(out / "dataset" / "records" / split)]


def _proposed_calls(record) -> str:
    text = "".join(p.text for p in record.user if hasattr(p, "text"))
    step = text.split("Current Proposed Step:", 1)[1]
    start = step.find("<tool_call>")
    end = step.rfind("</tool_call>") + len("</tool_call>")
    return step[start:end]


# ---------------------------------------------------------------------------------------------


def test_every_stage_accounts_for_every_item(one_shard):
    _, stats = one_shard
    for stage, counts in stats["stages"].items():
        dropped = sum(v for k, v in counts.items() if k.startswith("dropped_"))
        assert counts["in"] == counts["kept"] + dropped, stage
    assert stats["stages"]["export"]["kept"] == stats["samples"] > 0
    # Chained: history and critique samples in the export are what the stages kept.
    export = stats["stages"]["export"]
    duplicates = export.get("dropped_duplicate_bad_step", 0) + export.get(
        "dropped_duplicate_good_step", 0
    )
    assert stats["by_kind"]["critique"] == stats["stages"]["rationale"]["kept"] - duplicates
    mixed = export.get("dropped_mix_ratio", 0)
    assert stats["by_kind"]["history"] == stats["stages"]["history"]["kept"] - mixed


def test_stats_report_achieved_against_target_per_dimension(one_shard):
    _, stats = one_shard
    rows = stats["dimension_target_vs_achieved"]
    assert set(rows) == set(stats["dimension_totals"])
    assert sum(r["target"] for r in rows.values()) == pytest.approx(1.0, abs=1e-3)
    for name, r in rows.items():
        assert r["achieved"] == stats["dimension_shares"][name]


def test_default_config_refuses_a_corpus_missing_a_dimension(corpus, tmp_path):
    # Without any ground-truth wait (or scroll) Timing and Latency Neglect cannot be built
    # honestly: the production default stops before any stage runs and names what is missing.
    c, trajectories = corpus
    lines = trajectories.read_text(encoding="utf-8").splitlines()
    kept = [ln for ln in lines if '"wait"' not in ln and '"scroll"' not in ln]
    assert 0 < len(kept) < len(lines)
    no_waits = tmp_path / "no_waits.jsonl"
    no_waits.write_text("\n".join(kept) + "\n", encoding="utf-8")
    cfg = _cfg((c, no_waits), tmp_path / "out", "perturb.unreachable_dimension=error")
    with pytest.raises(UnreachableDimensionError, match="no step of this corpus can express"):
        run(cfg, None)
    assert not (tmp_path / "out" / "work").exists()


def test_instruction_variants_leave_no_duplicate_bad_samples(one_shard):
    out, stats = one_shard
    # The corpus has instruction variants, which share screenshots and whole steps: the plan
    # found repeated steps and gave them no critique samples, Good and Bad alike (so no
    # transition was paid for them either)...
    assert stats["stages"]["transitions"].get("skipped_repeated_step", 0) > 0
    # ... and no two exported critique samples show the same screenshot with the same step.
    seen = set()
    for r in _records(out):
        if r.kind == "critique":
            step = "".join(p.text for p in r.user if hasattr(p, "text"))
            key = (r.images[-1].path, r.labels.verdict, step.split("Current Proposed Step:", 1)[1])
            assert key not in seen
            seen.add(key)


def test_records_are_labelled_offline_and_versioned(one_shard):
    out, _ = one_shard
    records = _records(out)
    assert records
    for r in records:
        assert r.provenance.annotator_model == OFFLINE_MODEL
        assert r.provenance.annotator_kind == "offline"
        assert r.provenance.request_hashes
        assert re.fullmatch(r"critic_(history|critique)_v\d+", r.prompt_version)


def test_bad_markers_sit_at_their_own_coordinates(one_shard):
    out, _ = one_shard
    records = _records(out)
    by_step = defaultdict(dict)
    for r in records:
        if r.kind == "critique":
            by_step[(r.trajectory_id, r.step_index)][r.labels.verdict] = r
    moved = 0
    for pair in by_step.values():
        for r in pair.values():
            assert list(r.images[0].marks) == marks_for_tool_calls(_proposed_calls(r)), r.id
        if "Bad" in pair and "Good" in pair and pair["Bad"].images[0].marks:
            moved += pair["Bad"].images[0].marks != pair["Good"].images[0].marks
    assert moved > 0  # negative control: Bad marks are not simply copied from the expert


def test_splits_keep_episodes_and_pairs_together(one_shard):
    out, _ = one_shard
    split_of_episode, split_of_step = {}, {}
    for r in _records(out):
        assert split_of_episode.setdefault(r.episode_key, r.split) == r.split
        assert split_of_step.setdefault((r.trajectory_id, r.step_index), r.split) == r.split


def test_masking_keeps_calls_and_spares_intent_dimensions(one_shard):
    out, stats = one_shard
    critique = [r for r in _records(out) if r.kind == "critique"]
    masked = [r for r in critique if r.labels.intent_masked]
    assert masked
    assert abs(len(masked) / len(critique) - 0.3) <= 0.03
    for r in masked:
        assert r.labels.error_dimension != "Action-Operation Misalignment"
        assert "Action:" not in _proposed_step_text(r)
    unmasked = [r for r in critique if not r.labels.intent_masked]
    assert any("Action:" in _proposed_step_text(r) for r in unmasked)
    assert stats["critique_intent_mask_rate"] == pytest.approx(
        len(masked) / len(critique), abs=1e-4
    )


def _proposed_step_text(record) -> str:
    text = "".join(p.text for p in record.user if hasattr(p, "text"))
    return text.split("Current Proposed Step:", 1)[1]


def test_report_and_exports_are_self_contained(one_shard):
    out, stats = one_shard
    ds = out / "dataset"
    page = (ds / "report.html").read_text()
    cards = page.count("class='card'")
    assert cards >= min(30, stats["samples"])
    for link in re.findall(r"<img src='([^']+)'", page):
        assert not Path(link).is_absolute() and (ds / link).is_file()
    rows = json.loads((ds / "sharegpt" / "train.json").read_text())
    assert rows and all(not Path(p).is_absolute() for r in rows for p in r["images"])
    assert all((ds / p).resolve().is_file() for r in rows for p in r["images"])
    assert sum(r["conversations"][0]["value"].count("<image>") for r in rows) == sum(
        len(r["images"]) for r in rows
    )


def _llamafactory_rows(dataset_dir: Path) -> list[tuple[Path, list[Path]]]:
    """Resolve the export as LlamaFactory does with ``dataset_dir`` (and media_dir defaulting
    to it): ``dataset_dir/dataset_info.json`` -> ``dataset_dir/file_name``, image paths relative
    to ``dataset_dir``."""
    info = json.loads((dataset_dir / "dataset_info.json").read_text())
    out = []
    for entry in info.values():
        data = dataset_dir / entry["file_name"]
        for row in json.loads(data.read_text()):
            out.append((data, [dataset_dir / p for p in row[entry["columns"]["images"]]]))
    return out


def test_llamafactory_resolves_the_export_from_the_dataset_dir(one_shard, tmp_path):
    out, _ = one_shard
    resolved = _llamafactory_rows(out / "dataset")
    assert resolved and all(data.is_file() for data, _ in resolved)
    assert all(p.is_file() for _, images in resolved for p in images)
    # Negative control: pointing dataset_dir at sharegpt/ (where dataset_info.json used to be)
    # resolves neither the data files nor the images.
    wrong = tmp_path / "sharegpt"
    wrong.mkdir()
    (wrong / "dataset_info.json").write_text((out / "dataset" / "dataset_info.json").read_text())
    with pytest.raises(FileNotFoundError):
        _llamafactory_rows(wrong)


def test_three_shards_equal_one_shard(one_shard, corpus, tmp_path):
    out1, _ = one_shard
    out3 = tmp_path / "one"  # same depth as the one-shard run: relative paths agree
    cfg = _cfg(corpus, out3)
    results = [run(cfg, Shard(i, 3)) for i in range(3)]
    assert results[0] is None and results[1] is None and results[2] is not None
    assert _tree(out3 / "dataset") == _tree(out1 / "dataset")


def test_rerun_is_idempotent_and_refuses_other_config(one_shard, corpus):
    out, _ = one_shard
    before = _tree(out / "dataset")
    run(_cfg(corpus, out), None)
    assert _tree(out / "dataset") == before
    with pytest.raises(ConfigError, match="different config") as refused:
        run(_cfg(corpus, out, "rationale.intent_mask_rate=0.5"), None)
    # The advice names the field and keeps the cache (which lives in `out`) instead of
    # telling the user to delete the folder that holds it.
    assert "rationale.intent_mask_rate" in str(refused.value)
    assert "annotator.cache_dir=" in str(refused.value) and "delete" not in str(refused.value)


def test_resume_accepts_operational_and_export_changes(one_shard, corpus):
    out, _ = one_shard
    records = _tree(out / "dataset" / "records")
    operational = [
        "annotator.backend.concurrency=3",
        "annotator.backend.timeout_s=7",
        "annotator.backend.max_retries=1",
        "annotator.frame_cache_mb=64",
    ]
    run(_cfg(corpus, out, *operational), None)
    assert _tree(out / "dataset" / "records") == records
    # Export options re-run only the merge.
    run(_cfg(corpus, out, "export.report_cards=2"), None)
    assert _tree(out / "dataset" / "records") == records
    run(_cfg(corpus, out), None)  # back to the original options
    with pytest.raises(ConfigError, match="seed"):
        run(_cfg(corpus, out, "seed=5"), None)


def test_cli_errors_are_typed(tmp_path, capsys):
    assert main(["--config", str(DEMO), f"out={tmp_path}"]) == 2
    assert "`corpus` must be set" in capsys.readouterr().err
    assert main(["--config", str(DEMO), "corpus=x", "out=y", "--shard", "3/2"]) == 2
    assert main(["--config", str(DEMO), "--dry-run", "corpus=x", "out=y"]) == 0
    assert "intent_mask_rate: 0.3" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------


def _cli(corpus, out) -> list[str]:
    c, t = corpus
    return [
        sys.executable,
        "-m",
        "data_gen",
        "run",
        "--config",
        str(DEMO),
        f"corpus={c}",
        f"out={out}",
        f"trajectories={t}",
    ]


@pytest.mark.slow
def test_killed_runs_resume_to_identical_output(one_shard, corpus, tmp_path):
    out1, _ = one_shard
    out = tmp_path / "one"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(7)
    kills = 0
    for _ in range(8):
        if kills >= 3:
            break
        proc = subprocess.Popen(
            _cli(corpus, out),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Short enough to land inside a run (start-up included) on a fast, idle machine too.
        time.sleep(rng.uniform(1.0, 5.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 2  # the run really was interrupted more than once
    done = subprocess.run(_cli(corpus, out), cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert _tree(out / "dataset") == _tree(out1 / "dataset")


@pytest.mark.slow
def test_must_show_sixty_trajectories(tmp_path):
    corpus = tmp_path / "corpus"
    make_sample(corpus, SampleConfig(trajectories=60, seed=0), progress=False)
    out = tmp_path / "out"
    assert main(["--config", str(DEMO), f"corpus={corpus}", f"out={out}"]) == 0
    stats = json.loads((out / "dataset" / "stats.json").read_text())
    records = _records(out)
    critique = [r for r in records if r.kind == "critique"]
    dims = {r.labels.error_dimension for r in critique if r.labels.verdict == "Bad"}
    assert len(dims) == 12, sorted(dims)
    shares = stats["dimension_shares"]
    low = {d for d, share in shares.items() if share < 0.03}
    # Timing needs a visible loading state and Procedural Prerequisite Neglect a focus click
    # on a visible text field; the sample corpus has few such screens, and a Bad that is not
    # true in its dimension is never made up to fill the share.
    rare = {
        "Timing and Latency Neglect",
        "Procedural Prerequisite Neglect",
        "Observation Neglect",
        "Visual Hallucination",
    }
    assert low <= rare, shares
    assert all(shares[d] > 0 for d in low)
    masked = sum(r.labels.intent_masked for r in critique) / len(critique)
    assert abs(masked - 0.3) <= 0.03
    assert not any(
        r.labels.intent_masked and r.labels.error_dimension == "Action-Operation Misalignment"
        for r in critique
    )
    for r in critique:
        assert list(r.images[0].marks) == marks_for_tool_calls(_proposed_calls(r))
    split_of_step = {}
    for r in critique:
        assert split_of_step.setdefault((r.trajectory_id, r.step_index), r.split) == r.split
    assert stats["samples"] == len(records)


def test_bad_input_lines_are_quarantined_not_fatal(corpus, tmp_path):
    c, t = corpus
    lines = t.read_text().splitlines()
    broken = json.loads(lines[0])
    broken["steps"][0]["actions"] = []
    dup = lines[1]
    bad = tmp_path / "trajectories.jsonl"
    bad.write_text("\n".join(["{not json", json.dumps(broken), lines[1], dup, lines[2]]) + "\n")
    out = tmp_path / "out"
    cfg = load_config(DataGenConfig, DEMO, [f"corpus={c}", f"out={out}", f"trajectories={bad}"])
    stats = run(cfg, None)
    quarantine = [json.loads(x) for x in (out / "input_quarantine.jsonl").read_text().splitlines()]
    assert [q["reason"] for q in quarantine] == ["bad_json", "step_without_actions", "duplicate_id"]
    assert stats["run"]["input_trajectories_quarantined"] == 3
    assert {r.trajectory_id for r in _records(out)} == {
        json.loads(lines[1])["id"],
        json.loads(lines[2])["id"],
    }


def test_records_load_with_datasets(one_shard, tmp_path):
    import datasets

    out, stats = one_shard
    files = sorted(str(p) for p in (out / "dataset" / "records" / "train").glob("*.parquet"))
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=tmp_path)
    assert len(ds) == stats["by_split"]["train"].get("history", 0) + stats["by_split"]["train"].get(
        "critique", 0
    )
    assert set(ds.column_names) >= {"id", "kind", "images", "target", "labels", "provenance"}


def test_length_filter_drops_with_a_reason(corpus, tmp_path):
    cfg = _cfg(corpus, tmp_path / "out", "max_trajectories=2", "export.max_tokens=2500")
    stats = run(cfg, None)
    export = stats["stages"]["export"]
    assert export.get("dropped_too_long", 0) > 0
    assert export["in"] == export["kept"] + export["dropped_too_long"]
    assert stats["token_length_max"] <= 2500
