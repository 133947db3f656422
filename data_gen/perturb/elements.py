"""Element boxes per screenshot: the grounding source of the element-based generators.

In production the boxes come from accessibility trees or a grounding model's annotation; in the
synthetic sample corpus a sidecar written next to ``trajectories.jsonl`` plays that role. One JSON
object per screenshot::

    {"screenshot": "images/t0/step_000.png", "elements": [{"label": "OK", "role": "button",
     "box": [x1, y1, x2, y2]}, {"label": "Back", "role": "button", "box": [...], "text": "<"}]}

``text`` is what the screen draws where that is not the label (a glyph, or "" for nothing).

Boxes are on the 0-1000 grid of the screenshot. Containers (dialogs, lists, windows) are kept but
never count as a click target or as "something under the point".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivig.files import split_lines
from hivig.logging import get_logger

log = get_logger(__name__)

CONTAINER_ROLES = frozenset({"dialog", "list", "window", "pane", "group", "container", "toolbar"})
"""Roles that enclose other elements; a point inside only these is dead space."""


@dataclass(frozen=True)
class Element:
    """One element of a screen: label, role and box on the 0-1000 grid."""

    label: str
    role: str
    box: tuple[int, int, int, int]
    text: str | None = None
    """What the screen draws for the element where that is not its label: a glyph (``<`` for
    Back), or ``""`` where nothing legible is drawn (a bar, a bare icon). The label stays the
    element's name for the generators; a text a critic learns from says only ``shown``."""

    @property
    def shown(self) -> str:
        """The element's text as the screenshot shows it (empty when none is drawn)."""
        return self.label if self.text is None else self.text

    def described(self) -> str:
        """The element as a critic can see it: its drawn text and its kind in plain words."""
        kind = role_words(self.role)
        return f"the '{self.shown}' {kind}" if self.shown.strip() else f"the {kind}"

    @property
    def is_target(self) -> bool:
        """Whether the element can be the target of a point action (not a container)."""
        return self.role not in CONTAINER_ROLES

    @property
    def centre(self) -> tuple[int, int]:
        """Integer centre on the grid."""
        x1, y1, x2, y2 = self.box
        return (x1 + x2) // 2, (y1 + y2) // 2

    def contains(self, x: int, y: int) -> bool:
        """Whether the grid point lies inside the box (edges included)."""
        x1, y1, x2, y2 = self.box
        return x1 <= x <= x2 and y1 <= y <= y2

    @property
    def area(self) -> int:
        """Box area in grid units squared."""
        x1, y1, x2, y2 = self.box
        return max(0, x2 - x1) * max(0, y2 - y1)

    def to_json(self) -> dict[str, Any]:
        """Sidecar form (``text`` only where the screen draws something else than the label)."""
        out: dict[str, Any] = {"label": self.label, "role": self.role, "box": list(self.box)}
        if self.text is not None:
            out["text"] = self.text
        return out


ROLE_WORDS = {
    "button_disabled": "greyed-out button",
    "listitem": "list item",
    "addressbar": "address bar",
    "titlebar": "title bar",
    "navigation": "navigation button",
    "progress": "progress indicator",
    "textbox": "text field",
    "checkbox": "checkbox",
    "menuitem": "menu item",
}
"""Sidecar roles in the words a screen's reader would use (a role token such as
``button_disabled`` is the sidecar's, not something a critic can see)."""


def role_words(role: str) -> str:
    """``role`` in plain words (``ROLE_WORDS``, else the token with spaces for underscores)."""
    return ROLE_WORDS.get(role, role.replace("_", " ") or "element")


def element_from_json(obj: Any) -> Element | None:
    """Parse one sidecar element; ``None`` when malformed (counted by the caller)."""
    try:
        x1, y1, x2, y2 = (int(v) for v in obj["box"])
        label, role = str(obj.get("label", "")), str(obj.get("role", ""))
        text = obj.get("text")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not (0 <= x1 <= x2 <= 1000 and 0 <= y1 <= y2 <= 1000):
        return None
    return Element(label, role, (x1, y1, x2, y2), None if text is None else str(text))


def target_at(elements: Iterable[Element], x: int, y: int) -> Element | None:
    """The smallest non-container element containing the point, or ``None`` (dead space)."""
    hits = [e for e in elements if e.is_target and e.contains(x, y)]
    return min(hits, key=lambda e: (e.area, e.box)) if hits else None


class ElementIndex:
    """Elements per screenshot path, loaded from the sidecar (empty when there is none)."""

    def __init__(self, by_path: dict[str, tuple[Element, ...]] | None = None) -> None:
        self.by_path = by_path or {}
        self.malformed = 0
        # Screens whose list holds only some of their elements (annotator grounding gives the
        # clicked target alone): nothing can be concluded about what is absent from them.
        self.partial: set[str] = set()

    @classmethod
    def load(cls, path: Path) -> ElementIndex:
        """Read a sidecar; a missing file gives an empty index, malformed lines are counted."""
        index = cls()
        if not path.exists():
            log.warning(
                "no element sidecar at %s; element-based generators have no candidates", path
            )
            return index
        for line in split_lines(path.read_text(encoding="utf-8")):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                shot = str(obj["screenshot"])
                raw = obj["elements"]
            except (json.JSONDecodeError, KeyError, TypeError):
                index.malformed += 1
                continue
            parsed = [element_from_json(e) for e in raw] if isinstance(raw, list) else [None]
            index.malformed += sum(e is None for e in parsed)
            index.by_path[shot] = tuple(e for e in parsed if e is not None)
            if obj.get("partial") is True:
                index.partial.add(shot)
        return index

    def to_jsonl(self) -> str:
        """The index in the sidecar format (``load`` reads it back, ``partial`` included)."""
        rows = []
        for shot in sorted(self.by_path):
            row: dict[str, Any] = {
                "screenshot": shot,
                "elements": [e.to_json() for e in self.by_path[shot]],
            }
            if shot in self.partial:
                row["partial"] = True
            rows.append(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
        return "".join(rows)

    def is_partial(self, screenshot: str) -> bool:
        """Whether the screenshot's element list is known to be incomplete."""
        return screenshot in self.partial

    def boxes_elsewhere(self, label: str, screenshot: str) -> tuple[tuple[int, int, int, int], ...]:
        """Boxes an element labelled ``label`` has on the *other* screens of the corpus, sorted.

        Where the same control usually sits (a Save button, a search field): the layout habit
        a hallucinating agent clicks instead of looking.
        """
        if not hasattr(self, "_by_label"):
            index: dict[str, dict[tuple[int, int, int, int], set[str]]] = {}
            for shot, els in self.by_path.items():
                for e in els:
                    if e.label and e.is_target:
                        index.setdefault(e.label, {}).setdefault(e.box, set()).add(shot)
            self._by_label = index
        boxes = self._by_label.get(label, {})
        return tuple(sorted(b for b, shots in boxes.items() if shots - {screenshot}))

    def get(self, screenshot: str) -> tuple[Element, ...]:
        """Elements of a screenshot (empty when unknown)."""
        return self.by_path.get(screenshot, ())
