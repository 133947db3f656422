"""Salted corpora never crash ingest, and every input line is accounted for exactly once."""

from __future__ import annotations

import json
import random
import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_gen.ingest import REASONS, IngestConfig, Record, ingest, parse_line
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.files import split_lines

SMALL = {"desktop_size": (320, 180), "web_size": (320, 200), "phone_size": (180, 400)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz") / "clean"
    corpus = make_sample(root, SampleConfig(trajectories=20, seed=3, **SMALL), progress=False)
    return root, corpus


def _salt_lines(lines: list[str], rng: random.Random) -> list[str]:
    out = []
    for line in lines:
        roll = rng.random()
        if roll < 0.05:
            out.append(line[: rng.randrange(1, len(line))])  # truncated JSON
        elif roll < 0.08:
            out.append(line)
            out.append(line)  # duplicated line
        elif roll < 0.12:
            # Out-of-range unit coordinate, or a pixel/grid value in a unit file (ambiguous).
            value = rng.choice(["1.7", "734", "-0.2", "1e9"])
            out.append(re.sub(r"x=0\.\d+", f"x={value}", line, count=1))
        elif roll < 0.14:
            out.append(line.replace("Task:", "Tusk:"))
        elif roll < 0.16:
            out.append(line.replace("</action>", ""))
        elif roll < 0.18:
            out.append(line.replace("click(", "clack(", 1))
        elif roll < 0.20:
            out.append(json.dumps({"image": 5, "conversations": "no"}))
        elif roll < 0.21:
            out.append(line.replace("Task: ", "Task: \u2028", 1))  # raw separator inside JSON
        elif roll < 0.22:
            out.append("".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(0, 60))))
        elif roll < 0.23:
            out.append("[" * rng.randrange(5_000, 100_000))  # nesting beyond the recursion limit
        elif roll < 0.24:
            out.append(line.replace("Task: ", "Task: \udcff", 1))  # becomes a lone 0xFF byte
        else:
            out.append(line)
        if rng.random() < 0.02:
            out.append("")
    # Every file gets one of each: a non-UTF-8 byte inside a JSON string, and nesting past the
    # recursion limit (json raises RecursionError there, not ValueError).
    out.insert(rng.randrange(len(out) + 1), lines[0].replace("Task: ", "Task: \udcff", 1))
    out.insert(rng.randrange(len(out) + 1), "[" * 100_000)
    # And two trajectory-opening steps, one with a grid value in a unit file and one with a
    # negative coordinate, so the scale check and the range check both fire whatever the random
    # salting above did (a later step could be shadowed by after_bad_step).
    opening = [ln for ln in lines if "operations:\\nNone" in ln and re.search(r"x=0\.\d+", ln)]
    if opening:
        out.append(re.sub(r"x=0\.\d+", "x=734", rng.choice(opening), count=1))
        out.append(re.sub(r"x=0\.\d+", "x=-0.2", rng.choice(opening), count=1))
    return out


def _salt(root, rng: random.Random) -> None:
    meta = json.loads((root / "meta.json").read_text())
    for entry in meta.values():
        path = root / entry["annotation"]
        text = "\n".join(_salt_lines(path.read_text().splitlines(), rng)) + "\n"
        path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    images = sorted(root.glob("data/**/*.png"))
    for path in rng.sample(images, 6):
        data = path.read_bytes()
        path.write_bytes(data[: rng.randrange(8, len(data) - 1)])  # truncated PNG
    for path in rng.sample(images, 6):
        path.unlink(missing_ok=True)  # missing image
    # One annotation file listed in meta.json does not exist at all.
    meta["internal_web_navigation_20990101"] = {
        "root": "data/data_20990101/web/images",
        "annotation": "annotations/missing.jsonl",
        "task": "web_navigation",
    }
    (root / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["header", "full"])
def test_salted_corpus_never_crashes_and_counts_balance(clean, tmp_path, seed, mode):
    src, corpus = clean
    root = tmp_path / "corpus"
    shutil.copytree(src, root)
    _salt(root, random.Random(seed))
    res = ingest(root, tmp_path / "out", IngestConfig(verify_images=mode), progress=False)
    s = res.stats
    raw_lines = sum(
        len(split_lines((root / e["annotation"]).read_text(errors="replace")))
        for e in json.loads((root / "meta.json").read_text()).values()
        if (root / e["annotation"]).exists()
    )
    assert s["lines"] == raw_lines == s["steps_kept"] + sum(s["dropped"].values())
    assert set(s["dropped"]) <= set(REASONS)
    for reason in ("bad_json", "bad_encoding", "missing_image", "corrupt_image", "after_bad_step"):
        assert s["dropped"].get(reason, 0) > 0, reason
    assert s["dropped"].get("ambiguous_scale", 0) > 0
    assert s["dropped"].get("coordinate_out_of_range", 0) > 0
    assert 0 < s["steps_kept"] < raw_lines
    quarantine = (res.out_dir / "quarantine.jsonl").read_text().splitlines()
    assert len(quarantine) == sum(s["dropped"].values())
    assert (
        res.report["skipped_entries"]["internal_web_navigation_20990101"]
        == "missing_annotation_file"
    )
    trajs = [json.loads(x) for x in split_lines((res.out_dir / "trajectories.jsonl").read_text())]
    assert sum(len(t["steps"]) for t in trajs) == s["steps_kept"]
    assert all(t["steps"] for t in trajs)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parse_line_is_total_on_text(text):
    rec = parse_line(text, 1)
    assert isinstance(rec, Record)
    assert rec.error is None or rec.error[0] in REASONS


_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {"image": _value, "conversations": _value, "width": _value, "height": _value},
        optional={"extra": _value},
    ),
    st.text(max_size=200),
)
def test_parse_line_is_total_on_records(obj, gpt):
    rec = parse_line(json.dumps(obj), 1)
    assert rec.error is None or rec.error[0] in REASONS
    obj = {
        "image": "a/images/b.png",
        "conversations": [
            {"from": "human", "value": "<image>\nTask: t\n\nPrevious operations:\nNone"},
            {"from": "gpt", "value": gpt},
        ],
        "width": 10,
        "height": 10,
    }
    rec = parse_line(json.dumps(obj), 1)
    assert rec.error is None or rec.error[0] in REASONS
