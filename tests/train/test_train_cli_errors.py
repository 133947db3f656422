"""Every user error of `python -m train` is one `error:` line and exit status 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hivig.models import qwen_vl
from train.cli import main
from train.synthetic import write_dataset

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "train" / "tiny_cpu.yaml")
FULL = str(ROOT / "configs" / "train" / "qwen3vl_8b_full.yaml")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    return write_dataset(out, n_train=2, n_val=0, sizes=((64, 64),), words=(2, 4))


@pytest.fixture(autouse=True)
def _no_stderr_log_handler(monkeypatch):
    # The CLI attaches a stderr handler once per process; under capsys it would hold a stream
    # of an earlier test. Log lines are not what these tests read.
    monkeypatch.setattr("hivig.logging._CONFIGURED", True)


def _error(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert err.rstrip().splitlines()[-1] == errors[0]
    return errors[0]


def test_no_arguments(capsys):
    assert "pass --config" in _error(capsys, [])


def test_data_missing_or_not_a_dataset(capsys, tmp_path):
    assert "`data` is empty" in _error(capsys, ["--config", TINY, f"out={tmp_path / 'o'}"])
    line = _error(capsys, ["--config", TINY, f"data={tmp_path}", f"out={tmp_path / 'o'}"])
    assert "no training split" in line
    afile = tmp_path / "file"
    afile.write_text("x")
    line = _error(capsys, ["--config", TINY, f"data={afile}", f"out={tmp_path / 'o'}"])
    assert "not a directory" in line


def test_resume_from_a_missing_checkpoint(capsys, tmp_path, data_dir):
    argv = ["--config", TINY, f"data={data_dir}", f"out={tmp_path / 'o'}"]
    line = _error(capsys, [*argv, f"loop.resume={tmp_path / 'nope'}"])
    assert "`loop.resume`" in line and "not a checkpoint directory" in line


def test_yaml_syntax_error_names_the_file_and_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1e-5\nloop:\n  epochs: 1\n")
    line = _error(capsys, ["--config", str(bad)])
    assert f"YAML syntax error in {bad}" in line and "line " in line


def test_override_errors_name_the_override_not_the_file(capsys):
    line = _error(capsys, ["--config", TINY, "optim.lr=fast"])
    assert "'optim.lr=fast'" in line and "tiny_cpu.yaml" not in line
    line = _error(capsys, ["--config", TINY, "optim.lrr=1"])
    assert "'optim.lrr=1'" in line
    assert "not KEY=VALUE" in _error(capsys, ["--config", TINY, "optim.lr"])


def test_unwritable_out(capsys, tmp_path, data_dir):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    line = _error(capsys, ["--config", TINY, f"data={data_dir}", f"out={blocker / 'run'}"])
    assert "`out`: cannot write" in line


def test_a_missing_config_file(capsys, tmp_path):
    assert "config file not found" in _error(capsys, ["--config", str(tmp_path / "x.yaml")])


# --------------------------------------------------------------------------------------------
# model.path: a directory or a Hugging Face id; never silently the tiny model


def test_the_8b_config_refuses_an_empty_model_path(capsys, data_dir, tmp_path):
    line = _error(capsys, ["--config", FULL, f"data={data_dir}", "model.path=''"])
    assert "`model.path` is empty" in line and "Qwen/Qwen3-VL-8B-Thinking" in line
    line = _error(capsys, ["--config", TINY, "model.path=/x"])
    assert "choose one" in line


def test_the_8b_configs_name_the_papers_base_model():
    from hivig.config import load_config
    from train.config import TrainConfig

    for name in ("qwen3vl_8b_full.yaml", "qwen3vl_8b_lora.yaml"):
        cfg = load_config(TrainConfig, ROOT / "configs" / "train" / name)
        assert cfg.model.path == "Qwen/Qwen3-VL-8B-Thinking" and not cfg.model.tiny
        assert "Qwen3-VL-8B-Instruct" in (ROOT / "configs" / "train" / name).read_text()


def _fake_hub_cache(root: Path, repo: str) -> Path:
    """The layout huggingface_hub writes: refs/main -> snapshots/<commit>/files."""
    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return snapshot


def test_a_hub_id_resolves_through_the_local_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    snapshot = _fake_hub_cache(tmp_path / "hub", "Qwen/Qwen3-VL-8B-Thinking")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    assert qwen_vl.resolve_model_path("Qwen/Qwen3-VL-8B-Thinking") == snapshot
    # A local directory is taken as it is; one without config.json is refused.
    assert qwen_vl.resolve_model_path(snapshot) == snapshot
    with pytest.raises(qwen_vl.ModelPathError, match="no config.json"):
        qwen_vl.resolve_model_path(tmp_path)


def test_an_unknown_hub_id_offline_is_one_line(capsys, tmp_path, monkeypatch, data_dir):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    argv = ["--config", FULL, f"data={data_dir}", f"out={tmp_path / 'o'}", "model.path=org/nope"]
    line = _error(capsys, argv)
    assert "org/nope is not in the local Hugging Face cache" in line
    line = _error(capsys, [*argv[:-1], "model.path=./no/such/dir"])
    assert "neither a directory nor a Hugging Face id" in line


def test_evaluate_forwards_its_arguments_to_the_critic_eval(monkeypatch):
    import sys
    import types

    seen = []
    fake = types.ModuleType("train.critic_eval")
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "train.critic_eval", fake)
    assert main(["evaluate", "--config", "x.yaml", "k=v"]) == 3
    assert seen == [["--config", "x.yaml", "k=v"]]


def test_evaluate_without_the_critic_eval_package_is_one_line(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "train.critic_eval", None)  # import raises ImportError
    assert main(["evaluate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
