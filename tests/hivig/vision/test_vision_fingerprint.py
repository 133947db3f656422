"""Screen fingerprints: exact and perceptual hashes, volatile-region masks, thumbnails."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from hivig.vision import (
    apply_masks,
    array_fingerprint,
    canonical_frame,
    dhash_array,
    exact_fingerprint,
    grid_box_px,
    hamming,
    mask_array,
    perceptual_hash,
    screen_thumbnail,
)

MIN_PX = 65_536
MAX_PX = 1_048_576
# The Windows-style taskbar clock region on the 0–1000 grid (bottom-right corner).
CLOCK = (930, 955, 1000, 1000)


def _desktop(clock: str, dialog: bool = False) -> Image.Image:
    """A 1920×1080 desktop with a taskbar clock; optionally an opened dialog (a real change)."""
    img = Image.new("RGB", (1920, 1080), (0, 90, 160))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=16)
    draw.rectangle((0, 1032, 1920, 1080), fill=(25, 25, 30))
    for i in range(8):
        draw.rectangle((20 + 60 * i, 1038, 60 + 60 * i, 1074), fill=(200, 200, 60 + 20 * i))
    for i in range(6):
        draw.rectangle((40, 40 + 110 * i, 110, 110 + 110 * i), fill=(240, 240, 240))
        draw.text((40, 115 + 110 * i), f"File {i}", fill=(255, 255, 255), font=font)
    draw.text((1810, 1046), clock, fill=(255, 255, 255), font=font)
    if dialog:
        draw.rectangle((560, 300, 1360, 780), fill=(245, 245, 245), outline=(0, 0, 0))
        draw.rectangle((560, 300, 1360, 340), fill=(60, 60, 60))
        draw.text((600, 400), "Save changes before closing?", fill=(0, 0, 0), font=font)
    return canonical_frame(img, min_pixels=MIN_PX, max_pixels=MAX_PX)


def test_exact_fingerprint_equal_for_equal_pixels():
    a, b = _desktop("12:01"), _desktop("12:01")
    assert a is not b
    assert exact_fingerprint(a) == exact_fingerprint(b)
    assert len(exact_fingerprint(a)) == 64


def test_masked_clock_change_keeps_both_fingerprints():
    before, after = _desktop("12:01"), _desktop("12:02")
    # Without the mask the clock tick is a change (control).
    assert exact_fingerprint(before) != exact_fingerprint(after)
    assert exact_fingerprint(before, [CLOCK]) == exact_fingerprint(after, [CLOCK])
    assert perceptual_hash(before, [CLOCK]) == perceptual_hash(after, [CLOCK])
    assert perceptual_hash(before, [CLOCK], hash_size=16) == perceptual_hash(
        after, [CLOCK], hash_size=16
    )


def test_real_change_is_detected_despite_masks():
    before, after = _desktop("12:01"), _desktop("12:02", dialog=True)
    assert exact_fingerprint(before, [CLOCK]) != exact_fingerprint(after, [CLOCK])
    # Above the "unchanged" threshold of 2 of 64 bits (hivig.recurrence.DetectorConfig).
    assert hamming(perceptual_hash(before, [CLOCK]), perceptual_hash(after, [CLOCK])) > 2


def test_perceptual_hash_tolerates_resampling_noise():
    frame = _desktop("12:01")
    noisy = frame.resize((1343, 767), Image.Resampling.BILINEAR).resize((1344, 768))
    assert exact_fingerprint(noisy) != exact_fingerprint(frame)
    assert hamming(perceptual_hash(noisy), perceptual_hash(frame)) <= 2


def test_perceptual_hash_width_and_bit_order():
    frame = _desktop("12:01")
    assert 0 <= perceptual_hash(frame) < 2**64
    assert 0 <= perceptual_hash(frame, hash_size=16) < 2**256
    # A left-to-right darkening ramp sets every bit (each pixel brighter than its right neighbour).
    ramp = Image.new("L", (90, 80))
    ramp.putdata([255 - 2 * x for _y in range(80) for x in range(90)])
    assert perceptual_hash(ramp) == 2**64 - 1
    assert perceptual_hash(ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT)) == 0
    with pytest.raises(ValueError, match="hash_size"):
        perceptual_hash(frame, hash_size=1)


def test_apply_masks_covers_the_box_and_nothing_else():
    img = Image.new("RGB", (100, 50), (200, 200, 200))
    masked = apply_masks(img, [(100, 200, 305, 400)])
    # Grid 100..305 → pixels 10..31 (rounded outwards), 200..400 → 10..20.
    assert masked.getpixel((10, 10)) == (0, 0, 0)
    assert masked.getpixel((30, 19)) == (0, 0, 0)
    assert masked.getpixel((9, 10)) == (200, 200, 200)
    assert masked.getpixel((31, 10)) == (200, 200, 200)
    assert masked.getpixel((10, 20)) == (200, 200, 200)
    assert img.getpixel((10, 10)) == (200, 200, 200)  # input untouched


@pytest.mark.parametrize("box", [(0, 0, 0, 10), (10, 10, 5, 20), (0, 0, 1001, 10), (-1, 0, 5, 5)])
def test_bad_masks_raise(box):
    img = Image.new("RGB", (10, 10))
    with pytest.raises(ValueError, match="mask"):
        exact_fingerprint(img, [box])
    with pytest.raises(ValueError, match="mask"):
        perceptual_hash(img, [box])


def test_exact_fingerprint_includes_the_size():
    # Same bytes, different shape: 2×1 vs 1×2 of the same pixels.
    a = Image.new("RGB", (2, 1), (1, 2, 3))
    b = Image.new("RGB", (1, 2), (1, 2, 3))
    assert a.tobytes() == b.tobytes()
    assert exact_fingerprint(a) != exact_fingerprint(b)


def test_array_fingerprint_is_the_exact_fingerprint_of_the_same_pixels():
    frame = _desktop("12:01")
    pixels = np.asarray(frame)
    assert array_fingerprint(pixels) == exact_fingerprint(frame)
    # A view with strides (a crop) hashes its pixels, not the buffer behind it.
    crop = pixels[10:50, 20:90]
    assert array_fingerprint(crop) == exact_fingerprint(frame.crop((20, 10, 90, 50)))
    with pytest.raises(ValueError, match="uint8"):
        array_fingerprint(pixels[..., 0])


def test_hamming():
    assert hamming(0b1011, 0b0001) == 2
    assert hamming(0, 0) == 0
    assert hamming(2**64 - 1, 0) == 64
    with pytest.raises(ValueError):
        hamming(-1, 3)


def test_dhash_array_matches_perceptual_hash():
    frame = _desktop("12:01")
    grey = np.asarray(frame.convert("L"))
    assert dhash_array(grey) == perceptual_hash(frame)
    assert dhash_array(grey, hash_size=16) == perceptual_hash(frame, hash_size=16)
    # Odd hash sizes pack their bits without padding.
    assert 0 <= dhash_array(grey, hash_size=3) < 2**9
    assert dhash_array(grey, hash_size=3) == perceptual_hash(frame, hash_size=3)
    with pytest.raises(ValueError, match="hash_size"):
        dhash_array(grey, hash_size=1)
    with pytest.raises(ValueError, match="2-D uint8"):
        dhash_array(np.zeros((4, 4, 3), dtype=np.uint8))


def test_screen_thumbnail_reduces_by_an_integer_factor():
    img = Image.new("RGB", (1920, 1080), (10, 20, 30))
    img.paste((250, 250, 250), (0, 0, 4, 4))  # one 4×4 block averages to itself
    thumb, factor = screen_thumbnail(img, long_side=480)
    assert factor == 4 and thumb.size == (480, 270) and thumb.mode == "RGB"
    assert thumb.getpixel((0, 0)) == (250, 250, 250)
    assert thumb.getpixel((1, 0)) == (10, 20, 30)
    assert screen_thumbnail(img, long_side=500)[1] == 4  # ceil(1920 / 500)
    small, f1 = screen_thumbnail(Image.new("L", (300, 200)), long_side=480)
    assert f1 == 1 and small.size == (300, 200) and small.mode == "RGB"
    rgba, _ = screen_thumbnail(Image.new("RGBA", (960, 540)), long_side=480)
    assert rgba.mode == "RGB" and rgba.size == (480, 270)
    with pytest.raises(ValueError, match="long_side"):
        screen_thumbnail(img, long_side=8)


def test_mask_array_matches_apply_masks():
    box = (100, 200, 305, 400)
    assert grid_box_px(box, 100, 50) == (10, 10, 31, 20)
    mask = mask_array([box], 100, 50)
    assert mask.shape == (50, 100) and mask.dtype == bool
    painted = np.asarray(apply_masks(Image.new("L", (100, 50), 255), [box])) == 0
    assert np.array_equal(mask, painted)
    assert not mask_array([], 10, 10).any()
    with pytest.raises(ValueError, match="mask"):
        mask_array([(5, 5, 5, 6)], 10, 10)
