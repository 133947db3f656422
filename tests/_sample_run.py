"""A generated, ingested sample corpus and the demo data_gen config that runs on it (tests)."""

from __future__ import annotations

from pathlib import Path

from data_gen.config import DataGenConfig
from data_gen.ingest import ingest
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.config import load_config

DEMO = Path(__file__).resolve().parents[1] / "configs" / "data_gen" / "demo.yaml"


def ingested_demo_config(
    root: Path, trajectories: int, seed: int, *overrides: str
) -> DataGenConfig:
    """``make-sample`` + ingest under ``root`` (``c/``, ``i/``); the demo config writes ``o/``."""
    make_sample(root / "c", SampleConfig(trajectories=trajectories, seed=seed), progress=False)
    ingest(root / "c", root / "i", progress=False)
    return load_config(
        DataGenConfig,
        DEMO,
        [
            f"corpus={root / 'c'}",
            f"out={root / 'o'}",
            f"trajectories={root / 'i' / 'trajectories.jsonl'}",
            *overrides,
        ],
    )
