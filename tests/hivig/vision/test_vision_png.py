"""``encode_png``: lossless for any size and input mode, deterministic, a valid PNG."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from hivig.vision import encode_png


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (200, 3), (3, 4000), (768, 1344)])
@pytest.mark.parametrize("level", [0, 1, 6, 9])
def test_round_trip_is_lossless(shape, level):
    pixels = np.random.default_rng(shape[0] * 31 + level).integers(
        0, 256, (*shape, 3), dtype=np.uint8
    )
    data = encode_png(Image.fromarray(pixels), level)
    decoded = Image.open(io.BytesIO(data))
    decoded.load()  # Pillow checks every chunk's CRC and zlib's checksum here
    assert decoded.format == "PNG" and decoded.mode == "RGB"
    assert np.array_equal(np.asarray(decoded), pixels)


@pytest.mark.parametrize("mode", ["RGBA", "L", "P", "1"])
def test_other_modes_are_encoded_as_their_rgb_pixels(mode):
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (9, 11, 3), dtype=np.uint8))
    img = img.convert(mode)
    got = np.asarray(Image.open(io.BytesIO(encode_png(img))))
    assert np.array_equal(got, np.asarray(img.convert("RGB")))


def test_equal_pixels_give_equal_bytes_and_carry_no_metadata():
    a = Image.new("RGB", (40, 30), (10, 200, 30))
    b = Image.frombytes("RGB", (40, 30), a.tobytes())
    b.info["dpi"] = (300, 300)
    assert encode_png(a) == encode_png(b)
    assert b"tEXt" not in encode_png(b) and b"pHYs" not in encode_png(b)


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="compress_level"):
        encode_png(Image.new("RGB", (2, 2)), 10)
