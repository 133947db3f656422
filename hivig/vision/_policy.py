"""Frame policies: how a screenshot becomes the frame a given critic was trained on.

hivig's own critic sees the canonical frame (``canonical_frame``: one antialiased resize to the
processor's grid, markers drawn on the frame, their size from the platform). A checkpoint trained
through LlamaFactory saw something else: markers drawn on the screenshot at its own resolution
(size from the aspect ratio), then LlamaFactory's resize to at most ``image_max_pixels`` (PIL's
default filter, sides truncated), then the processor's resize to its grid. ``FramePolicy`` names
those choices and ``policy_frame`` applies them; every stage calls it with the same policy, so
training and serving keep seeing the same pixels whichever policy a profile picks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PIL import Image

from hivig.messages import Mark, SizeClass
from hivig.vision._markers import draw_marks_inplace


@dataclass(frozen=True)
class FramePolicy:
    """How a screenshot becomes the model's frame.

    Attributes:
        geometry: ``canonical``: one resize to the processor's grid; ``llamafactory``:
            LlamaFactory's resize to at most ``image_max_pixels`` (at least
            ``image_min_pixels``) first, then the resize to the processor's grid.
        image_max_pixels: LlamaFactory's ``image_max_pixels``.
        image_min_pixels: LlamaFactory's ``image_min_pixels``.
        markers: ``frame``: markers drawn on the resized frame; ``original``: on the screenshot
            at its own resolution, before any resize.
        size_class: ``platform``: the marker table follows the platform (android = mobile);
            ``aspect``: portrait images are mobile.
        drag_arrows: A drag that starts at the pointer (a desktop ``left_click_drag``) gets an
            arrow; without, only drags that name both ends (swipes) do.
    """

    geometry: str = "canonical"
    image_max_pixels: int = 1_048_576
    image_min_pixels: int = 1_024
    markers: str = "frame"
    size_class: str = "platform"
    drag_arrows: bool = True

    def __post_init__(self) -> None:
        for key, value, allowed in (
            ("geometry", self.geometry, ("canonical", "llamafactory")),
            ("markers", self.markers, ("frame", "original")),
            ("size_class", self.size_class, ("platform", "aspect")),
        ):
            if value not in allowed:
                raise ValueError(f"frame.{key} must be one of {', '.join(allowed)}, got {value!r}")
        if not 0 < self.image_min_pixels <= self.image_max_pixels:
            raise ValueError("frame.image_min_pixels must be in (0, frame.image_max_pixels]")

    @property
    def is_canonical(self) -> bool:
        """Whether this is hivig's own frame (the fast paths apply)."""
        return self.geometry == "canonical" and self.markers == "frame"

    def marker_class(self, platform_class: SizeClass | None) -> SizeClass | None:
        """The size class to draw with.

        Args:
            platform_class: The platform's class (``ImageRef.size_class``).

        Returns:
            ``platform_class`` under ``size_class: platform``; ``None`` (the aspect ratio
            decides) under ``aspect``.
        """
        return platform_class if self.size_class == "platform" else None


CANONICAL = FramePolicy()
"""hivig's own frame policy."""


def llamafactory_resize(image: Image.Image, max_pixels: int, min_pixels: int) -> Image.Image:
    """LlamaFactory's image pre-processing for Qwen-VL models, step for step.

    Scale the area to at most ``max_pixels`` (then at least ``min_pixels``) with sides truncated
    to integers, PIL's default filter (bicubic); a side under 28 px grows to 28; an aspect ratio
    over 200 is cut to 180.

    Args:
        image: An RGB image (not modified).
        max_pixels: ``image_max_pixels``.
        min_pixels: ``image_min_pixels``.

    Returns:
        A new RGB image (or ``image`` itself when nothing changes).
    """
    if image.width * image.height > max_pixels:
        image = _scaled(image, math.sqrt(max_pixels / (image.width * image.height)))
    if image.width * image.height < min_pixels:
        image = _scaled(image, math.sqrt(min_pixels / (image.width * image.height)))
    if min(image.width, image.height) < 28:
        image = image.resize((max(image.width, 28), max(image.height, 28)))
    if image.width / image.height > 200:
        image = image.resize((image.height * 180, image.height))
    if image.height / image.width > 200:
        image = image.resize((image.width, image.width * 180))
    return image


def _scaled(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((int(image.width * factor), int(image.height * factor)))


def before_grid(
    image: Image.Image,
    policy: FramePolicy,
    marks: tuple[Mark, ...] | list[Mark] = (),
    size_class: SizeClass | None = None,
) -> tuple[Image.Image, int]:
    """What the policy does before the resize to the grid.

    Markers on the original (``markers: original``), then LlamaFactory's resize.

    Args:
        image: The decoded RGB screenshot (not modified).
        policy: The frame policy.
        marks: The step's marks (drawn here only under ``markers: original``).
        size_class: The platform's marker class.

    Returns:
        ``(image, skipped)``: the image the grid resize starts from, and marks out of range.
    """
    skipped = 0
    if policy.markers == "original" and marks:
        image = image.copy()
        skipped = draw_marks_inplace(image, marks, policy.marker_class(size_class))
    if policy.geometry == "llamafactory":
        image = llamafactory_resize(image, policy.image_max_pixels, policy.image_min_pixels)
    return image, skipped
