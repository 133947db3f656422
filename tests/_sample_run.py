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


def tiny_final_checkpoint(root: Path, min_pixels: int, max_pixels: int) -> Path:
    """The final checkpoint of a one-step tiny training run, as ``python -m train`` writes it
    (processor files, chat template, recorded profile), on a frame of the given budget."""
    from hivig.config import load_config
    from train.config import TrainConfig
    from train.sft import setup, train
    from train.synthetic import write_dataset

    data = write_dataset(root / "data", n_train=2, n_val=0, sizes=((64, 64),), words=(2, 4))
    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(
        TrainConfig,
        repo / "configs" / "train" / "tiny_cpu.yaml",
        [
            f"data={data}",
            f"out={root / 'run'}",
            "loop.max_steps=1",
            "optim.grad_accum=1",
            "optim.global_batch_samples=1",
            "dataset.max_samples_per_pack=1",
            f"dataset.frame.min_pixels={min_pixels}",
            f"dataset.frame.max_pixels={max_pixels}",
        ],
    )
    return Path(train(setup(cfg)).final_dir)
