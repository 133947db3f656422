"""A frame's PNG kept in bands of rows, so a marked copy re-compresses only the rows it changed.

Every critique sends the step's screen with a marker drawn on it: the same pixels as the clean
frame, but for the few dozen rows under the marker. ``BandedPng`` compresses the filtered rows
in bands of ``band_rows``, each band on its own (a fresh deflate state, ended by a full flush, in
an ``IDAT`` chunk of its own), so the PNG of the marked copy is the clean frame's chunks with the
touched bands compressed anew. The stream stays one zlib stream: a two-byte header chunk, the
bands, and a final empty block with the Adler-32 of all the filtered bytes (combined from the
bands', never recomputed over the whole frame).

The result decodes to exactly the pixels of ``encode_png`` (the same "Up" filter on every row);
only the bytes differ, and they depend only on the pixels, the level and the band height (for
one deflate library).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image

from hivig.vision._frame import FAST_PNG_LEVEL, isal_zlib

PNG_BAND_ROWS = 64
"""Rows per band: 64 rows of a 1344-pixel frame are 258 KB of filtered bytes, many times the
32 KB deflate window, so restarting the compressor per band costs almost nothing in size."""

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_FILTER_UP = 2
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KB window, no dictionary (FCHECK makes it % 31 == 0)
_FINAL_EMPTY_BLOCK = b"\x03\x00"  # BFINAL=1, fixed Huffman codes, end of block
_ADLER_BASE = 65521


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def _rgb_rows(image: Image.Image, top: int, bottom: int) -> np.ndarray:
    """``(bottom - top, width * 3)`` uint8 rows of ``image`` as RGB."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    if (top, bottom) != (0, rgb.height):
        rgb = rgb.crop((0, top, rgb.width, bottom))
    return np.asarray(rgb, dtype=np.uint8).reshape(bottom - top, rgb.width * 3)


def _filtered(rows: np.ndarray, first_row: bool) -> np.ndarray:
    """The "Up"-filtered scanlines of ``rows``.

    One per row, but the first unless it is the image's first row (``first_row``): otherwise
    the first row only serves as the row above.
    """
    band = rows if first_row else rows[1:]
    out = np.empty((band.shape[0], band.shape[1] + 1), dtype=np.uint8)
    out[:, 0] = _FILTER_UP
    if first_row:
        out[0, 1:] = band[0]  # the row above the first one is all zeros
    else:
        np.subtract(band[0], rows[0], out=out[0, 1:])  # uint8 wraps: the filter is mod 256
    np.subtract(band[1:], band[:-1], out=out[1:, 1:])
    return out


def _deflate_band(data: memoryview, level: int) -> bytes:
    """Raw deflate blocks of ``data`` from a fresh state, ended by a full flush.

    The blocks end on a byte boundary, none is final and none refers back past the band, so
    bands join in any combination; the GIL is released while compressing.
    """
    lib = isal_zlib if isal_zlib is not None and level in (1, 2) else zlib
    compressor = lib.compressobj(level, lib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(lib.Z_FULL_FLUSH)


# ISA-L's Adler-32 is about 4 times zlib's (0.26 against 1.1 ms over 3 MB); the same values.
_adler32 = isal_zlib.adler32 if isal_zlib is not None else zlib.adler32


def adler32_combine(first: int, second: int, second_len: int) -> int:
    """The Adler-32 of ``a + b`` from ``adler32(a)``, ``adler32(b)`` and ``len(b)``.

    Adler-32 is two sums mod 65521 over the bytes, ``A = 1 + sum(x)`` and ``B = sum(A_i)``;
    appending ``b`` adds ``A_b - 1`` to ``A`` and ``B_b + len(b) * (A_a - 1)`` to ``B``.
    """
    a1, b1 = first & 0xFFFF, first >> 16
    a2, b2 = second & 0xFFFF, second >> 16
    a = (a1 + a2 - 1) % _ADLER_BASE
    b = (b1 + b2 + (second_len % _ADLER_BASE) * (a1 - 1)) % _ADLER_BASE
    return (b << 16) | a


@dataclass(frozen=True)
class _Band:
    idat: bytes
    """The band's ``IDAT`` chunk (length, tag, data, CRC)."""
    adler: int
    """Adler-32 of the band's filtered bytes."""
    length: int
    """Number of filtered bytes."""


@dataclass(frozen=True)
class BandedPng:
    """The PNG of an RGB frame, compressed in bands of rows (see the module text).

    ``png()`` is the frame's PNG; ``patched(copy, top, bottom)`` is the PNG of a copy of the
    frame whose pixels differ only in rows ``top`` to ``bottom - 1``.
    """

    width: int
    height: int
    level: int
    band_rows: int
    bands: tuple[_Band, ...]

    @classmethod
    def encode(
        cls, image: Image.Image, level: int = FAST_PNG_LEVEL, band_rows: int = PNG_BAND_ROWS
    ) -> BandedPng:
        """Compress ``image`` (converted to RGB) band by band.

        Raises:
            ValueError: ``level`` is not 0–9 or ``band_rows`` is not positive.
        """
        if not 0 <= level <= 9:
            raise ValueError(f"level must be in 0..9, got {level}")
        if band_rows < 1:
            raise ValueError(f"band_rows must be positive, got {band_rows}")
        filtered = _filtered(_rgb_rows(image, 0, image.height), True)
        bands = tuple(
            _band(filtered[top : top + band_rows], level)
            for top in range(0, image.height, band_rows)
        )
        return cls(image.width, image.height, level, band_rows, bands)

    def png(self) -> bytes:
        """The PNG file of the encoded frame."""
        return self._assemble(self.bands)

    def patched(self, image: Image.Image, top: int, bottom: int) -> bytes:
        """The PNG of ``image``, a copy of the encoded frame changed only in ``[top, bottom)``.

        The bands those rows touch are compressed anew, the others reused.

        Raises:
            ValueError: ``image`` has another size, or the rows are not inside it.
        """
        if image.size != (self.width, self.height):
            raise ValueError(f"image is {image.size}, the frame {(self.width, self.height)}")
        if not 0 <= top <= bottom <= self.height:
            raise ValueError(f"rows [{top}, {bottom}) are not inside 0..{self.height}")
        if top == bottom:
            return self.png()
        # The "Up" filter reads the row above, so the row after the change is touched too.
        first = top // self.band_rows
        last = min(bottom, self.height - 1) // self.band_rows
        bands = list(self.bands)
        base = max(0, first * self.band_rows - 1)  # the row above the first band touched
        rows = _rgb_rows(image, base, min(self.height, (last + 1) * self.band_rows))
        filtered = _filtered(rows, first == 0)
        for b in range(first, last + 1):
            start = b * self.band_rows - first * self.band_rows
            bands[b] = _band(filtered[start : start + self.band_rows], self.level)
        return self._assemble(tuple(bands))

    def _assemble(self, bands: tuple[_Band, ...]) -> bytes:
        adler, total = bands[0].adler, bands[0].length
        for band in bands[1:]:
            adler = adler32_combine(adler, band.adler, band.length)
            total += band.length
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        tail = _FINAL_EMPTY_BLOCK + struct.pack(">I", adler)
        return b"".join(
            (
                _SIGNATURE,
                _chunk(b"IHDR", header),
                _chunk(b"IDAT", _ZLIB_HEADER),
                *(band.idat for band in bands),
                _chunk(b"IDAT", tail),
                _chunk(b"IEND", b""),
            )
        )


def _band(filtered: np.ndarray, level: int) -> _Band:
    """A band of filtered scanlines (C-contiguous rows), compressed."""
    data = memoryview(filtered).cast("B")
    return _Band(_chunk(b"IDAT", _deflate_band(data, level)), _adler32(data), data.nbytes)
