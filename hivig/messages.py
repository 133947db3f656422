"""The seam between prompts, images and backends: marks, image references and chat messages.

Prompt builders emit ``ChatMessage`` lists whose image parts are ``ImageRef`` (a path plus the
marks to draw); ``hivig.vision.materialise`` turns them into canonical PIL frames right before a
model or backend sees them. Coordinates of marks are integers on the 0–1000 grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class PointMark:
    """A red open-centre X at a point action's target (0–1000 grid)."""

    x: int
    y: int


@dataclass(frozen=True)
class ArrowMark:
    """A blue arrow from start to end for drags and swipes (0–1000 grid)."""

    x1: int
    y1: int
    x2: int
    y2: int


Mark = PointMark | ArrowMark

SizeClass = Literal["desktop", "mobile"]


def mark_to_json(mark: Mark) -> dict[str, Any]:
    """JSON form: ``{"point": [x, y]}`` or ``{"arrow": [x1, y1, x2, y2]}``."""
    if isinstance(mark, PointMark):
        return {"point": [mark.x, mark.y]}
    return {"arrow": [mark.x1, mark.y1, mark.x2, mark.y2]}


def mark_from_json(obj: dict[str, Any]) -> Mark:
    """Inverse of ``mark_to_json``.

    Raises:
        ValueError: The object is neither a point nor an arrow.
    """
    if "point" in obj:
        x, y = obj["point"]
        return PointMark(int(x), int(y))
    if "arrow" in obj:
        x1, y1, x2, y2 = obj["arrow"]
        return ArrowMark(int(x1), int(y1), int(x2), int(y2))
    raise ValueError(f"not a mark: {obj!r}")


@dataclass(frozen=True)
class ImageRef:
    """A screenshot by path with the marks to draw on its canonical frame.

    Attributes:
        path: Image path, relative to a root the caller knows (corpus root) or absolute.
        marks: Marks drawn at load time; images are referenced, never copied.
        size_class: Marker size class; ``None`` picks by aspect ratio (portrait = mobile).
    """

    path: str
    marks: tuple[Mark, ...] = ()
    size_class: SizeClass | None = None


@dataclass(frozen=True)
class TextPart:
    """A text item of a message."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class ImagePart:
    """An image item of a message: an ``ImageRef`` before loading, a PIL image after."""

    image: Any
    type: Literal["image"] = "image"


@dataclass
class ChatMessage:
    """One chat turn; ``content`` keeps text and image items in order."""

    role: Literal["system", "user", "assistant"]
    content: list[TextPart | ImagePart] = field(default_factory=list)

    def text(self) -> str:
        """Concatenated text items (images skipped)."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def images(self) -> list[Any]:
        """Image payloads in order."""
        return [p.image for p in self.content if isinstance(p, ImagePart)]
