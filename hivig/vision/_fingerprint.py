"""Screen fingerprints: the hashes the screen judge (``hivig.screens``) is built on.

Two views of a canonical frame: an exact hash of its pixels (the R3 paper's "identical screen"
rule) and a perceptual difference hash that tolerates resampling noise. Both accept volatile-region
masks — boxes on the 0–1000 grid, such as a taskbar clock — that are blanked before hashing, so a
ticking clock does not make a screen look new.

For per-step comparisons (``hivig.screens``, the one screen judge) a screen is first box-reduced
to a small thumbnail (``screen_thumbnail``) and compared as arrays (``dhash_array``,
``array_fingerprint``), so no full-resolution pixel is handled in Python.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

GridBox = tuple[int, int, int, int]
"""A region ``(x1, y1, x2, y2)`` on the 0–1000 grid, x2 > x1 and y2 > y1."""

_GRID = 1000


def grid_box_px(box: GridBox, width: int, height: int) -> tuple[int, int, int, int]:
    """Pixel box ``(x1, y1, x2, y2)`` (x2/y2 exclusive) covering a 0–1000 grid box.

    Args:
        box: ``(x1, y1, x2, y2)`` on the 0–1000 grid.
        width: Image width in pixels.
        height: Image height in pixels.

    Returns:
        The pixel box, rounded outwards so it covers the whole requested region.

    Raises:
        ValueError: The box is malformed or leaves the grid.
    """
    if len(box) != 4:
        raise ValueError(f"mask must be (x1, y1, x2, y2), got {box!r}")
    x1, y1, x2, y2 = box
    if not (0 <= x1 < x2 <= _GRID and 0 <= y1 < y2 <= _GRID):
        raise ValueError(f"mask {box!r} must satisfy 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000")
    # Round outwards so the masked area always covers the whole requested region.
    return (
        math.floor(x1 * width / _GRID),
        math.floor(y1 * height / _GRID),
        math.ceil(x2 * width / _GRID),
        math.ceil(y2 * height / _GRID),
    )


def apply_masks(image: Image.Image, masks: Sequence[GridBox]) -> Image.Image:
    """A copy of ``image`` with every mask box filled with black (pixel boxes rounded outwards).

    Args:
        image: Any PIL image.
        masks: Grid boxes ``(x1, y1, x2, y2)`` in 0–1000.

    Returns:
        The masked copy (the input is not modified).

    Raises:
        ValueError: A box is malformed or leaves the grid.
    """
    out = image.copy()
    if masks:
        draw = ImageDraw.Draw(out)
        for box in masks:
            x1, y1, x2, y2 = grid_box_px(box, out.width, out.height)
            # PIL rectangles include their right/bottom edge, hence the -1.
            draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=0)
    return out


def exact_fingerprint(image: Image.Image, masks: Sequence[GridBox] = ()) -> str:
    """SHA-256 hex digest of the RGB pixels (and size) of ``image`` after masking.

    Args:
        image: A canonical frame (converted to RGB if needed).
        masks: Volatile regions to blank first.

    Returns:
        64 hex characters; equal exactly when size and masked pixels are equal.
    """
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    rgb = apply_masks(rgb, masks) if masks else rgb
    return _pixel_digest(rgb.width, rgb.height, rgb.tobytes())


def array_fingerprint(rgb: np.ndarray) -> str:
    """``exact_fingerprint`` of an RGB array: the same digest, without building an image.

    Args:
        rgb: ``(height, width, 3)`` uint8 pixels (a thumbnail, already masked if need be).

    Returns:
        64 hex characters, equal to ``exact_fingerprint`` of the same pixels as an image.

    Raises:
        ValueError: ``rgb`` is not an ``(h, w, 3)`` uint8 array.
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"rgb must be an (h, w, 3) uint8 array, got {rgb.dtype} {rgb.shape}")
    return _pixel_digest(rgb.shape[1], rgb.shape[0], np.ascontiguousarray(rgb).data)


def _pixel_digest(width: int, height: int, pixels: bytes | memoryview) -> str:
    # The size goes into the digest, so equal bytes of different shapes never collide.
    digest = hashlib.sha256(f"{width}x{height}:".encode())
    digest.update(pixels)
    return digest.hexdigest()


def perceptual_hash(image: Image.Image, masks: Sequence[GridBox] = (), hash_size: int = 8) -> int:
    """Difference hash (dHash) of the masked greyscale image.

    The image is reduced to ``(hash_size + 1) × hash_size`` grey pixels; bit ``i`` is set when a
    pixel is brighter than its right neighbour. ``hash_size=8`` gives the usual 64-bit hash,
    16 the 256-bit screen fingerprint.

    Args:
        image: A canonical frame.
        masks: Volatile regions (grid boxes) blanked before hashing.
        hash_size: Rows of the hash grid.

    Returns:
        A non-negative integer of ``hash_size²`` bits.

    Raises:
        ValueError: ``hash_size`` < 2 or a malformed mask.
    """
    if hash_size < 2:
        raise ValueError(f"hash_size must be at least 2, got {hash_size}")
    return _dhash(apply_masks(image.convert("L"), masks), hash_size)


def _dhash(grey: Image.Image, hash_size: int) -> int:
    # BOX averages every source pixel into the thumbnail: fast, and no pixel is ignored.
    thumb = grey.resize((hash_size + 1, hash_size), Image.Resampling.BOX)
    px = np.frombuffer(thumb.tobytes(), dtype=np.uint8).reshape(hash_size, hash_size + 1)
    # Bit order: row-major, the first pixel in the most significant bit.
    bits = (px[:, :-1] > px[:, 1:]).ravel()
    return int.from_bytes(np.packbits(bits).tobytes(), "big") >> (-bits.size % 8)


def dhash_array(grey: np.ndarray, hash_size: int = 8) -> int:
    """Difference hash of a 2-D ``uint8`` grey array (a thumbnail or a crop of one).

    Same bits as ``perceptual_hash`` on the equivalent ``L`` image; used on thumbnails that
    were masked as arrays (learned masks are not boxes).

    Args:
        grey: ``(height, width)`` ``uint8`` array, at least 1×1.
        hash_size: Rows of the hash grid (``hash_size²`` bits).

    Returns:
        The hash as a non-negative integer.

    Raises:
        ValueError: ``hash_size`` < 2, or ``grey`` is not a non-empty 2-D uint8 array.
    """
    if hash_size < 2:
        raise ValueError(f"hash_size must be at least 2, got {hash_size}")
    if grey.ndim != 2 or grey.dtype != np.uint8 or grey.size == 0:
        raise ValueError(f"grey must be a non-empty 2-D uint8 array, got {grey.dtype} {grey.shape}")
    return _dhash(Image.fromarray(np.ascontiguousarray(grey)), hash_size)


def screen_thumbnail(image: Image.Image, long_side: int = 480) -> tuple[Image.Image, int]:
    """An RGB thumbnail by integer box reduction, for per-step screen comparisons.

    ``Image.reduce`` averages each ``factor × factor`` block in C, so a 1920×1080 screen costs
    about as much as one pass over its pixels; no full-resolution pixel is ever handled in Python.

    Args:
        image: Any PIL image (converted to RGB after reduction if needed).
        long_side: Target length of the longer side; the factor is the smallest integer that
            brings the longer side to at most this (1 for small images).

    Returns:
        ``(thumbnail, factor)``.

    Raises:
        ValueError: ``long_side`` < 16.
    """
    if long_side < 16:
        raise ValueError(f"long_side must be at least 16, got {long_side}")
    factor = max(1, math.ceil(max(image.size) / long_side))
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    thumb = image.reduce(factor) if factor > 1 else image.copy()
    return (thumb if thumb.mode == "RGB" else thumb.convert("RGB")), factor


def mask_array(masks: Sequence[GridBox], width: int, height: int) -> np.ndarray:
    """Boolean ``(height, width)`` array, True inside any of the grid boxes (rounded outwards).

    Args:
        masks: Grid boxes ``(x1, y1, x2, y2)`` on 0–1000.
        width: Array width in pixels.
        height: Array height in pixels.

    Returns:
        The mask.

    Raises:
        ValueError: A box is malformed or leaves the grid.
    """
    out = np.zeros((height, width), dtype=bool)
    for box in masks:
        x1, y1, x2, y2 = grid_box_px(box, width, height)
        out[y1:y2, x1:x2] = True
    return out


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two hashes.

    Args:
        a: First hash (non-negative).
        b: Second hash (non-negative).

    Returns:
        The Hamming distance.

    Raises:
        ValueError: A hash is negative.
    """
    if a < 0 or b < 0:
        raise ValueError("hashes must be non-negative integers")
    return bin(a ^ b).count("1")
