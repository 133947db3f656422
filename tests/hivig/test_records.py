"""SFT records: validation, Parquet round trip with stable bytes, messages, ShareGPT export."""

from __future__ import annotations

import dataclasses
import json

import pytest
from PIL import Image

from hivig.messages import ArrowMark, ChatMessage, ImagePart, ImageRef, PointMark, TextPart
from hivig.prompts import build_critique_messages, build_history_messages
from hivig.records import (
    ImageSlot,
    Labels,
    Provenance,
    RecordError,
    SFTRecord,
    read_records,
    record_from_messages,
    record_messages,
    to_sharegpt,
    write_records,
)
from hivig.vision import canonical_frame


def _critique(i: int, **over) -> SFTRecord:
    fields = dict(
        id=f"crit-{i}",
        kind="critique",
        platform="android",
        prompt_version="critic_critique_v1",
        trajectory_id=f"traj-{i // 2}",
        episode_key=f"ep-{i // 4}",
        step_index=i,
        split="train",
        images=(ImageRef("shots/a.png", (PointMark(100, 200), ArrowMark(1, 2, 3, 4)), "mobile"),),
        system="sys ünïcode",
        user=(ImageSlot(0), TextPart(f"User Instruction (Goal): task {i}")),
        target="<think>\nt\n</think>\n<criticism>\nOverall Grading: Bad\n"
        "Error Dimension: Semantic Error\nExplanation: e\n</criticism>",
        labels=Labels("Bad", "Semantic Error", intent_masked=True, generator="annotator"),
        provenance=Provenance("Qwen/Qwen3-VL-32B-Thinking", "endpoint", ("h1", "h2")),
    )
    fields.update(over)
    return SFTRecord(**fields)


def _history(i: int) -> SFTRecord:
    return SFTRecord(
        id=f"hist-{i}",
        kind="history",
        platform="windows",
        prompt_version="critic_history_v1",
        trajectory_id="traj-h",
        episode_key="ep-h",
        step_index=i,
        split="val",
        images=(ImageRef("shots/a.png"), ImageRef("/abs/b.png")),
        system="sys",
        user=(ImageSlot(0), ImageSlot(1), TextPart("User Instruction (Goal): g")),
        target="<think>\nd\n</think>\n<summary>\nProgress Summary: p\n"
        "Last Action Result: r\n</summary>",
        provenance=Provenance(None, "offline", ()),
    )


def _dataset() -> list[SFTRecord]:
    good = _critique(
        7,
        labels=Labels("Good", None, False, None),
        provenance=Provenance(),
        images=(),
        user=(TextPart("text only"),),
    )
    return [_critique(i) for i in range(5)] + [_history(i) for i in range(3)] + [good]


# -------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"kind": "summary"}, "`kind`"),
        ({"split": "dev"}, "`split`"),
        ({"platform": "ios"}, "`platform`"),
        ({"prompt_version": ""}, "`prompt_version`"),
        ({"step_index": -1}, "`step_index`"),
        ({"id": ""}, "`id`"),
        ({"user": (TextPart("no image slot"),)}, "`user` must reference"),
        ({"user": (ImageSlot(1), TextPart("x"))}, "`user` must reference"),
        ({"user": (ImageSlot(0), TextPart("has <image> token"))}, "reserved token"),
        ({"labels": Labels(None, None)}, "verdict"),
        ({"labels": Labels("Bad", None)}, "error_dimension"),
        ({"labels": Labels("Bad", "semantic error")}, "exact dimension name"),
        ({"labels": Labels("Bad", "Grounding Error")}, "exact dimension name"),
        ({"labels": Labels("Good", "Semantic Error")}, "Good sample"),
        ({"labels": Labels("Bad", "Action-Operation Misalignment", True)}, "must not be intent"),
        ({"labels": Labels("Bad", "Visual Hallucination", True)}, "must not be intent"),
        ({"labels": Labels("Bad", "Semantic Error", False, "human")}, "generator"),
        ({"labels": Labels("Bad", "Semantic Error", False, None)}, "Bad sample needs"),
        ({"labels": Labels("Good", None, False, "programmatic")}, "Good sample has no"),
        ({"labels": Labels("Good", None, False, "annotator")}, "Good sample has no"),
    ],
)
def test_invalid_records_are_rejected(over, match):
    with pytest.raises(RecordError, match=match):
        _critique(0, **over)


def test_history_records_carry_no_verdict():
    with pytest.raises(RecordError, match="history"):
        dataclasses.replace(_history(0), labels=Labels("Good"))


@pytest.mark.parametrize("generator", ["programmatic", "annotator"])
def test_generator_only_on_bad_critique_samples(generator):
    with pytest.raises(RecordError, match="history samples carry no `labels.generator`"):
        dataclasses.replace(_history(0), labels=Labels(generator=generator))
    bad = _critique(0, labels=Labels("Bad", "Semantic Error", generator=generator))
    assert bad.labels.generator == generator  # positive control


# -------------------------------------------------------------------------------------------
# Parquet


def test_write_read_round_trip_and_stable_bytes(tmp_path):
    records = _dataset()
    paths = write_records(records, tmp_path / "a", shard_size=4)
    assert [p.name for p in paths] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert read_records(tmp_path / "a") == records
    assert read_records(paths[1]) == records[4:8]
    again = write_records(records, tmp_path / "b", shard_size=4)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    # Negative control: a one-character change changes the bytes.
    changed = [dataclasses.replace(records[0], target=records[0].target + " ")] + records[1:]
    other = write_records(changed, tmp_path / "c", shard_size=4)
    assert other[0].read_bytes() != paths[0].read_bytes()
    assert not list((tmp_path / "a").glob("*.tmp"))


def test_readable_with_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = _dataset()
    write_records(records, tmp_path, shard_size=100)
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "part-*.parquet"))["train"]
    assert ds.num_rows == len(records)
    assert ds[0]["labels"]["error_dimension"] == "Semantic Error"
    assert ds[0]["images"][0]["marks"][1] == {"kind": "arrow", "coords": [1, 2, 3, 4]}


def test_write_guards(tmp_path):
    write_records(_dataset(), tmp_path, shard_size=2)
    with pytest.raises(RecordError, match="already holds"):
        write_records(_dataset(), tmp_path)
    # Overwrite removes stale shards beyond the new count.
    write_records(_dataset()[:1], tmp_path, overwrite=True)
    assert len(list(tmp_path.glob("part-*.parquet"))) == 1
    assert len(read_records(tmp_path)) == 1
    with pytest.raises(RecordError, match="duplicate"):
        write_records([_critique(1), _critique(1)], tmp_path / "d")
    with pytest.raises(RecordError, match="shard_size"):
        write_records([], tmp_path / "e", shard_size=0)


def test_empty_dataset_round_trips(tmp_path):
    write_records([], tmp_path)
    assert read_records(tmp_path) == []


def test_read_errors(tmp_path):
    with pytest.raises(RecordError, match="no record shards"):
        read_records(tmp_path)
    (tmp_path / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(RecordError, match="cannot read"):
        read_records(tmp_path)


# -------------------------------------------------------------------------------------------
# messages


def test_record_messages_and_back():
    rec = _history(0)
    system, user, assistant = record_messages(rec)
    assert (system.role, user.role, assistant.role) == ("system", "user", "assistant")
    assert user.content[:2] == [ImagePart(rec.images[0]), ImagePart(rec.images[1])]
    assert assistant.text() == rec.target
    fields = {
        f.name: getattr(rec, f.name)
        for f in dataclasses.fields(rec)
        if f.name not in ("system", "user", "images", "target")
    }
    assert record_from_messages([system, user], rec.target, **fields) == rec


def test_record_from_builder_output():
    shot = ImageRef("s/1.png", (PointMark(5, 6),))
    msgs = build_critique_messages(
        "goal", "web", "", shot, "Action: x\n<tool_call>\n{}\n</tool_call>"
    )
    rec = record_from_messages(
        msgs,
        "<think>\nt\n</think>\n<criticism>\nOverall Grading: Good\nExplanation: e\n</criticism>",
        id="r1",
        kind="critique",
        platform="web",
        prompt_version=msgs.prompt_id,
        trajectory_id="t",
        episode_key="e",
        step_index=0,
        split="train",
        labels=Labels("Good"),
    )
    assert rec.images == (shot,) and rec.user[0] == ImageSlot(0)
    assert record_messages(rec)[:2] == list(msgs)
    history = build_history_messages("g", "mac", "p", ImageRef("a"), ImageRef("b"), "s")
    with pytest.raises(RecordError):
        record_from_messages(list(history)[1:], "x", id="r")
    pil = ChatMessage("user", [ImagePart(Image.new("RGB", (4, 4)))])
    with pytest.raises(RecordError, match="materialised"):
        record_from_messages([history[0], pil], "x", id="r")


# -------------------------------------------------------------------------------------------
# ShareGPT


def _corpus(tmp_path):
    root = tmp_path / "corpus"
    (root / "shots").mkdir(parents=True)
    Image.new("RGB", (360, 640), (255, 255, 255)).save(root / "shots" / "a.png")
    # An absolute path outside the corpus, larger than the frame bounds.
    Image.new("RGB", (1280, 720), (0, 128, 0)).save(tmp_path / "b.png")
    hist = dataclasses.replace(
        _history(0), images=(ImageRef("shots/a.png"), ImageRef(str(tmp_path / "b.png")))
    )
    return root, [_critique(0), hist]


def test_sharegpt_shape_and_marked_images(tmp_path):
    root, records = _corpus(tmp_path)
    frames = tmp_path / "frames"
    rows = to_sharegpt(records, root, frames, min_pixels=1024, max_pixels=65_536)
    json.dumps(rows)  # plain JSON
    crit, hist = rows
    assert set(crit) == {"system", "conversations", "images"}
    assert [t["from"] for t in crit["conversations"]] == ["human", "gpt"]
    assert crit["conversations"][0]["value"] == "<image>User Instruction (Goal): task 0"
    assert crit["conversations"][1]["value"] == records[0].target
    assert crit["system"] == records[0].system
    for row in rows:
        assert row["conversations"][0]["value"].count("<image>") == len(row["images"])
    marked = crit["images"][0]
    assert marked.startswith(str(frames)) and marked.endswith(".png")
    img = Image.open(marked).convert("RGB")
    assert img.size[0] * img.size[1] <= 65_536
    colours = dict((c, n) for n, c in img.getcolors(maxcolors=1 << 16))
    assert colours.get((255, 0, 0), 0) > 0  # the X was drawn
    assert colours.get((0, 0, 255), 0) > 0  # and the arrow
    # Same input, same file name (content-derived), not a second copy.
    again = to_sharegpt(records[:1], root, frames, min_pixels=1024, max_pixels=65_536)
    assert again[0]["images"] == crit["images"]
    assert len(list(frames.iterdir())) == 3


def test_sharegpt_clean_images_get_the_canonical_frame_too(tmp_path):
    root, records = _corpus(tmp_path)
    frames = tmp_path / "frames"
    hist = to_sharegpt(records[1:], root, frames, min_pixels=1024, max_pixels=65_536)[0]
    clean = canonical_frame(root / "shots" / "a.png", min_pixels=1024, max_pixels=65_536)
    big = canonical_frame(tmp_path / "b.png", min_pixels=1024, max_pixels=65_536)
    for path, expected in zip(hist["images"], (clean, big), strict=True):
        assert path.startswith(str(frames))  # not the original file
        got = Image.open(path)
        assert got.size == expected.size
        assert got.convert("RGB").tobytes() == expected.convert("RGB").tobytes()
    assert Image.open(hist["images"][1]).size != (1280, 720)  # it was resized, not copied


def test_sharegpt_needs_a_frames_directory(tmp_path):
    root, records = _corpus(tmp_path)
    for record in records:  # clean images need it as much as marked ones
        with pytest.raises(RecordError, match="pass `frames_dir`"):
            to_sharegpt([record], root)
    text_only = _dataset()[-1]
    assert to_sharegpt([text_only], root)[0]["images"] == []
    # The former keyword still works; giving both is an error.
    rows = to_sharegpt(records, root, marked_dir=tmp_path / "m", min_pixels=1024, max_pixels=65_536)
    assert all(p.startswith(str(tmp_path / "m")) for r in rows for p in r["images"])
    with pytest.raises(RecordError, match="frames_dir"):
        to_sharegpt(records, root, tmp_path / "f", marked_dir=tmp_path / "m")


def test_sharegpt_missing_image_is_a_record_error(tmp_path):
    root, records = _corpus(tmp_path)
    missing = dataclasses.replace(records[1], images=(ImageRef("nope.png"), ImageRef("x.png")))
    with pytest.raises(RecordError, match="nope.png"):
        to_sharegpt([missing], root, tmp_path / "frames")


def test_export_frames_equal_training_frames_where_smart_resize_is_not_idempotent(tmp_path):
    # min == max pixels: growing rounds a 100x50 screen up past the budget (192x384 at 65,536),
    # and resizing that again would give 160x352. The export must not resize twice.
    from hivig.records import _FrameSource

    Image.new("RGB", (100, 50), (30, 120, 200)).save(tmp_path / "small.png")
    ref = ImageRef("small.png", (PointMark(500, 500),), "desktop")
    budget = {"min_pixels": 65_536, "max_pixels": 65_536, "factor": 32}
    want = canonical_frame(tmp_path / "small.png", marks=ref.marks, size_class="desktop", **budget)
    source = _FrameSource(tmp_path, 65_536, 65_536, 32)
    for _ in range(2):  # the second time from the cached clean frame
        got = source.frame(ref)
        assert got.size == want.size and got.tobytes() == want.tobytes()


def test_run_provenance_round_trips_and_older_shards_still_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hivig.records import SCHEMA, _to_row

    base = _dataset()[0]
    run = dataclasses.replace(
        base,
        id="run-0",
        provenance=Provenance(
            None, "offline", (), "run", "androidlab", "clock_3", "critic_good_on_root_cause"
        ),
    )
    write_records([base, run], tmp_path / "new")
    got = read_records(tmp_path / "new")
    assert got == [base, run] and got[0].provenance.source == "scalecua"
    # A shard written before the run fields existed reads as ScaleCUA data.
    fields = [
        f
        for f in SCHEMA.field("provenance").type
        if f.name in ("annotator_model", "annotator_kind", "request_hashes")
    ]
    old_schema = pa.schema(
        [f if f.name != "provenance" else pa.field("provenance", pa.struct(fields)) for f in SCHEMA]
    )
    row = _to_row(base)
    row["provenance"] = {
        k: row["provenance"][k] for k in ("annotator_model", "annotator_kind", "request_hashes")
    }
    (tmp_path / "old").mkdir()
    pq.write_table(
        pa.Table.from_pylist([row], schema=old_schema), tmp_path / "old/part-00000.parquet"
    )
    assert read_records(tmp_path / "old") == [base]
