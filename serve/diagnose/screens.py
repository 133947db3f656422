"""Screen comparison for the cheap signals: exact and perceptual fingerprints, pixel diff.

The rules follow the gateway's change detector, on screens whose volatile regions (the
platform's clock bar) are blanked first:

* every action: ``no_effect`` when the masked pixels are identical;
* pointer actions also when the global dHash distance is at most 2 of 64, fewer than 0.1 % of
  the pixels changed by more than 24 grey levels, *and* the region around the action point did
  not change (a focus ring or a caret near the point is an effect).

Typing and key presses count as no-effect only when identical: a few typed characters change
fewer pixels than any global threshold can tell from noise. Screenshots are decoded once each;
the pixel diff runs on a copy reduced to at most 640 px wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from hivig.vision import (
    GridBox,
    ImageError,
    apply_masks,
    exact_fingerprint,
    hamming,
    load_image,
    perceptual_hash,
)

DHASH_UNCHANGED = 2
"""Global 64-bit dHash distance at or below which two screens count as near-identical."""

DIFF_LEVEL = 24
"""Grey-level difference above which a pixel counts as changed."""

DIFF_FRAC_UNCHANGED = 0.001
"""Changed-pixel fraction below which two screens count as near-identical."""

_DIFF_WIDTH = 640
_REGION_HALF = 0.06  # half side of the region around a point, as a share of the short side
_REGION_CHANGED = 0.002  # changed-pixel share above which the region counts as changed

VOLATILE_REGIONS: dict[str, tuple[GridBox, ...]] = {
    "ubuntu": ((0, 0, 1000, 26),),  # GNOME top bar with its clock
    "mac": ((0, 0, 1000, 24),),  # menu bar with its clock
    "windows": ((0, 955, 1000, 1000),),  # taskbar with tray and clock
    "android": ((0, 0, 1000, 35),),  # status bar
    "web": (),
}
"""Default volatile regions per platform (0-1000 grid), blanked before every comparison."""


@dataclass(frozen=True)
class Fingerprint:
    """What the comparisons need of one screenshot."""

    exact: str
    dhash: int
    grey: np.ndarray
    size: tuple[int, int]


@dataclass(frozen=True)
class Change:
    """How the screen changed over one step.

    Attributes:
        identical: Exactly equal pixels.
        dhash_dist: Hamming distance of the global 64-bit dHashes.
        diff_frac: Fraction of pixels whose grey level changed by more than ``DIFF_LEVEL``.
        no_effect: Identical or near-identical (see the module docstring).
        region_changed: Whether the region around the action point changed (pointer actions).
    """

    identical: bool
    dhash_dist: int
    diff_frac: float
    no_effect: bool
    region_changed: bool | None = None

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {
            "identical": self.identical,
            "dhash_dist": self.dhash_dist,
            "diff_frac": round(self.diff_frac, 6),
            "no_effect": self.no_effect,
            "region_changed": self.region_changed,
        }


class Screens:
    """Fingerprints by path, computed on first use; unreadable images give ``None``."""

    def __init__(self, masks: tuple[GridBox, ...] = ()) -> None:
        """Fingerprint screens with ``masks`` (volatile grid boxes) blanked."""
        self.masks = masks
        self._cache: dict[Path, Fingerprint | None] = {}
        self.unreadable: dict[Path, str] = {}

    def get(self, path: Path | None) -> Fingerprint | None:
        """The fingerprint of ``path``, or ``None`` when it is missing or cannot be decoded."""
        if path is None:
            return None
        if path not in self._cache:
            self._cache[path] = self._compute(path)
        return self._cache[path]

    def _compute(self, path: Path) -> Fingerprint | None:
        try:
            image = load_image(path)
        except ImageError as e:
            self.unreadable[path] = f"{e.reason}: {e.message}"
            return None
        w, h = image.size
        image = apply_masks(image, self.masks) if self.masks else image
        small = image.convert("L")
        if w > _DIFF_WIDTH:
            small = small.resize((_DIFF_WIDTH, max(1, round(h * _DIFF_WIDTH / w))), Image.BOX)
        return Fingerprint(
            exact=exact_fingerprint(image),
            dhash=perceptual_hash(image),
            grey=np.asarray(small, dtype=np.int16),
            size=(w, h),
        )

    def compare(
        self,
        a: Path | None,
        b: Path | None,
        point: tuple[int, int] | None = None,
        *,
        near: bool | None = None,
    ) -> Change | None:
        """The change from screen ``a`` to ``b``; ``None`` if either is unavailable.

        Args:
            a: The before-screen.
            b: The after-screen.
            point: The pointer action's target on the 0-1000 grid, if any.
            near: Whether near-identical screens count as no-effect; by default only for
                pointer actions (``point`` given).
        """
        fa, fb = self.get(a), self.get(b)
        if fa is None or fb is None:
            return None
        return compare(fa, fb, point, near=point is not None if near is None else near)


def _region_changed(a: np.ndarray, b: np.ndarray, point: tuple[int, int]) -> bool:
    h, w = a.shape
    half = max(4, round(_REGION_HALF * min(w, h)))
    cx, cy = round(point[0] * w / 1000), round(point[1] * h / 1000)
    ys, xs = slice(max(0, cy - half), cy + half), slice(max(0, cx - half), cx + half)
    region = np.abs(a[ys, xs] - b[ys, xs]) > DIFF_LEVEL
    return bool(region.size) and float(np.mean(region)) > _REGION_CHANGED


def compare(
    a: Fingerprint, b: Fingerprint, point: tuple[int, int] | None = None, *, near: bool = True
) -> Change:
    """The change between two fingerprints (screens of different sizes always differ).

    Args:
        a: Before.
        b: After.
        point: Action point (0-1000 grid) whose surroundings must be unchanged too.
        near: Whether near-identical screens count as no-effect (else only identical ones).
    """
    if a.size != b.size or a.grey.shape != b.grey.shape:
        return Change(False, hamming(a.dhash, b.dhash), 1.0, False)
    identical = a.exact == b.exact
    dist = hamming(a.dhash, b.dhash)
    frac = 0.0 if identical else float(np.mean(np.abs(a.grey - b.grey) > DIFF_LEVEL))
    region = None if point is None or identical else _region_changed(a.grey, b.grey, point)
    similar = dist <= DHASH_UNCHANGED and frac < DIFF_FRAC_UNCHANGED and not region
    return Change(identical, dist, frac, identical or (near and similar), region)
