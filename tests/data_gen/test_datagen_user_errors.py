"""User errors of ``data_gen run`` print one clear line and exit 2, never a traceback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import data_gen.cli_run as cli_module
import data_gen.inputs as inputs_module
from data_gen.run import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


@pytest.fixture(autouse=True)
def _quiet_logging(monkeypatch):
    # `main` configures logging on the stderr of the first test that calls it; capsys closes
    # that stream afterwards, so logging errors would pollute later tests' stderr.
    monkeypatch.setattr(cli_module, "configure_logging", lambda *a, **k: None)
    monkeypatch.setattr(logging, "raiseExceptions", False)


def _minimal_corpus(root: Path) -> Path:
    from tests.data_gen.ingest.test_ingest import episode, write_corpus

    steps = [
        ("Click the 'OK' button", "click(x=0.1, y=0.1)"),
        ("Done", "terminate(status='success', info=None)"),
    ]
    write_corpus(
        root, {"internal_web_navigation_1": ("web", "navigation", episode("e/1", "T", steps))}
    )
    return root


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def _one_line(err: str) -> str:
    lines = [
        ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln
    ]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_missing_corpus(tmp_path, capsys):
    code, err = _run(
        capsys, "--config", str(DEMO), f"corpus={tmp_path / 'no'}", f"out={tmp_path / 'o'}"
    )
    assert code == 2 and "does not exist" in _one_line(err)


def test_empty_corpus_folder(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    code, err = _run(
        capsys, "--config", str(DEMO), f"corpus={tmp_path / 'c'}", f"out={tmp_path / 'o'}"
    )
    assert code == 2 and "meta.json" in _one_line(err)


def test_bad_meta_json(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "meta.json").write_text("{not json")
    code, err = _run(
        capsys, "--config", str(DEMO), f"corpus={tmp_path / 'c'}", f"out={tmp_path / 'o'}"
    )
    assert code == 2 and "meta.json" in _one_line(err)


def test_corpus_without_usable_trajectories(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "meta.json").write_text(
        json.dumps({"x": {"root": "r", "annotation": "no.jsonl"}})
    )
    code, err = _run(
        capsys, "--config", str(DEMO), f"corpus={tmp_path / 'c'}", f"out={tmp_path / 'o'}"
    )
    assert code == 2 and "no usable trajectory" in _one_line(err)


@pytest.mark.parametrize("content", ["a: [\n", "\xff\xfe not utf-8", None])
def test_unreadable_or_malformed_config(tmp_path, capsys, content):
    cfg = tmp_path / "cfg.yaml"
    if content is None:
        cfg.mkdir()  # a folder named like the config
    else:
        cfg.write_bytes(content.encode("latin-1"))
    code, err = _run(capsys, "--config", str(cfg), "corpus=x", "out=y")
    assert code == 2 and "config" in _one_line(err)


def test_unwritable_out(tmp_path, capsys):
    corpus = _minimal_corpus(tmp_path / "c")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = _run(capsys, "--config", str(DEMO), f"corpus={corpus}", f"out={blocker / 'o'}")
    assert code == 2 and "out" in _one_line(err)


def test_output_folder_of_an_older_version(tmp_path, capsys):
    corpus = _minimal_corpus(tmp_path / "c")
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.yaml").write_text("seed: 0\n")  # no format.json: written by version 1
    code, err = _run(capsys, "--config", str(DEMO), f"corpus={corpus}", f"out={out}")
    assert code == 2 and "older hivig" in _one_line(err)


def test_annotator_config_is_checked_before_ingest(tmp_path, capsys, monkeypatch):
    corpus = _minimal_corpus(tmp_path / "c")

    def no_ingest(*a, **k):
        raise AssertionError("ingest must not start before the annotator is validated")

    monkeypatch.setattr(inputs_module, "ingest", no_ingest)
    code, err = _run(
        capsys,
        "--config",
        str(DEMO),
        f"corpus={corpus}",
        f"out={tmp_path / 'o'}",
        "annotator.backend.kind=openai",
        "annotator.backend.base_url=",
    )
    assert code == 2 and "base_url" in _one_line(err)


def test_a_run_without_records_exits_non_zero(tmp_path, capsys):
    corpus = _minimal_corpus(tmp_path / "c")
    code, err = _run(
        capsys,
        "--config",
        str(DEMO),
        f"corpus={corpus}",
        f"out={tmp_path / 'o'}",
        "export.max_tokens=1",
    )
    assert code != 0 and "no records" in err
