"""The flywheel's training side: continue from a checkpoint, and score real-run steps apart.

``model.init_from`` is checked against the layouts ``train`` writes (``RUN/final`` as a full
checkpoint or a LoRA adapter, ``RUN/checkpoints/step_N/state.pt`` holding the ``CriticLoss``
state dict under ``model.``); ``train evaluate`` against records carrying the provenance
``data_gen run`` writes for ScaleCUA and run samples.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hivig.config import ConfigError, load_config
from hivig.contracts import render_critique_target
from hivig.messages import ImageRef, PointMark, TextPart
from hivig.records import (
    ImageSlot,
    Labels,
    Provenance,
    SFTRecord,
    records_dir,
    write_manifest,
    write_records,
)
from hivig.tiny import synthetic_screenshot, tiny_model, tiny_processor
from train.build import build_model
from train.config import TrainConfig
from train.critic_eval import Answer, compute_metrics, main, render_report, score_sample
from train.synthetic import write_dataset

ROOT = Path(__file__).resolve().parents[2]
TINY_YAML = ROOT / "configs" / "train" / "tiny_cpu.yaml"
Q_PROJ = "model.language_model.layers.0.self_attn.q_proj.weight"


def _cfg(*overrides: str) -> TrainConfig:
    # tiny_seed=1: the base differs from the seed-0 tiny checkpoint, so equal weights can only
    # come from the checkpoint.
    return load_config(TrainConfig, TINY_YAML, ["model.tiny_seed=1", *overrides])


def _param(model: torch.nn.Module, suffix: str) -> torch.Tensor:
    hits = [p for k, p in model.state_dict().items() if k.endswith(suffix)]
    assert len(hits) == 1, suffix
    return hits[0]


# --------------------------------------------------------------------------------------------
# model.init_from


def test_full_checkpoint_weights_are_loaded(tiny_checkpoint):
    saved = load_file(str(tiny_checkpoint / "model.safetensors"))[Q_PROJ]
    base, _ = build_model(_cfg())
    assert not torch.equal(_param(base, Q_PROJ), saved)  # the base alone differs
    model, _ = build_model(_cfg(f"model.init_from={tiny_checkpoint}"))
    torch.testing.assert_close(_param(model, Q_PROJ), saved, rtol=0, atol=0)
    assert model.training  # trains like a freshly built model (from_pretrained returns eval)
    assert any(p.requires_grad for p in model.parameters())


def test_step_checkpoint_state_is_loaded(tmp_path):
    # state.pt as save_checkpoint writes it: the CriticLoss wrapper's keys, ``model.`` first.
    donor = tiny_model(tiny_processor(), seed=7)
    step = tmp_path / "checkpoints" / "step_000004"
    step.mkdir(parents=True)
    weights = {f"model.{k}": v for k, v in donor.state_dict().items()}
    torch.save({"model": weights, "optimizer": {}}, step / "state.pt")
    (step / "trainer_state.json").write_text(json.dumps({"step": 4}))
    model, _ = build_model(_cfg(f"model.init_from={step}"))
    torch.testing.assert_close(_param(model, Q_PROJ), _param(donor, Q_PROJ).float(), rtol=0, atol=0)
    # A state of another shape (one tensor cut down) is refused by name, before training.
    weights[f"model.{Q_PROJ}"] = weights[f"model.{Q_PROJ}"][:1]
    torch.save({"model": weights, "optimizer": {}}, step / "state.pt")
    with pytest.raises(ConfigError, match="does not fit this model: 1 reshaped"):
        build_model(_cfg(f"model.init_from={step}"))


def _adapter(base: Path, out: Path, r: int) -> dict[str, torch.Tensor]:
    """A LoRA adapter of the tiny base with non-zero weights, saved as RUN/final holds one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(base)
    peft = get_peft_model(
        model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.02)  # lora_B starts at zero: make the adapter matter
    peft.save_pretrained(out)
    return {k: v.detach().clone() for k, v in peft.state_dict().items() if "lora_" in k}


def _lora(base: Path, *overrides: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        TINY_YAML,
        [
            f"model.path={base}",
            "model.tiny=false",
            "model.train_merger=false",
            "lora.enabled=true",
            "lora.r=4",
            "lora.alpha=8",
            "lora.target_modules=[q_proj,v_proj]",
            *overrides,
        ],
    )


@pytest.mark.slow
def test_lora_adapter_continues_or_refuses_other_settings(tiny_checkpoint, tmp_path):
    saved = _adapter(tiny_checkpoint, tmp_path / "final", r=4)
    model, _ = build_model(_lora(tiny_checkpoint, f"model.init_from={tmp_path / 'final'}"))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert loaded.keys() == saved.keys()
    for k, v in saved.items():
        torch.testing.assert_close(loaded[k], v, rtol=0, atol=0, msg=k)
    assert {k for k, p in model.named_parameters() if p.requires_grad} == set(saved)
    with pytest.raises(ConfigError, match=r"lora\.r: checkpoint 4, this run 8"):
        build_model(_lora(tiny_checkpoint, "lora.r=8", f"model.init_from={tmp_path / 'final'}"))


def test_checkpoint_of_another_architecture_is_refused(tiny_checkpoint, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_checkpoint, other)
    config = json.loads((other / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] += 1
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="text_config.num_hidden_layers: checkpoint"):
        build_model(_cfg(f"model.init_from={other}"))


def _cli_error(capsys, monkeypatch, tmp_path, init: Path) -> str:
    from train.cli import main as train_main

    # The CLI attaches a stderr log handler once per process; log lines are not what is read.
    monkeypatch.setattr("hivig.logging._CONFIGURED", True)

    data = write_dataset(tmp_path / "gen", n_train=2, n_val=0, sizes=((64, 64),), words=(2, 4))
    argv = ["--config", str(TINY_YAML), f"data={data}", f"out={tmp_path / 'run'}"]
    assert train_main([*argv, f"model.init_from={init}"]) == 2
    err = capsys.readouterr().err
    # Log lines of earlier steps may reach stderr (a handler another test attached); the error
    # itself is one line, the last, with no traceback.
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert err.rstrip().splitlines()[-1] == errors[0]
    err = errors[0]
    return err


def test_wrong_init_path_exits_2_with_one_line(capsys, monkeypatch, tmp_path):
    err = _cli_error(capsys, monkeypatch, tmp_path, tmp_path / "nope")
    assert err.startswith("error: `model.init_from`:") and "is not a directory" in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before training


def test_folder_that_is_no_checkpoint_exits_2(capsys, monkeypatch, tmp_path):
    (tmp_path / "empty").mkdir()
    err = _cli_error(capsys, monkeypatch, tmp_path, tmp_path / "empty")
    assert "holds no checkpoint train wrote" in err and "RUN/final" in err


def test_a_config_without_weights_is_no_checkpoint():
    import tempfile

    from train.init_from import _kind

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text("{}")
        with pytest.raises(ConfigError, match="holds no checkpoint"):
            _kind(Path(d))
        (Path(d) / "model.safetensors.index.json").write_text("{}")
        assert _kind(Path(d)) == "full"


# --------------------------------------------------------------------------------------------
# evaluate: per-source rows

GOOD = render_critique_target("Fine.", "Good", None, "Moves the task on.")
BAD_SE = render_critique_target("Wrong item.", "Bad", "Semantic Error", "Check the label.")


def _record(case, verdict, source, benchmark=None, hard=None, dim=None):
    return SFTRecord(
        id=case,
        kind="critique",
        platform="ubuntu" if source == "run" else "web",
        prompt_version="critic_critique_v1",
        trajectory_id=f"t-{case}",
        episode_key=f"e-{case}",
        step_index=0,
        split="test",
        images=(ImageRef("a.png", (PointMark(500, 500),)),),
        system="You judge GUI actions.",
        user=(ImageSlot(0), TextPart(f"Case {case}.")),
        target=render_critique_target(f"Why {case}.", verdict, dim, "Rule."),
        labels=Labels(
            verdict=verdict,
            error_dimension=dim,
            generator=("run" if source == "run" else "programmatic") if verdict == "Bad" else None,
        ),
        provenance=Provenance(
            source=source,
            benchmark=benchmark,
            task_id=f"task-{case}" if source == "run" else None,
            hard_case=hard,
        ),
    )


SE = "Semantic Error"
RECORDS = [
    _record("s1", "Good", "scalecua"),
    _record("s2", "Bad", "scalecua", dim=SE),
    _record("s3", "Good", "scalecua"),
    _record("o1", "Bad", "run", "osworld", "critic_good_on_root_cause", SE),
    _record("o2", "Good", "run", "osworld"),
    _record("a1", "Bad", "run", "androidlab", dim=SE),
    _record("a2", "Good", "run", "androidlab", "critic_bad_on_success"),
]


def test_metrics_break_down_by_source_benchmark_and_hard_case():
    # An always-Good critic: right on every Good, wrong on every Bad.
    rows = [score_sample(r, Answer(text=GOOD), None) for r in RECORDS]
    c = compute_metrics(rows)["critique"]
    assert c["n"] == 7 and c["verdict_accuracy"] == pytest.approx(4 / 7)
    src = c["per_source"]
    assert set(src) == {"scalecua", "run"}
    assert (src["scalecua"]["n"], src["scalecua"]["verdict_accuracy"]) == (3, pytest.approx(2 / 3))
    assert (src["run"]["n"], src["run"]["verdict_accuracy"], src["run"]["n_bad"]) == (4, 0.5, 2)
    bench = c["per_benchmark"]
    assert set(bench) == {"osworld", "androidlab"}  # ScaleCUA samples have no benchmark row
    assert bench["osworld"]["n"] == 2 and bench["androidlab"]["bad_recall"] == 0.0
    hard = c["hard_cases"]
    assert hard["n"] == 2 and hard["verdict_accuracy"] == 0.5  # a2 right, o1 missed
    assert compute_metrics(rows)["history"]["per_source"] == {}


def test_report_has_the_per_source_rows():
    right = {"s2": BAD_SE, "o1": BAD_SE, "a1": BAD_SE}
    rows = [score_sample(r, Answer(text=right.get(r.id, GOOD)), None) for r in RECORDS]
    from train.critic_eval import BackendResult

    result = BackendResult("b", "oracle", rows, compute_metrics(rows))
    report = render_report([result], {"split": "test"})
    assert "### By source: verdict accuracy / error-dimension accuracy" in report
    assert "| scalecua | 100.0 % / 100.0 % (n=3) |" in report
    assert "| run: osworld | 100.0 % / 100.0 % (n=2) |" in report
    assert "| hard cases | 100.0 % / 100.0 % (n=2) |" in report


def test_evaluate_writes_per_source_metrics_json(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    synthetic_screenshot(160, 96, 1).save(corpus / "a.png")
    data = tmp_path / "data"
    write_records(RECORDS, records_dir(data) / "test")
    write_manifest(records_dir(data), corpus)
    out = tmp_path / "out"
    small = ["--min-pixels", "1024", "--max-pixels", "65536"]
    assert main(["--data", str(data), "--backend", "oracle", "--out", str(out), *small]) == 0
    m = json.loads((out / "metrics.json").read_text())["backends"]["oracle"]["critique"]
    assert {k: v["n"] for k, v in m["per_source"].items()} == {"run": 4, "scalecua": 3}
    assert {k: v["n"] for k, v in m["per_benchmark"].items()} == {"androidlab": 2, "osworld": 2}
    assert m["hard_cases"]["n"] == 2 and m["per_source"]["run"]["verdict_accuracy"] == 1.0
    rows = [json.loads(x) for x in (out / "predictions" / "oracle.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rows}
    assert by_id["o1"]["source"] == "run" and by_id["o1"]["benchmark"] == "osworld"
    assert by_id["o1"]["hard_case"] == "critic_good_on_root_cause"
    assert "| run: androidlab |" in (out / "report.md").read_text(encoding="utf-8")
