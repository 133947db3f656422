"""Canonical frame: smart_resize grids, decoding of every input kind, resizing, materialise, PNG."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize

from hivig.messages import ChatMessage, ImagePart, ImageRef, PointMark, TextPart
from hivig.vision import (
    ImageError,
    canonical_frame,
    encode_png,
    load_image,
    materialise,
    smart_resize,
)
from hivig.vision import _frame as vision_frame
from hivig.vision._frame import resize_rgb

MAX_PX = 1_048_576
MIN_PX = 65_536


def _screenshot(width: int = 1920, height: int = 1080) -> Image.Image:
    """Flat panels, text-like stripes and a few saturated buttons (deterministic)."""
    img = Image.new("RGB", (width, height), (240, 240, 240))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, width, height // 20), fill=(30, 30, 35))
    for i, y in enumerate(range(height // 10, height - 40, 19)):
        draw.text((width // 8, y), f"Settings item {i} - display network", fill=(10, 10, 10))
    for k in range(6):
        x = width // 2 + 60 * k
        draw.rectangle((x, height // 3, x + 48, height // 3 + 24), fill=(40 * k, 120, 255 - 40 * k))
    return img


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# smart_resize


def test_smart_resize_1920x1080_default_frame():
    h, w = smart_resize(1080, 1920, factor=32, min_pixels=MIN_PX, max_pixels=MAX_PX)
    assert (w, h) == (1344, 768)
    # Qwen3-VL ViT grid (t, h/16, w/16) is (1, 48, 84) and 48·84 / 4 = 1,008 visual tokens.
    assert (1, h // 16, w // 16) == (1, 48, 84)
    assert h * w // (32 * 32) == 1008


def test_smart_resize_model_default_grid():
    h, w = smart_resize(1080, 1920, factor=32, min_pixels=MIN_PX, max_pixels=16_384 * 1024)
    assert (1, h // 16, w // 16) == (1, 68, 120)


# Tokens for common screens at caps of 16,384 / 4,096 / 2,048 / 1,280 /
# 1,024 tokens (max_pixels = N · 1024).
TABLE_6_4 = {
    (1280, 720): (880, 880, 880, 880, 880),
    (1440, 900): (1260, 1260, 1260, 1260, 1000),
    (1920, 1080): (2040, 2040, 2040, 1222, 1008),
    (2560, 1440): (3600, 3600, 1980, 1222, 1008),
    (2880, 1800): (5040, 4000, 1995, 1260, 1000),
    (3840, 2160): (8160, 4080, 1980, 1222, 1008),
    (1080, 2400): (2550, 2550, 2010, 1272, 987),
}
CAPS = (16_384, 4_096, 2_048, 1_280, 1_024)


@pytest.mark.parametrize("screen", sorted(TABLE_6_4))
def test_smart_resize_token_table(screen):
    width, height = screen
    for cap, tokens in zip(CAPS, TABLE_6_4[screen], strict=True):
        h, w = smart_resize(height, width, 32, MIN_PX, cap * 1024)
        assert h % 32 == 0 and w % 32 == 0
        assert h * w // 1024 == tokens, (screen, cap)


@pytest.mark.parametrize(
    ("screen", "cap", "frame"),
    [
        ((1920, 1080), 16_384, (1920, 1088)),
        ((1920, 1080), 1_280, (1504, 832)),
        ((1440, 900), 1_024, (1280, 800)),
        ((2880, 1800), 4_096, (2560, 1600)),
        ((1080, 2400), 2_048, (960, 2144)),
    ],
)
def test_smart_resize_table_frames(screen, cap, frame):
    h, w = smart_resize(screen[1], screen[0], 32, MIN_PX, cap * 1024)
    assert (w, h) == frame


SIDES = (33, 100, 480, 719, 720, 1000, 1080, 1366, 2400, 3000, 5000)
BUDGETS = ((MIN_PX, MAX_PX), (32 * 32, 16_384 * 1024), (MIN_PX, 262_144), (4 * 1024, 4 * 1024))


def test_smart_resize_matches_transformers():
    # Every pair with both sides >= factor / 2 (where transformers never rounds a side to 0).
    checked = 0
    for (height, width), (lo, hi) in itertools.product(itertools.product(SIDES, SIDES), BUDGETS):
        assert smart_resize(height, width, 32, lo, hi) == hf_smart_resize(
            height, width, factor=32, min_pixels=lo, max_pixels=hi
        ), (height, width, lo, hi)
        checked += 1
    assert checked == len(SIDES) ** 2 * len(BUDGETS)


def test_smart_resize_keeps_tiny_sides_at_least_one_factor():
    # Deliberate deviation ("at least factor"): transformers rounds a
    # 10 px side to 0 and then shrinks the long side too.
    ours = smart_resize(10, 1900, 32, 32 * 32, MAX_PX)
    assert ours == (32, 1888)
    assert hf_smart_resize(10, 1900, factor=32, min_pixels=32 * 32, max_pixels=MAX_PX) != ours


@pytest.mark.parametrize(
    ("height", "width", "message"),
    [
        (0, 100, "positive"),
        (100, -1, "positive"),
        (10, 2000, "aspect ratio"),  # exactly 200
        (2000, 10, "aspect ratio"),
        (5, 5000, "aspect ratio"),
    ],
)
def test_smart_resize_rejects_bad_sizes(height, width, message):
    with pytest.raises(ValueError, match=message):
        smart_resize(height, width, 32, MIN_PX, MAX_PX)


def test_smart_resize_rejects_bad_budget():
    with pytest.raises(ValueError, match="exceeds"):
        smart_resize(100, 100, 32, 2000, 1000)
    with pytest.raises(ValueError, match="positive"):
        smart_resize(100, 100, 0, MIN_PX, MAX_PX)


def test_smart_resize_just_below_ratio_limit_is_accepted():
    h, w = smart_resize(10, 1990, 32, MIN_PX, MAX_PX)
    assert h % 32 == 0 and w % 32 == 0


# --------------------------------------------------------------------------------------------
# load_image


def test_load_image_from_path_bytes_and_pil_agree(tmp_path):
    src = _screenshot(320, 200)
    path = tmp_path / "s.png"
    src.save(path)
    from_path = load_image(path)
    from_str = load_image(str(path))
    from_bytes = load_image(path.read_bytes())
    from_pil = load_image(src)
    for img in (from_path, from_str, from_bytes, from_pil):
        assert img.mode == "RGB" and img.size == (320, 200)
        assert img.tobytes() == src.tobytes()
        assert img.info == {}
    assert from_pil is not src


def test_load_image_flattens_alpha_onto_white():
    rgba = Image.new("RGBA", (4, 2), (255, 0, 0, 0))
    rgba.putpixel((1, 0), (0, 0, 255, 255))
    rgba.putpixel((2, 0), (0, 0, 0, 128))
    img = load_image(_png(rgba))
    assert img.mode == "RGB"
    assert img.getpixel((0, 0)) == (255, 255, 255)  # transparent red vanishes
    assert img.getpixel((1, 0)) == (0, 0, 255)
    assert img.getpixel((2, 0)) in {(127, 127, 127), (128, 128, 128)}


def test_load_image_palette_with_transparency():
    pal = Image.new("P", (3, 1), 0)
    pal.putpalette([0, 255, 0, 10, 20, 30] + [0] * (256 * 3 - 6))
    pal.putpixel((1, 0), 1)
    buf = io.BytesIO()
    pal.save(buf, format="PNG", transparency=0)
    img = load_image(buf.getvalue())
    assert img.getpixel((0, 0)) == (255, 255, 255)
    assert img.getpixel((1, 0)) == (10, 20, 30)


@pytest.mark.parametrize(
    ("mode", "value", "expected"),
    [("L", 77, (77, 77, 77)), ("CMYK", (0, 255, 255, 0), (255, 0, 0)), ("1", 1, (255, 255, 255))],
)
def test_load_image_converts_modes(mode, value, expected):
    img = load_image(Image.new(mode, (3, 3), value))
    assert img.mode == "RGB"
    assert img.getpixel((1, 1)) == expected


def test_load_image_cmyk_jpeg_bytes():
    buf = io.BytesIO()
    Image.new("CMYK", (16, 16), (0, 0, 0, 0)).save(buf, format="JPEG", quality=95)
    img = load_image(buf.getvalue())
    assert img.mode == "RGB"
    assert all(c > 240 for c in img.getpixel((8, 8)))


def test_load_image_16bit_grey_is_scaled_not_clipped():
    img = load_image(Image.new("I;16", (2, 2), 32768))
    assert img.getpixel((0, 0)) == (128, 128, 128)


def test_load_image_ignores_exif_orientation():
    src = Image.new("RGB", (40, 20), (0, 0, 0))
    src.putpixel((0, 0), (255, 255, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° CW" — must not be applied
    buf = io.BytesIO()
    src.save(buf, format="PNG", exif=exif)
    img = load_image(buf.getvalue())
    assert img.size == (40, 20)
    assert img.info == {} and "exif" not in img.info


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "empty"),
        (b"definitely not an image", "corrupt"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "corrupt"),
    ],
)
def test_load_image_bad_bytes(payload, reason):
    with pytest.raises(ImageError) as info:
        load_image(payload)
    assert info.value.reason == reason


def test_load_image_truncated_png():
    data = _png(_screenshot(200, 120))
    with pytest.raises(ImageError) as info:
        load_image(data[: len(data) // 2])
    assert info.value.reason == "truncated"
    assert isinstance(info.value, ValueError)


def test_load_image_missing_and_empty_files(tmp_path):
    with pytest.raises(ImageError) as info:
        load_image(tmp_path / "nope.png")
    assert info.value.reason == "not_found"
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError) as info:
        load_image(empty)
    assert info.value.reason == "empty"


def test_load_image_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "locked.png"
    _screenshot(32, 32).save(path)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Image, "open", denied)
    with pytest.raises(ImageError) as info:
        load_image(path)
    assert info.value.reason == "unreadable"


def test_load_image_wrong_type():
    with pytest.raises(ImageError) as info:
        load_image(12345)  # type: ignore[arg-type]
    assert info.value.reason == "bad_type"


# --------------------------------------------------------------------------------------------
# canonical_frame


def test_canonical_frame_size_and_inputs_agree(tmp_path):
    src = _screenshot()
    path = tmp_path / "s.png"
    src.save(path)
    kwargs = dict(min_pixels=MIN_PX, max_pixels=MAX_PX, marks=(PointMark(500, 500),))
    frames = [canonical_frame(x, **kwargs) for x in (path, path.read_bytes(), src)]
    assert all(f.size == (1344, 768) and f.mode == "RGB" for f in frames)
    assert frames[0].tobytes() == frames[1].tobytes() == frames[2].tobytes()
    assert src.tobytes() == _screenshot().tobytes()  # the input was not drawn on


def test_canonical_frame_already_canonical_is_a_copy():
    src = _screenshot(1344, 768)
    frame = canonical_frame(src, min_pixels=MIN_PX, max_pixels=MAX_PX)
    assert frame is not src
    assert frame.tobytes() == src.tobytes()


def test_canonical_frame_upscales_small_images():
    frame = canonical_frame(Image.new("RGB", (100, 50)), min_pixels=MIN_PX, max_pixels=MAX_PX)
    assert frame.width * frame.height >= MIN_PX
    assert frame.width % 32 == 0 and frame.height % 32 == 0


def test_canonical_frame_rejects_extreme_aspect_ratio():
    with pytest.raises(ValueError, match="aspect ratio"):
        canonical_frame(Image.new("RGB", (4000, 10)), min_pixels=MIN_PX, max_pixels=MAX_PX)


def test_resize_is_antialiased_bicubic():
    src = _screenshot()
    ours = np.asarray(resize_rgb(src, 1344, 768)).astype(int)
    pil_bicubic = np.asarray(src.resize((1344, 768), Image.Resampling.BICUBIC)).astype(int)
    nearest = np.asarray(src.resize((1344, 768), Image.Resampling.NEAREST)).astype(int)
    assert np.abs(ours - pil_bicubic).max() <= 2
    # Negative control: an aliasing filter is far from ours on text.
    assert np.abs(ours - nearest).max() > 50


def test_resize_zero_copy_and_copying_routes_agree(monkeypatch):
    src = _screenshot()
    fast = resize_rgb(src, 1344, 768)

    def no_arrow(_img):
        raise TypeError("no Arrow export")

    monkeypatch.setattr(vision_frame.pa, "array", no_arrow)
    slow = resize_rgb(src, 1344, 768)
    assert fast.tobytes() == slow.tobytes()


def test_resize_large_image_takes_the_copying_route():
    # 3840×2160 spans several Pillow memory blocks, so the Arrow export refuses it.
    frame = canonical_frame(_screenshot(3840, 2160), min_pixels=MIN_PX, max_pixels=MAX_PX)
    assert frame.size == (1344, 768)
    ref = np.asarray(_screenshot(3840, 2160).resize((1344, 768), Image.Resampling.BICUBIC))
    assert np.abs(np.asarray(frame).astype(int) - ref.astype(int)).max() <= 2


def test_resize_keeps_flat_colours_exact():
    frame = resize_rgb(Image.new("RGB", (1920, 1080), (12, 200, 77)), 1344, 768)
    assert frame.getcolors() == [(1344 * 768, (12, 200, 77))]


# --------------------------------------------------------------------------------------------
# materialise


def test_materialise_replaces_refs_and_keeps_the_rest(tmp_path):
    (tmp_path / "shots").mkdir()
    _screenshot().save(tmp_path / "shots" / "a.png")
    absolute = tmp_path / "b.png"
    _screenshot(1080, 2400).save(absolute)
    ready = Image.new("RGB", (64, 64))
    messages = [
        ChatMessage("system", [TextPart("be a critic")]),
        ChatMessage(
            "user",
            [
                TextPart("before"),
                ImagePart(ImageRef("shots/a.png")),
                ImagePart(ImageRef("shots/a.png", marks=(PointMark(500, 500),))),
                ImagePart(ImageRef(str(absolute), size_class="mobile")),
                ImagePart(ready),
                TextPart("after"),
            ],
        ),
    ]
    out = materialise(messages, tmp_path, min_pixels=MIN_PX, max_pixels=MAX_PX)
    assert [m.role for m in out] == ["system", "user"]
    assert out[0].content == messages[0].content
    parts = out[1].content
    assert [p.type for p in parts] == ["text", "image", "image", "image", "image", "text"]
    plain, marked, phone, kept = (p.image for p in parts[1:5])
    assert plain.size == marked.size == (1344, 768)
    assert plain.tobytes() != marked.tobytes()  # marks drawn on the second use only
    assert marked.getpixel((672 + 10, 384 + 10)) == (255, 0, 0)
    assert phone.size == (672, 1504)
    assert kept is ready
    assert isinstance(messages[1].content[1].image, ImageRef)  # input untouched


def test_materialise_missing_image_is_a_typed_error(tmp_path):
    messages = [ChatMessage("user", [ImagePart(ImageRef("missing.png"))])]
    with pytest.raises(ImageError) as info:
        materialise(messages, tmp_path, min_pixels=MIN_PX, max_pixels=MAX_PX)
    assert info.value.reason == "not_found"


# --------------------------------------------------------------------------------------------
# encode_png


def test_encode_png_is_deterministic_and_lossless():
    frame = canonical_frame(_screenshot(), min_pixels=MIN_PX, max_pixels=MAX_PX)
    tagged = frame.copy()
    tagged.info = {"dpi": (300, 300), "Software": "x", "exif": b"Exif\x00\x00"}
    data = encode_png(frame)
    assert data == encode_png(frame) == encode_png(tagged)
    assert data.startswith(b"\x89PNG")
    assert Image.open(io.BytesIO(data)).convert("RGB").tobytes() == frame.tobytes()
    assert b"tEXt" not in data and b"pHYs" not in data and b"eXIf" not in data


def test_encode_png_differs_for_different_pixels():
    a = Image.new("RGB", (8, 8), (0, 0, 0))
    b = a.copy()
    b.putpixel((3, 3), (0, 0, 1))
    assert encode_png(a) != encode_png(b)


@settings(max_examples=200, deadline=None)
@given(
    # From 17 px: transformers rounds a side <= factor / 2 to 0 (our deliberate deviation).
    height=st.integers(17, 8000),
    width=st.integers(17, 8000),
    # At least 4× the minimum: growing rounds up, so with min ≈ max an upscaled frame can exceed
    # max_pixels (transformers behaves the same; see the smart_resize docstring).
    cap_tokens=st.integers(256, 16_384),
)
def test_smart_resize_matches_transformers_property(height, width, cap_tokens):
    assume(max(height, width) / min(height, width) < 200)
    max_pixels = cap_tokens * 1024
    ours = smart_resize(height, width, 32, MIN_PX, max_pixels)
    assert ours == hf_smart_resize(
        height, width, factor=32, min_pixels=MIN_PX, max_pixels=max_pixels
    )
    h, w = ours
    assert h % 32 == 0 and w % 32 == 0 and MIN_PX <= h * w <= max_pixels


def test_frame_cache_bounds_by_count_and_memory_and_prepares_once():
    from hivig.vision import FrameCache, frame_nbytes

    frames = {k: Image.new("RGB", (8, 8), (k, 0, 0)) for k in range(4)}
    calls = []

    def prepare(k):
        calls.append(k)
        return frames[k]

    by_count = FrameCache(max_items=2)
    for k in (0, 1, 0, 2):  # 0 is used again, so 1 is the least recent when 2 arrives
        by_count.get(k, lambda k=k: prepare(k))
    assert calls == [0, 1, 2] and 0 in by_count and 1 not in by_count and len(by_count) == 2
    assert by_count.counts == {"frames_prepared": 3, "frames_evicted": 1}
    by_count.put(3, frames[3])  # prepared elsewhere (the gateway's upload path)
    assert 3 in by_count and by_count.get(3, lambda: pytest.fail("stored")) is frames[3]
    by_memory = FrameCache(max_bytes=2 * frame_nbytes(frames[0]))
    for k in range(3):
        by_memory.put(k, frames[k])
    assert len(by_memory) == 2 and 0 not in by_memory
