"""make-sample -> ingest recovers every generated trajectory, and actions hit their elements."""

from __future__ import annotations

import json

import pytest

from data_gen.ingest import IngestConfig, ingest
from data_gen.sample_corpus import SampleConfig, make_sample

SMALL = {"desktop_size": (640, 360), "web_size": (640, 400), "phone_size": (270, 600)}


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt")
    corpus = make_sample(
        root / "corpus", SampleConfig(trajectories=40, seed=7, **SMALL), progress=False
    )
    res = ingest(root / "corpus", root / "out", IngestConfig(verify_images="full"), progress=False)
    trajs = [json.loads(x) for x in (res.out_dir / "trajectories.jsonl").read_text().splitlines()]
    sidecar = {
        (ln := json.loads(x))["screenshot"]: ln
        for x in (root / "corpus" / "elements.jsonl").read_text().splitlines()
    }
    return corpus, res, trajs, sidecar


def _kept_file(ep) -> tuple[str, str]:
    """(annotation, meta key) of the copy ingest keeps: the planning_cot one (it has <think>)."""
    if ep.copy_annotation is not None and "_planning_" in ep.copy_annotation:
        return ep.copy_annotation, ep.meta_key.replace("_navigation_", "_planning_cot_")
    return ep.annotation, ep.meta_key


def test_every_trajectory_is_recovered_and_only_copies_are_dropped(roundtrip):
    corpus, res, trajs, _ = roundtrip
    copy_lines = sum(ep.copy_lines for ep in corpus.episodes)
    assert corpus.copies > 0 and copy_lines > 0  # the corpus exercises cross-file copies
    assert res.stats == {
        "lines": corpus.lines,
        "steps_kept": corpus.lines - copy_lines,
        "trajectories": corpus.trajectories,
        "dropped": {"duplicate": copy_lines},
    }
    quarantine = [
        json.loads(x) for x in (res.out_dir / "quarantine.jsonl").read_text().splitlines()
    ]
    assert {q["reason"] for q in quarantine} == {"duplicate"}
    assert len(res.report["duplicate_copies"]) == corpus.copies
    assert res.report["truncated"]["count"] == 0
    index = {(t["source"]["file"], t["task"]): t for t in trajs}
    assert len(index) == len(trajs) == len({t["id"] for t in trajs})
    for ep in corpus.episodes:
        keys = set()
        anno, meta_key = _kept_file(ep)
        for task in ep.instructions:
            t = index[(anno, task)]
            assert t["platform"] == ep.platform
            assert t["source"]["dataset"] == meta_key
            assert [s["screenshot"] for s in t["steps"]] == ep.screenshots
            assert [s["raw_action"] for s in t["steps"]] == ep.raw_actions
            assert t["outcome"] == ep.outcome
            keys.add(t["episode_key"])
        assert len(keys) == 1  # instruction variants share one episode key
    assert len({t["episode_key"] for t in trajs}) == len(corpus.episodes)


def test_without_copies_nothing_is_quarantined(tmp_path):
    cfg = SampleConfig(trajectories=10, seed=7, copies=0.0, **SMALL)
    corpus = make_sample(tmp_path / "corpus", cfg, progress=False)
    res = ingest(tmp_path / "corpus", tmp_path / "out", progress=False)
    assert corpus.copies == 0
    assert res.stats["dropped"] == {} and res.stats["steps_kept"] == corpus.lines


def _points(actions):
    for a in actions:
        for key in ("coordinate", "coordinate2"):
            if key in a:
                yield a[key]


def _inside(point, boxes):
    x, y = point
    return any(x1 <= x <= x2 and y1 <= y <= y2 for x1, y1, x2, y2 in boxes)


def test_ingested_actions_land_inside_their_target_boxes(roundtrip):
    _, _, trajs, sidecar = roundtrip
    checked = missed_when_moved = 0
    for t in trajs:
        for s in t["steps"]:
            side = sidecar[s["screenshot"]]
            boxes = [
                e["box"] for e in side["elements"] if e["label"] in set(side["targets"]) - {None}
            ]
            points = list(_points(s["actions"]))
            assert bool(points) == bool(boxes), s  # coordinates exactly where targets exist
            for p in points:
                assert _inside(p, boxes), (s["screenshot"], p, boxes)
                checked += 1
                # Negative control: the same point moved a third of the screen misses.
                missed_when_moved += not _inside(((p[0] + 333) % 1000, (p[1] + 333) % 1000), boxes)
    assert checked > 50
    assert missed_when_moved > 0.8 * checked


def test_scroll_decisions_and_scales_reported(roundtrip, tmp_path):
    _, res, _, _ = roundtrip
    assert {f["scale"] for f in res.report["files"].values()} == {"unit"}
    assert res.report["images"].get("ok", 0) > 0
    # Scrolls are a few steps per platform and family: the sign needs a larger corpus to be
    # decided (SCROLL_MIN_EVIDENCE texts per group); small screens keep it fast.
    tiny = {"desktop_size": (320, 180), "web_size": (320, 200), "phone_size": (180, 400)}
    make_sample(tmp_path / "c", SampleConfig(trajectories=100, seed=7, **tiny), progress=False)
    big = ingest(tmp_path / "c", tmp_path / "o", IngestConfig(verify_images="none"), progress=False)
    decisions = {g: d["decision"] for g, d in big.report["scroll_sign"].items()}
    assert "pyautogui" in decisions.values() and "inverted" not in decisions.values()
