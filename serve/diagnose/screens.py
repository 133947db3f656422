"""Screens of a run under diagnosis, judged by the gateway's own rules (``hivig.screens``).

Each screenshot is decoded once and kept as the judge's thumbnail. Every comparison masks the
platform's volatile regions, and a step's change is judged with the step's actions exactly as
the gateway's recurrence detector judges it live, so a trace's recorded ``change`` and the one
computed here agree (the detector's learned mask aside):

* a pointer action: ``no_effect`` when the masked screens are identical, or near-identical with
  the region around the action point unchanged (a focus ring or a caret near the point is an
  effect);
* typing, key presses and unparseable text can act anywhere, so any visible change is an effect;
* no action (or only waits): the ``same_screen`` judgement, also used to tell whether a later step
  returned to an earlier screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hivig.actions import Action
from hivig.screens import Screen, ScreenChange, compare, same_screen
from hivig.vision import GridBox, ImageError, load_image

_ELEMENT_WINDOW = 0.08
"""Half side of the window searched around a point, as a share of the screen's longer side
(about 100 px on a 1280-wide screen: wider than a button, narrower than most panels)."""
_ELEMENT_TOLERANCE = 12
"""Largest per-channel difference (0-255) of a pixel that still belongs to the seed's surface."""


def on_element(path: Path | None, point: tuple[int, int]) -> bool | None:
    """Whether the grid ``point`` lies on a bounded on-screen element (a button, a box, a label).

    The surface of the pixel under the point (its colour, within a small tolerance) is grown
    inside a window around it: an element's surface ends inside the window, the page or panel
    background reaches its edge. A disabled control is an element like any other: it is drawn.

    Args:
        path: The screenshot the action was taken on.
        point: ``(x, y)`` on the 0-1000 grid.

    Returns:
        ``True`` on an element, ``False`` on open background, ``None`` without a readable image.
    """
    try:
        img = np.asarray(load_image(path), dtype=np.int16) if path is not None else None
    except ImageError:
        return None
    if img is None:
        return None
    h, w = img.shape[:2]
    px = min(w - 1, max(0, round(point[0] * w / 1000)))
    py = min(h - 1, max(0, round(point[1] * h / 1000)))
    r = max(16, round(_ELEMENT_WINDOW * max(w, h)))
    x0, y0 = max(0, px - r), max(0, py - r)
    crop = img[y0 : py + r + 1, x0 : px + r + 1]
    seed = crop[py - y0, px - x0]
    same = np.abs(crop - seed).max(axis=2) <= _ELEMENT_TOLERANCE
    region = np.zeros_like(same)
    region[py - y0, px - x0] = True
    while True:
        grown = region.copy()
        grown[1:] |= region[:-1]
        grown[:-1] |= region[1:]
        grown[:, 1:] |= region[:, :-1]
        grown[:, :-1] |= region[:, 1:]
        grown &= same
        if (grown == region).all():
            break
        region = grown
    edge = region[0].any() or region[-1].any() or region[:, 0].any() or region[:, -1].any()
    return not edge


@dataclass(frozen=True)
class Change:
    """How the screen changed over one step.

    Attributes:
        identical: The masked screens are equal.
        dhash_dist: Hamming distance of the global 64-bit dHashes (-1: not recorded).
        diff_frac: Share of unmasked pixels whose grey level changed visibly (-1: not
            recorded).
        no_effect: The same screen after the step (see the module docstring).
        region_changed: Whether the region around the action point changed (pointer actions).
    """

    identical: bool
    dhash_dist: int
    diff_frac: float
    no_effect: bool
    region_changed: bool | None = None

    @classmethod
    def of(cls, change: ScreenChange) -> Change:
        """The report form of the judge's signals."""
        return cls(
            identical=change.identical,
            dhash_dist=change.dhash_dist,
            diff_frac=change.masked_diff_frac,
            no_effect=change.no_effect,
            region_changed=change.region_changed,
        )

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
    """Thumbnails by path, computed on first use; unreadable images give ``None``."""

    def __init__(self, masks: Sequence[GridBox] = ()) -> None:
        """Judge screens with ``masks`` (volatile grid boxes, ``hivig.screens.volatile_boxes``)
        blanked."""
        self.masks = tuple(masks)
        self._cache: dict[Path, Screen | None] = {}
        self.unreadable: dict[Path, str] = {}

    def get(self, path: Path | None) -> Screen | None:
        """The screen at ``path``, or ``None`` when it is missing or cannot be decoded."""
        if path is None:
            return None
        if path not in self._cache:
            self._cache[path] = self._compute(path)
        return self._cache[path]

    def _compute(self, path: Path) -> Screen | None:
        try:
            return Screen.of(load_image(path))
        except ImageError as e:
            self.unreadable[path] = f"{e.reason}: {e.message}"
            return None

    def compare(
        self, a: Path | None, b: Path | None, actions: Sequence[Action | str] = ()
    ) -> Change | None:
        """The change from screen ``a`` to ``b`` over a step; ``None`` if either is unavailable.

        Args:
            a: The before-screen.
            b: The after-screen.
            actions: The step's actions (typed, or its raw text where it did not parse).
        """
        sa, sb = self.get(a), self.get(b)
        if sa is None or sb is None:
            return None
        return Change.of(compare(sa, sb, self.masks, actions))

    def same(self, a: Path | None, b: Path | None) -> bool:
        """Whether ``a`` and ``b`` show the same screen (``False`` if either is unavailable)."""
        sa, sb = self.get(a), self.get(b)
        return sa is not None and sb is not None and same_screen(sa, sb, self.masks)
