"""The hot-path helpers: fast deflate, strict JSON, the detector's decoded-state cache."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image, ImageDraw

from hivig import jsonio
from hivig.actions import LeftClick, Wait
from hivig.vision import _png, deflate, encode_png
from serve.recurrence_state import Detector
from serve.sessions import SessionState


def _screen_bytes() -> bytes:
    rows = np.tile(np.arange(1344 * 3, dtype=np.uint8) % 7, (96, 1))
    noise = np.random.default_rng(0).integers(0, 256, (32, 1344 * 3), dtype=np.uint8)
    return np.vstack([rows, noise]).tobytes()


@pytest.mark.parametrize("level", [0, 1, 2, 6, 9])
def test_deflate_is_a_zlib_stream_at_every_level(level):
    data = _screen_bytes()
    assert zlib.decompress(deflate(data, level)) == data
    assert zlib.decompress(deflate(memoryview(data), level)) == data


def test_deflate_falls_back_to_zlib_without_isal(monkeypatch):
    data = _screen_bytes()
    monkeypatch.setattr(_png, "isal_zlib", None)
    assert deflate(data, 1) == zlib.compress(data, 1)
    img = Image.frombytes("RGB", (1344, 128), data)
    monkeypatch.undo()
    fast = encode_png(img, 1)
    monkeypatch.setattr(_png, "isal_zlib", None)
    slow = encode_png(img, 1)
    for png in (fast, slow):  # other bytes where isal is installed, the same pixels either way
        assert Image.open(io.BytesIO(png)).tobytes() == data


def test_jsonio_is_compact_utf8_and_strict():
    assert jsonio.dumps({"a": "é\n", 1: [True, None]}) == '{"a":"é\\n","1":[true,null]}'.encode()
    assert jsonio.loads(b'{"x": [1, 2.5]}') == {"x": [1, 2.5]}
    for bad in (b'{"x": NaN}', b'{"x": Infinity}', b'{"x": 1e400}', b'{"x": "\\ud800"}', b"\xff"):
        with pytest.raises(jsonio.JSONDecodeError):
            jsonio.loads(bad)
    with pytest.raises(ValueError):  # what callers catch
        jsonio.loads(b"{")
    assert jsonio.dumps({"x": np.float64(0.5), "n": np.int64(3)}) == b'{"x":0.5,"n":3}'


def _frame_of(seed: int, box: bool) -> Image.Image:
    img = Image.new("RGB", (640, 384), (230, 232, 236))
    d = ImageDraw.Draw(img)
    for row in range(20, 360, 24):
        d.rectangle((20, row, 20 + (row * 7 + seed * 13) % 400, row + 10), fill=(40, 40, 90))
    if box:
        d.rectangle((200, 120, 440, 260), fill=(255, 255, 255), outline=(0, 0, 0))
    return img


def _session() -> SessionState:
    return SessionState(session_id="s1", task="t", platform="ubuntu", screen_w=640, screen_h=384)


def test_detector_cache_gives_what_the_stored_json_gives():
    frames = [_frame_of(0, False), _frame_of(0, True), _frame_of(0, True), _frame_of(1, False)]
    steps = [
        None,
        [LeftClick(coordinate=(500, 500))],
        [LeftClick(coordinate=(500, 500))],
        [Wait(time=1.0)],
    ]
    cached, plain = Detector(), Detector(cache_size=0)
    a, b = _session(), _session()
    saved = []
    for frame, acts in zip(frames, steps, strict=True):
        sa, sb = cached.update(a, frame, acts), plain.update(b, frame, acts)
        assert (sa.change, sa.recurrence) == (sb.change, sb.recurrence)
        assert a.detector == b.detector
        saved.append(a.detector)
    # A session rewound to an earlier document (a forced step) is judged from that document,
    # not from the newer state still in the cache.
    a.detector, b.detector = saved[1], saved[1]
    sa = cached.update(a, frames[3], steps[1])
    sb = plain.update(b, frames[3], steps[1])
    assert (sa.change, sa.recurrence) == (sb.change, sb.recurrence) and a.detector == b.detector
    assert len(plain._cache) == 0 and len(cached._cache) == 1
