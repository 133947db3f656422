"""ShareGPT frames: the same pixels as the canonical frame, one decode per screenshot, the
configured factor."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image, ImageChops

import hivig.records
from hivig.messages import ImageRef, PointMark
from hivig.records import _frame_png, _FrameSource
from hivig.vision import canonical_frame


@pytest.fixture
def screen(tmp_path) -> Path:
    img = Image.effect_noise((1000, 700), 40).convert("RGB")
    path = tmp_path / "s.png"
    img.save(path)
    return path


def test_frames_match_canonical_frame_and_decode_once(screen, tmp_path, monkeypatch):
    source = _FrameSource(tmp_path, 65_536, 400_000, 32)
    refs = [
        ImageRef("s.png"),
        ImageRef("s.png", (PointMark(500, 500),)),
        ImageRef("s.png", (PointMark(10, 20),)),
    ]
    (tmp_path / "f").mkdir()
    decodes = []
    real = hivig.records.canonical_frame

    def counting(image, **kw):
        decodes.append(isinstance(image, Path))
        return real(image, **kw)

    monkeypatch.setattr(hivig.records, "canonical_frame", counting)
    for ref in refs:
        out = Image.open(_frame_png(ref, tmp_path / "f", source)).convert("RGB")
        want = canonical_frame(screen, min_pixels=65_536, max_pixels=400_000, marks=ref.marks)
        assert ImageChops.difference(out, want).getbbox() is None
    assert sum(decodes) == 1  # one file decode for three mark sets


def test_frames_honour_the_factor(screen, tmp_path):
    (tmp_path / "f").mkdir()
    a = _frame_png(ImageRef("s.png"), tmp_path / "f", _FrameSource(tmp_path, 65_536, 400_000, 32))
    b = _frame_png(ImageRef("s.png"), tmp_path / "f", _FrameSource(tmp_path, 65_536, 400_000, 28))
    assert a != b
    assert all(v % 28 == 0 for v in Image.open(b).size)
    assert all(v % 32 == 0 for v in Image.open(a).size)
