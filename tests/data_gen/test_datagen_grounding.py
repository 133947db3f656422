"""Annotator grounding: element boxes for corpora without an element sidecar."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from data_gen.annotator import Rejected
from data_gen.config import DataGenConfig
from data_gen.ingest import ingest
from data_gen.perturb.elements import Element
from data_gen.perturb.grounding import grounding_validator
from data_gen.run import main
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.config import load_config
from hivig.messages import ImageRef
from hivig.prompts import build_grounding_messages

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


def test_grounding_answer_must_contain_the_expert_click():
    validate = grounding_validator((450, 425))
    ok = validate('{"label": "OK", "role": "button", "box": [400, 400, 500, 450]}', None)
    assert ok == Element("OK", "button", (400, 400, 500, 450))
    # The same answer for a click elsewhere is dropped with a reason, never kept.
    miss = grounding_validator((700, 425))(
        'Here: {"label": "OK", "role": "button", "box": [400, 400, 500, 450]}', None
    )
    assert isinstance(miss, Rejected) and miss.reason == "grounding_click_outside_box"
    for bad in ("no json", '{"label": "", "box": [1, 2, 3, 4]}', '{"label": "x", "box": [5]}'):
        assert validate(bad, None).reason == "grounding_unparseable"


def test_grounding_prompt_shows_the_screen_and_the_step():
    messages = build_grounding_messages(
        "Save the file", "windows", ImageRef("a.png"), "Action: Click OK"
    )
    assert messages.prompt_id == "annotator_grounding_v1"
    user = messages[1]
    assert user.content[0].image.path == "a.png" and "Action: Click OK" in user.content[-1].text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("ground")
    make_sample(root / "c", SampleConfig(trajectories=8, seed=3), progress=False)
    ingest(root / "c", root / "i", progress=False)
    return root


def test_annotator_grounding_gives_grounding_samples_without_a_sidecar(corpus, tmp_path):
    out = tmp_path / "out"
    args = [
        "--config",
        str(DEMO),
        f"corpus={corpus / 'c'}",
        f"out={out}",
        f"trajectories={corpus / 'i' / 'trajectories.jsonl'}",
        "perturb.element_source=annotator",  # the sidecar is only the offline annotator's truth
    ]
    assert main(args) == 0
    counts = json.loads((out / "grounding.json").read_text())
    assert counts["grounded"] > 0
    stats = json.loads((out / "dataset" / "stats.json").read_text())
    dims = Counter({k: v for k, v in stats["dimension_totals"].items() if v})
    assert dims["Grounding/Spatial Error"] > 0
    # A grounded screen knows only its target, so absence (a ghost) is never claimed.
    assert dims["Visual Hallucination"] == 0


def test_element_source_is_validated():
    with pytest.raises(Exception, match="element_source"):
        load_config(DataGenConfig, DEMO, ["perturb.element_source=guess"])


def test_grounding_runs_once_per_output_folder_whatever_the_shards(corpus, tmp_path, monkeypatch):
    import data_gen.run as run_mod

    calls = []
    real = run_mod.ground_corpus
    monkeypatch.setattr(run_mod, "ground_corpus", lambda *a, **k: calls.append(1) or real(*a, **k))

    def args(out, *extra):
        return [
            "--config",
            str(DEMO),
            f"corpus={corpus / 'c'}",
            f"out={out}",
            f"trajectories={corpus / 'i' / 'trajectories.jsonl'}",
            "perturb.element_source=annotator",
            *extra,
        ]

    assert main(args(tmp_path / "one")) == 0
    assert main([*args(tmp_path / "two"), "--shard", "0/2"]) == 0
    assert main([*args(tmp_path / "two"), "--shard", "1/2"]) == 0
    # One grounding per output folder: the second shard read the first one's boxes.
    assert len(calls) == 2
    saved = (tmp_path / "two" / "grounding" / "elements.jsonl").read_text()
    assert saved == (tmp_path / "one" / "grounding" / "elements.jsonl").read_text()
    assert '"partial": true' in saved  # grounded screens know only their target
    one, two = (tmp_path / d / "dataset" / "stats.json" for d in ("one", "two"))
    assert json.loads(one.read_text()) == json.loads(two.read_text())
