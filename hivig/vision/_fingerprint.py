"""Screen fingerprints for recurrence detection (``serving_design.md`` §12.3).

Two views of a canonical frame: an exact hash of its pixels (the R3 paper's "identical screen"
rule) and a perceptual difference hash that tolerates resampling noise. Both accept volatile-region
masks — boxes on the 0–1000 grid, such as a taskbar clock — that are blanked before hashing, so a
ticking clock does not make a screen look new.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from PIL import Image, ImageDraw

GridBox = tuple[int, int, int, int]
"""A region ``(x1, y1, x2, y2)`` on the 0–1000 grid, x2 > x1 and y2 > y1."""

_GRID = 1000


def _mask_px(box: GridBox, width: int, height: int) -> tuple[int, int, int, int]:
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
            x1, y1, x2, y2 = _mask_px(box, out.width, out.height)
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
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
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
    grey = apply_masks(image.convert("L"), masks)
    # BOX averages every source pixel into the thumbnail: fast, and no pixel is ignored.
    thumb = grey.resize((hash_size + 1, hash_size), Image.Resampling.BOX)
    px = thumb.tobytes()
    row = hash_size + 1
    value = 0
    for y in range(hash_size):
        for x in range(hash_size):
            left, right = px[y * row + x], px[y * row + x + 1]
            value = (value << 1) | (left > right)
    return value


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
