"""``BandedPng`` and ``marked_rows``: a marked copy's PNG from the clean frame's bands is exact."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from hivig.messages import ArrowMark, PointMark
from hivig.vision import BandedPng, draw_marks, marked_rows
from hivig.vision._png import adler32_combine


def _decoded(png: bytes) -> np.ndarray:
    img = Image.open(io.BytesIO(png))
    img.load()
    assert img.format == "PNG" and img.mode == "RGB"
    return np.asarray(img)


def _idat_stream(png: bytes) -> bytes:
    """The concatenated IDAT data, every chunk's CRC checked on the way."""
    out, at = b"", 8
    while at < len(png):
        (n,) = struct.unpack(">I", png[at : at + 4])
        body = png[at + 4 : at + 8 + n]
        assert zlib.crc32(body) == struct.unpack(">I", png[at + 8 + n : at + 12 + n])[0]
        if body[:4] == b"IDAT":
            out += body[4:]
        at += 12 + n
    return out


def _screen(h: int, w: int, seed: int) -> np.ndarray:
    # Rows that repeat (as screens do) with noise bands: both compress differently.
    rng = np.random.default_rng(seed)
    pixels = np.repeat(rng.integers(0, 256, (1, w, 3), dtype=np.uint8), h, axis=0)
    pixels[h // 3 : h // 2] = rng.integers(0, 256, (h // 2 - h // 3, w, 3), dtype=np.uint8)
    return pixels


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (63, 5), (64, 5), (65, 5), (768, 1344)])
@pytest.mark.parametrize("level", [0, 1, 6])
def test_the_frame_png_is_lossless_and_one_valid_zlib_stream(shape, level):
    pixels = _screen(*shape, seed=shape[0] + level)
    png = BandedPng.encode(Image.fromarray(pixels), level).png()
    assert np.array_equal(_decoded(png), pixels)
    # zlib checks the combined Adler-32 at the end of the stream (Pillow may stop before it).
    raw = zlib.decompress(_idat_stream(png))
    assert len(raw) == shape[0] * (3 * shape[1] + 1)


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 200),
    w=st.integers(1, 40),
    band=st.integers(1, 70),
    data=st.data(),
)
def test_a_patched_copy_decodes_to_the_copy(h, w, band, data):
    clean = _screen(h, w, seed=h * w)
    banded = BandedPng.encode(Image.fromarray(clean), 1, band_rows=band)
    top = data.draw(st.integers(0, h))
    bottom = data.draw(st.integers(top, h))
    copy = clean.copy()
    copy[top:bottom] = 255 - copy[top:bottom]
    png = banded.patched(Image.fromarray(copy), top, bottom)
    assert np.array_equal(_decoded(png), copy)
    zlib.decompress(_idat_stream(png))  # the Adler-32 of the spliced stream is right


def test_only_the_touched_bands_change():
    clean = _screen(256, 30, seed=3)
    banded = BandedPng.encode(Image.fromarray(clean), 1, band_rows=64)
    copy = clean.copy()
    copy[70:80] = 0
    patched = BandedPng.encode(Image.fromarray(copy), 1, band_rows=64)
    # Band 1 (rows 64-127) changed; the "Up" filter of row 80 reads row 79, still band 1.
    same = [a.idat == b.idat for a, b in zip(banded.bands, patched.bands, strict=True)]
    assert same == [True, False, True, True]
    assert banded.patched(Image.fromarray(copy), 70, 80) == patched.png()
    # A change ending on a band's last row touches the next band's first filtered row.
    copy = clean.copy()
    copy[60:64] = 0
    assert (
        banded.patched(Image.fromarray(copy), 60, 64)
        == BandedPng.encode(Image.fromarray(copy), 1, band_rows=64).png()
    )


def test_bad_arguments_are_refused():
    banded = BandedPng.encode(Image.new("RGB", (8, 8)), 1)
    with pytest.raises(ValueError, match="frame"):
        banded.patched(Image.new("RGB", (8, 9)), 0, 1)
    with pytest.raises(ValueError, match="inside"):
        banded.patched(Image.new("RGB", (8, 8)), 3, 9)
    with pytest.raises(ValueError, match="level"):
        BandedPng.encode(Image.new("RGB", (8, 8)), 10)
    with pytest.raises(ValueError, match="band_rows"):
        BandedPng.encode(Image.new("RGB", (8, 8)), 1, band_rows=0)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_adler32_combine(a, b):
    assert adler32_combine(zlib.adler32(a), zlib.adler32(b), len(b)) == zlib.adler32(a + b)


_coord = st.integers(-20, 1020)  # some outside the grid: those marks are not drawn
_marks = st.lists(
    st.one_of(
        st.builds(PointMark, _coord, _coord),
        st.builds(ArrowMark, _coord, _coord, _coord, _coord),
    ),
    max_size=3,
)


@settings(max_examples=120, deadline=None)
@given(
    marks=_marks,
    size=st.sampled_from([(1344, 768), (768, 1344), (320, 200), (40, 30), (1000, 1000)]),
    size_class=st.sampled_from([None, "desktop", "mobile"]),
)
def test_marked_rows_bound_every_row_the_marks_change(marks, size, size_class):
    clean = Image.new("RGB", size, (0, 0, 0))  # no mark colour is black
    marked = np.asarray(draw_marks(clean, marks, size_class).image)
    changed = np.flatnonzero(marked.any(axis=(1, 2)))
    top, bottom = marked_rows(marks, *size, size_class)
    if changed.size:
        assert top <= changed[0] and changed[-1] < bottom
    assert 0 <= top <= bottom <= size[1]


def test_a_marked_frame_png_from_bands_matches_the_drawn_pixels():
    frame = Image.fromarray(_screen(768, 1344, seed=5))
    banded = BandedPng.encode(frame, 1)
    marks = (PointMark(500, 540), ArrowMark(100, 990, 900, 10))
    marked = draw_marks(frame, marks, "desktop").image
    png = banded.patched(marked, *marked_rows(marks, *marked.size, "desktop"))
    assert np.array_equal(_decoded(png), np.asarray(marked))
