"""Every YAML under configs/ loads into its stage's dataclass (or parses, for launcher files)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml

from hivig.config import load_config

ROOT = Path(__file__).resolve().parents[2]

# configs/<dir> -> "module:Class" of the schema it must load into.
SCHEMAS = {
    "data_gen": "data_gen.config:DataGenConfig",
    "train": "train.config:TrainConfig",
    "serve": "serve.config:ServeConfig",
}

ALL_FILES = sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file())
STAGE_YAMLS = [p for p in ALL_FILES if p.relative_to(ROOT / "configs").parts[0] in SCHEMAS]
LAUNCHER_FILES = [p for p in ALL_FILES if p.relative_to(ROOT / "configs").parts[0] == "accelerate"]


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


def test_every_config_file_is_checked():
    # A file in a directory nobody maps, or with an odd suffix, would otherwise go untested.
    unchecked = [
        str(p.relative_to(ROOT))
        for p in ALL_FILES
        if (p not in STAGE_YAMLS and p not in LAUNCHER_FILES)
        or (p in STAGE_YAMLS and p.suffix != ".yaml")
    ]
    assert not unchecked, f"config files no test loads: {unchecked}"


def test_there_are_configs_to_check():
    assert (ROOT / "configs" / "train").is_dir() and (ROOT / "configs" / "data_gen").is_dir()
    assert STAGE_YAMLS, "no stage YAMLs found"


def test_screen_size_reads_width_by_height_and_refuses_the_rest():
    import argparse

    from hivig.config import screen_size

    parse = screen_size(min_side=64)
    assert parse("1280x800") == (1280, 800) and parse(" 540X1200 ") == (540, 1200)
    for bad in ("1280", "1280x", "x800", "12.5x800", "-64x64", "1280x800x3", "63x800"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    assert screen_size()("32x32") == (32, 32)
