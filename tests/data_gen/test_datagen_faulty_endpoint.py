"""A whole data_gen run against an annotator endpoint that fails the way real services do.

429s, 500s, 200s carrying an error body, connections closed without an answer, answers cut at
``max_tokens`` and fences inside answer blocks (``tests/fakes/annotator_endpoint.py``): the run
must export no fence, lose no item to an error body, and, killed with SIGKILL and run again, write
the same export byte for byte.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _sample_run import ingested_sample

from hivig.records import SPLITS, read_records
from tests.fakes.annotator_endpoint import FaultyResponder, run_against
from tests.fakes.openai_server import ScriptedServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = ingested_sample(tmp_path_factory.mktemp("faulty"), trajectories=8, seed=3)
    return root / "c", root / "i" / "trajectories.jsonl"


@pytest.fixture(scope="module")
def clean_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    responder = FaultyResponder()
    with ScriptedServer(respond=responder) as server:
        stats, annotator = run_against(*corpus, out, server.base_url)
        annotator.close()
    return out, stats, responder


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_every_kind_of_fault_was_served(clean_run):
    _, _, responder = clean_run
    assert set(responder.faults) == {"429", "500", "error_body", "drop", "cut"}, responder.faults


def test_no_fence_reaches_a_target_and_no_item_is_lost_to_a_fault(clean_run):
    out, stats, _ = clean_run
    records = [r for s in SPLITS for r in read_records(out / "dataset" / "records" / s)]
    assert records
    assert not [r.id for r in records if "```" in r.target]
    for stage, counts in stats["stages"].items():
        lost = {k: v for k, v in counts.items() if k.startswith("dropped_annotator")}
        assert not lost, (stage, lost)
        assert not {k for k in counts if "truncated" in k and k.startswith("dropped")}, stage
    sharegpt = (out / "dataset" / "sharegpt" / "train.json").read_text(encoding="utf-8")
    assert "```" not in sharegpt


def test_killed_runs_resume_to_the_same_export(corpus, clean_run, tmp_path):
    reference, _, _ = clean_run
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(5)
    with ScriptedServer(respond=FaultyResponder()) as server:
        cmd = [
            sys.executable,
            "-m",
            "tests.fakes.annotator_endpoint",
            *map(str, corpus),
            str(out),
            server.base_url,
        ]
        kills = 0
        for _ in range(6):
            if kills >= 2:
                break
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(rng.uniform(1.5, 4.0))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
        assert kills >= 1  # the run really was interrupted
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert _tree(out / "dataset") == _tree(reference / "dataset")
