"""A generated, ingested sample corpus and the demo data_gen config that runs on it (tests)."""

from __future__ import annotations

from pathlib import Path

from data_gen.config import DataGenConfig
from data_gen.ingest import ingest
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.config import load_config

DEMO = Path(__file__).resolve().parents[1] / "configs" / "data_gen" / "demo.yaml"


def ingested_sample(root: Path, trajectories: int, seed: int) -> Path:
    """``make-sample`` + ingest under ``root`` (``c/``, ``i/``); returns ``root``."""
    make_sample(root / "c", SampleConfig(trajectories=trajectories, seed=seed), progress=False)
    ingest(root / "c", root / "i", progress=False)
    return root


def demo_config(sample: Path, out: Path, *overrides: str) -> DataGenConfig:
    """The demo data_gen config reading the ingested sample under ``sample``, writing ``out``."""
    return load_config(
        DataGenConfig,
        DEMO,
        [
            f"corpus={sample / 'c'}",
            f"out={out}",
            f"trajectories={sample / 'i' / 'trajectories.jsonl'}",
            *overrides,
        ],
    )


def ingested_demo_config(
    root: Path, trajectories: int, seed: int, *overrides: str
) -> DataGenConfig:
    """``make-sample`` + ingest under ``root`` (``c/``, ``i/``); the demo config writes ``o/``."""
    return demo_config(ingested_sample(root, trajectories, seed), root / "o", *overrides)
