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

from hivig.actions import Action
from hivig.screens import Screen, ScreenChange, compare, same_screen
from hivig.vision import GridBox, ImageError, load_image


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
