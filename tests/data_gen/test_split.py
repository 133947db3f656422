"""Episode-level train/val/test splits: deterministic, order-independent, leak-free."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from data_gen.__main__ import main
from data_gen.split import SplitConfig, SplitError, assign_episodes, split


def _trajs(n_episodes: int, variants: int = 3) -> list[str]:
    out = []
    for e in range(n_episodes):
        for v in range(variants):
            obj = {
                "id": f"t{e}-{v}",
                "episode_key": f"ep{e:04d}",
                "source": {"dataset": "d", "file": "f"},
                "platform": ("windows", "web", "android")[e % 3],
                "task": f"task {e} variant {v}",
                "steps": [],
            }
            out.append(json.dumps(obj))
    return out


def _read(folder):
    return {name: (folder / f"{name}.jsonl").read_text() for name in ("train", "val", "test")}


def test_episodes_stay_whole_and_fractions_hold(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n".join(_trajs(200)) + "\n")
    stats = split(tmp_path / "t.jsonl", tmp_path / "s", SplitConfig(val=0.1, test=0.05, seed=1))
    assert {k: v["episodes"] for k, v in stats["splits"].items()} == {
        "train": 170,
        "val": 20,
        "test": 10,
    }
    where = {}
    for name, text in _read(tmp_path / "s").items():
        for line in text.splitlines():
            key = json.loads(line)["episode_key"]
            assert where.setdefault(key, name) == name  # no episode in two splits
    assert len(where) == 200
    assert sum(v["trajectories"] for v in stats["splits"].values()) == 600


def test_deterministic_and_independent_of_input_order(tmp_path):
    lines = _trajs(50)
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    random.Random(4).shuffle(lines)
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    cfg = SplitConfig(val=0.1, test=0.1, seed=9)
    split(tmp_path / "a.jsonl", tmp_path / "sa", cfg)
    split(tmp_path / "b.jsonl", tmp_path / "sb", cfg)
    assert _read(tmp_path / "sa") == _read(tmp_path / "sb")
    # Negative control: another seed moves episodes.
    split(tmp_path / "a.jsonl", tmp_path / "sc", SplitConfig(val=0.1, test=0.1, seed=10))
    assert _read(tmp_path / "sa") != _read(tmp_path / "sc")


def test_assignment_depends_only_on_the_key_set():
    keys = {f"k{i}" for i in range(40)}
    a = assign_episodes(keys, SplitConfig(val=0.25, test=0.25, seed=3))
    assert a == assign_episodes(
        set(sorted(keys, reverse=True)), SplitConfig(val=0.25, test=0.25, seed=3)
    )
    assert sorted(a.values()).count("test") == 10


def test_bad_lines_are_quarantined_and_counted(tmp_path):
    # ``[[[…`` past the recursion limit raises RecursionError inside json, not ValueError.
    lines = _trajs(5, variants=1) + ["{oops", json.dumps({"id": "x"}), "[" * 100_000]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    stats = split(tmp_path / "t.jsonl", tmp_path / "s", SplitConfig(val=0.2, test=0.2))
    assert stats["lines"] == 8 and stats["dropped"] == {"bad_json": 2, "missing_episode_key": 1}
    assert sum(v["trajectories"] for v in stats["splits"].values()) == 5
    assert len((tmp_path / "s" / "quarantine.jsonl").read_text().splitlines()) == 3


def test_bad_options(tmp_path):
    with pytest.raises(SplitError):
        SplitConfig(val=0.6, test=0.5)
    with pytest.raises(SplitError):
        SplitConfig(val=-0.1)
    with pytest.raises(SplitError):
        split(tmp_path / "missing.jsonl", tmp_path / "s", SplitConfig())


def test_cli_split(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text("\n".join(_trajs(20)) + "\n")
    argv = ["split", "--in", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "s")]
    assert main([*argv, "--val", "0.1", "--test", "0.1", "--seed", "2", "--quiet"]) == 0
    out = capsys.readouterr()
    assert "split summary" in out.out and "split:" not in out.err  # --quiet: no progress bar
    assert main([*argv, "--val", "0.1", "--test", "0.1", "--seed", "2"]) == 0
    assert "split:" in capsys.readouterr().err
    assert main([*argv, "--val", "0.7", "--test", "0.7"]) == 2


def test_split_and_run_put_every_episode_of_a_corpus_in_the_same_split(tmp_path):
    from data_gen.config import DataGenConfig
    from data_gen.ingest import ingest
    from data_gen.run import load_work
    from data_gen.sample_corpus import SampleConfig, make_sample
    from hivig.config import load_config

    make_sample(tmp_path / "c", SampleConfig(trajectories=40, seed=0), progress=False)
    ingest(tmp_path / "c", tmp_path / "i", progress=False)
    trajs = tmp_path / "i" / "trajectories.jsonl"
    demo = Path(__file__).resolve().parents[2] / "configs" / "data_gen" / "demo.yaml"
    overrides = [f"corpus={tmp_path / 'c'}", f"out={tmp_path / 'o'}", f"trajectories={trajs}"]
    cfg = load_config(DataGenConfig, demo, overrides)
    works, _ = load_work(cfg)
    e = cfg.export
    split(trajs, tmp_path / "s", SplitConfig(val=e.val_share, test=e.test_share, seed=cfg.seed))
    by_split = {
        json.loads(line)["episode_key"]: name
        for name in ("train", "val", "test")
        for line in (tmp_path / "s" / f"{name}.jsonl").read_text().splitlines()
    }
    # The run leaves out failed trajectories and quarantines some, the split keeps them all:
    # the same rule over the same keys still gives every episode one split.
    assert len(works) < len(by_split) or len(works) < sum(1 for _ in trajs.open())
    assert len({w.split for w in works}) == 3
    for w in works:
        assert by_split[w.trajectory.episode_key] == w.split, w.id
