"""Bad input never aborts ingest, and nothing is read outside the corpus (issue: robustness)."""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest
from PIL import Image

from data_gen.ingest import IngestConfig, ingest, ingest_complete, sniff_image
from hivig.files import clean_stale_temps, write_atomic
from tests.data_gen.ingest.test_ingest import episode, write_corpus

STEPS = [
    ("Click the 'OK' button", "click(x=0.1, y=0.1)"),
    ("Done", "terminate(status='success', info=None)"),
]
KEY = "internal_web_navigation_1"


def _one_file(root, lines):
    write_corpus(root, {KEY: ("web", "navigation", lines)})
    return root / "annotations" / f"{KEY}.jsonl"


def _reasons(out):
    rows = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    return [r["reason"] for r in rows]


@pytest.mark.parametrize(
    ("where", "escape"),
    [("image", "\\ud800"), ("task", "\\udfff"), ("operation", "\\u0000"), ("image", "\\u0000")],
)
def test_lone_surrogates_and_nul_bytes_are_quarantined(tmp_path, where, escape):
    recs = episode("e/1", "T", STEPS) + episode("e/2", "U", STEPS)
    anno = _one_file(tmp_path / "c", recs)
    lines = anno.read_text().splitlines()
    first = json.loads(lines[0])
    if where == "image":
        first["image"] = first["image"].replace(".png", "X.png")
    elif where == "task":
        first["conversations"][0]["value"] = first["conversations"][0]["value"].replace("T", "TX")
    else:
        first["conversations"][1]["value"] = first["conversations"][1]["value"].replace("OK", "OKX")
    # The escape goes in as JSON text: json.loads turns it into the bad character.
    lines[0] = json.dumps(first).replace("X", escape, 1)
    anno.write_text("\n".join(lines) + "\n")
    res = ingest(tmp_path / "c", tmp_path / "o", progress=False)
    reasons = _reasons(tmp_path / "o")
    assert "bad_characters" in reasons
    assert res.stats["trajectories"] == 1  # the other episode survives
    assert ingest_complete(tmp_path / "o")
    assert not [p for p in (tmp_path / "o").iterdir() if p.name.endswith(".tmp")]


def test_write_atomic_leaves_no_temp_file_on_unencodable_text(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        write_atomic(tmp_path / "x.jsonl", "bad \ud800")
    assert list(tmp_path.iterdir()) == []


def test_utf8_bom_keeps_the_first_trajectory(tmp_path):
    anno = _one_file(tmp_path / "c", episode("e/1", "T", STEPS))
    anno.write_bytes(b"\xef\xbb\xbf" + anno.read_bytes())
    meta = tmp_path / "c" / "meta.json"
    meta.write_bytes(b"\xef\xbb\xbf" + meta.read_bytes())
    res = ingest(tmp_path / "c", tmp_path / "o", progress=False)
    assert res.stats == {"lines": 2, "steps_kept": 2, "trajectories": 1, "dropped": {}}


def test_one_annotation_file_listed_twice_is_read_once(tmp_path):
    _one_file(tmp_path / "c", episode("e/1", "T", STEPS))
    meta_path = tmp_path / "c" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["zz_web_navigation_again"] = dict(meta[KEY])
    meta_path.write_text(json.dumps(meta))
    res = ingest(tmp_path / "c", tmp_path / "o", progress=False)
    assert res.stats == {"lines": 2, "steps_kept": 2, "trajectories": 1, "dropped": {}}
    assert res.report["skipped_entries"] == {
        "zz_web_navigation_again": "duplicate_annotation_entry"
    }


def _image_path(root):
    return root / "data/data_20250612/web/images/e/1/images/0.png"


def test_screenshot_symlink_out_of_the_corpus_is_quarantined(tmp_path):
    _one_file(tmp_path / "c", episode("e/1", "T", STEPS))
    outside = tmp_path / "secret.png"
    Image.new("RGB", (64, 48), "white").save(outside)
    shot = _image_path(tmp_path / "c")
    shot.unlink()
    shot.symlink_to(outside)
    ingest(tmp_path / "c", tmp_path / "o", progress=False)
    assert _reasons(tmp_path / "o") == ["image_outside_corpus", "after_bad_step"]


@pytest.mark.timeout(30)
def test_fifo_and_device_screenshots_neither_hang_nor_exhaust_memory(tmp_path):
    _one_file(tmp_path / "c", episode("e/1", "T", STEPS))
    shot = _image_path(tmp_path / "c")
    shot.unlink()
    os.mkfifo(shot)  # opening it for reading would block until a writer comes
    assert sniff_image(shot, "header")[0] == "image_not_a_file"
    assert sniff_image("/dev/zero", "full")[0] == "image_not_a_file"
    ingest(tmp_path / "c", tmp_path / "o", progress=False)
    assert _reasons(tmp_path / "o")[0] == "image_not_a_file"


def _png(width: int, height: int, body: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def test_decompression_bomb_is_refused_from_its_header(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png(40000, 40000, zlib.compress(b"\0" * 1000)))
    assert sniff_image(bomb, "header")[0] == "corrupt_image"
    assert "bomb" in sniff_image(bomb, "header")[1]


def test_corrupt_body_is_caught_by_full_verification(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(_png(64, 48, b"not zlib at all" * 10))
    assert sniff_image(bad, "header") == (64, 48)  # the header check cannot see it
    assert sniff_image(bad, "full")[0] == "corrupt_image"


def test_a_killed_write_is_not_taken_as_complete(tmp_path, monkeypatch):
    _one_file(tmp_path / "c", episode("e/1", "T", STEPS))
    ingest(tmp_path / "c", tmp_path / "o", progress=False)
    assert ingest_complete(tmp_path / "o")
    import data_gen.ingest as mod

    calls = []

    def dying(path, text):
        calls.append(path.name)
        if path.name == "quarantine.jsonl":
            raise KeyboardInterrupt  # the kill, after trajectories.jsonl was replaced
        write_atomic(path, text)

    monkeypatch.setattr(mod, "write_atomic", dying)
    with pytest.raises(KeyboardInterrupt):
        ingest(tmp_path / "c", tmp_path / "o", progress=False)
    assert calls[:2] == ["trajectories.jsonl", "quarantine.jsonl"]
    assert not ingest_complete(tmp_path / "o")
    (tmp_path / "o" / "stats.json").unlink()
    assert not ingest_complete(tmp_path / "o")


def test_temp_names_are_unique_and_stale_ones_are_cleaned(tmp_path):
    from hivig.files import temp_name

    a, b = temp_name(tmp_path / "t.jsonl"), temp_name(tmp_path / "t.jsonl")
    assert a != b
    dead = tmp_path / a.name.replace(f"-{os.getpid()}-", "-999999999-")
    dead.write_text("half")
    old = tmp_path / ".t.jsonl.tmp"  # fixed name of an earlier version
    old.write_text("half")
    alive = tmp_path / b.name
    alive.write_text("being written")
    assert clean_stale_temps(tmp_path) == sorted([dead.name, old.name])
    assert alive.exists()


def test_ingest_of_a_missing_corpus_names_it(tmp_path):
    from data_gen.ingest import IngestError

    with pytest.raises(IngestError, match="no meta.json"):
        ingest(tmp_path / "nowhere", tmp_path / "o", IngestConfig(), progress=False)
