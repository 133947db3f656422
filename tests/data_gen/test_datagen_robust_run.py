"""``data_gen run`` on bad input: a corrupt screenshot body is dropped with a reason (or
quarantined at ingest with ``verify_images=full``), and a killed ingest is never resumed from."""

from __future__ import annotations

import json
from pathlib import Path

from data_gen.config import DataGenConfig
from data_gen.ingest import ingest_complete
from data_gen.run import run, trajectories_path
from hivig.config import load_config
from tests.data_gen.ingest.test_ingest import episode, write_corpus

DEMO = Path(__file__).resolve().parents[2] / "configs" / "data_gen" / "demo.yaml"
STEPS = [
    ("Click the 'OK' button", "click(x=0.1, y=0.1)"),
    ("Click the 'Next' button", "click(x=0.5, y=0.5)"),
    ("Done", "terminate(status='success', info=None)"),
]


def _corpus(root: Path) -> Path:
    eps = episode("e/1", "Open it", STEPS) + episode("e/2", "Close it", STEPS)
    write_corpus(root, {"internal_web_navigation_1": ("web", "navigation", eps)})
    shot = root / "data/data_20250612/web/images/e/1/images/1.png"
    raw = bytearray(shot.read_bytes())
    raw[45:70] = b"\x07" * 25  # the IDAT body: header and end marker stay intact
    shot.write_bytes(bytes(raw))
    return root


def _cfg(tmp_path: Path, *extra: str) -> DataGenConfig:
    return load_config(
        DataGenConfig,
        DEMO,
        [f"corpus={tmp_path / 'c'}", f"out={tmp_path / 'o'}", "judge.enabled=false", *extra],
    )


def test_corrupt_body_is_dropped_at_export_not_a_crash(tmp_path):
    _corpus(tmp_path / "c")
    stats = run(_cfg(tmp_path, "perturb.unreachable_dimension=warn"), None)
    assert stats is not None
    dropped = stats["stages"]["export"]
    assert dropped.get("dropped_corrupt_image", 0) > 0
    rows = (tmp_path / "o" / "dataset" / "exclusions.jsonl").read_text().splitlines()
    assert any(json.loads(r)["reason"] == "corrupt_image" for r in rows)
    # A rerun does not crash either (the export is up to date or redone the same way).
    assert run(_cfg(tmp_path, "perturb.unreachable_dimension=warn"), None) == stats


def test_full_verification_quarantines_it_at_ingest(tmp_path):
    _corpus(tmp_path / "c")
    cfg = _cfg(tmp_path, "verify_images=full")
    path = trajectories_path(cfg)
    quarantine = (path.parent / "quarantine.jsonl").read_text()
    assert "corrupt_image" in quarantine


def test_run_reingests_when_ingest_was_killed_midway(tmp_path):
    _corpus(tmp_path / "c")
    cfg = _cfg(tmp_path)
    path = trajectories_path(cfg)
    assert ingest_complete(path.parent)
    # What a kill between the writes leaves: the trajectories file, the rest missing.
    (path.parent / "stats.json").unlink()
    (path.parent / "quarantine.jsonl").unlink()
    assert not ingest_complete(path.parent)
    assert trajectories_path(cfg) == path
    assert (path.parent / "stats.json").exists() and (path.parent / "quarantine.jsonl").exists()


def test_dry_run_estimates_the_annotator_requests_the_run_sends(tmp_path, capsys, monkeypatch):
    import re

    import data_gen.run as run_module

    _corpus(tmp_path / "c")
    extra = ["perturb.unreachable_dimension=warn"]
    cfg = _cfg(tmp_path, *extra)
    trajectories_path(cfg)  # ingested: a dry run reads the trajectories, it ingests nothing
    args = ["--config", str(DEMO), f"corpus={tmp_path / 'c'}", f"out={tmp_path / 'o'}"]
    assert run_module.main([*args, "judge.enabled=false", *extra, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    total = int(re.search(r"#   total +([\d,]+)", printed).group(1).replace(",", ""))
    made = []
    real = run_module.build_annotator

    def keep(c):
        made.append(real(c))
        return made[-1]

    monkeypatch.setattr(run_module, "build_annotator", keep)
    stats = run(cfg, None)
    sent = made[0].counts["requests"]
    # An upper bound: the offline annotator grounds nothing without a sidecar.
    assert 0 < sent <= total <= 1.25 * sent
    # Stage by stage, the plan says exactly which requests the annotation stages send.
    for stage in ("transitions", "history", "rationale"):
        planned = int(re.search(rf"#   {stage} +([\d,]+)", printed).group(1).replace(",", ""))
        assert stats["stages"][stage]["calls"] == planned, stage


def test_a_stale_ingest_lock_and_temp_files_are_cleaned(tmp_path):
    import socket

    _corpus(tmp_path / "c")
    cfg = _cfg(tmp_path)
    out = tmp_path / "o"
    (out / "ingest").mkdir(parents=True)
    # What a killed run leaves: its lock (a dead pid on this host) and a half-written temp.
    (out / "ingest.lock").write_text(f"{socket.gethostname()}:999999999")
    host = socket.gethostname().replace(".", "_").replace("-", "_")
    stale = out / "ingest" / f".trajectories.jsonl.{host}-999999999-0123abcd.tmp"
    stale.write_text("half")
    path = trajectories_path(cfg)
    assert ingest_complete(path.parent)
    assert not (out / "ingest.lock").exists() and not stale.exists()
