"""Every YAML under configs/ loads into its stage's dataclass (or parses, for launcher files)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml

from hivig.config import load_config

ROOT = Path(__file__).resolve().parents[1]

# configs/<dir> -> "module:Class" of the schema it must load into.
SCHEMAS = {
    "data_gen": "data_gen.config:DataGenConfig",
    "train": "train.config:TrainConfig",
    "serve": "serve.config:ServeConfig",
}

STAGE_YAMLS = sorted(
    p
    for d in SCHEMAS
    for p in (ROOT / "configs" / d).glob("*.yaml")
    if (ROOT / "configs" / d).is_dir()
)
LAUNCHER_FILES = (
    sorted((ROOT / "configs" / "accelerate").glob("*"))
    if (ROOT / "configs" / "accelerate").is_dir()
    else []
)


def _schema(stage: str):
    module, name = SCHEMAS[stage].split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", STAGE_YAMLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_stage_yaml_loads(path):
    stage = path.parent.name
    cfg = load_config(_schema(stage), path)
    assert cfg is not None
    # Every YAML opens with a comment block saying what it is for and how to launch it.
    assert path.read_text(encoding="utf-8").lstrip().startswith("#"), f"{path} needs a header"


@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_launcher_files_parse(path):
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    assert isinstance(data, dict) and data


def test_there_are_configs_to_check():
    assert (ROOT / "configs" / "train").is_dir() and (ROOT / "configs" / "data_gen").is_dir()
    assert STAGE_YAMLS, "no stage YAMLs found"
