"""hivig.config: YAML + dotlist loading with type checking, named errors, run descriptions."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest

from hivig.config import (
    BackendConfig,
    ConfigError,
    FrameConfig,
    add_config_arguments,
    config_to_yaml,
    load_config,
    write_run_description,
)


@dataclass
class _Optim:
    lr: float = 1e-5
    """Peak learning rate."""
    warmup_ratio: float = 0.0
    """Fraction of steps spent warming up."""

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError("`optim.warmup_ratio` must be in [0, 1)")


@dataclass
class _Stage:
    out: str = "runs/x"
    optim: _Optim = field(default_factory=_Optim)
    frame: FrameConfig = field(default_factory=FrameConfig)


def test_defaults_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# values only\noptim:\n  lr: 2.0e-5\nout: runs/a\n", encoding="utf-8")
    cfg = load_config(_Stage, path, ["optim.lr=5e-6", "frame.max_pixels=262144"])
    assert isinstance(cfg, _Stage) and isinstance(cfg.optim, _Optim)
    assert cfg.optim.lr == 5e-6  # the override wins over the YAML
    assert cfg.out == "runs/a"
    assert cfg.frame.max_pixels == 262144 and cfg.frame.factor == 32


def test_unknown_key_and_wrong_type_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="optim"):
        load_config(_Stage, None, ["optim.lrr=1"])
    with pytest.raises(ConfigError):
        load_config(_Stage, None, ["optim.lr=fast"])


def test_cross_field_rule_names_the_field():
    with pytest.raises(ConfigError, match="warmup_ratio"):
        load_config(_Stage, None, ["optim.warmup_ratio=1.5"])
    with pytest.raises(ConfigError, match="frame.min_pixels"):
        load_config(_Stage, None, ["frame.min_pixels=0"])


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(_Stage, tmp_path / "nope.yaml")


def test_backend_kind_validated():
    with pytest.raises(ConfigError, match="backend.kind"):
        BackendConfig(kind="grpc")


def test_yaml_round_trip_and_run_description(tmp_path):
    cfg = load_config(_Stage, None, ["optim.lr=3e-6"])
    text = config_to_yaml(cfg)
    (tmp_path / "again.yaml").write_text(text, encoding="utf-8")
    assert load_config(_Stage, tmp_path / "again.yaml") == cfg
    write_run_description(tmp_path / "run", cfg)
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert set(info) >= {"git", "packages", "host", "slurm_job_id"}
    assert "torch" in info["packages"]
    assert "lr: 3.0e-06" in (tmp_path / "run" / "config.yaml").read_text()


def test_cli_arguments():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--config", "x.yaml", "--dry-run", "a.b=1", "out=o"])
    assert args.config == "x.yaml" and args.dry_run and args.overrides == ["a.b=1", "out=o"]
