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

import hashlib
import json
from collections.abc import Iterable, Mapping, Set
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
        # Layout habits (Visual Hallucination's ghosts): the corpus' expert steps and every
        # screenshot's split (``note_steps``), and what is worked out from them once.
        self._clicked: dict[str, list[ExpertStep]] = {}
        self._splits: dict[str, str] = {}
        self._pairs: dict[ExpertStep, ExpertStep] | None = None
        self._by_label_index: dict[str, dict[str, tuple[str, ...]]] = {}
        self._habit_memo: dict[str, tuple[HabitGhost, ...]] = {}
        self._similar_memo: dict[str, tuple[str, ...]] = {}
        self._labels_memo: dict[tuple[str, str | None], frozenset[str]] = {}

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

    def habit_ghosts(self, screenshot: str) -> tuple[HabitGhost, ...]:
        """Targets of *similar* screens that this screen does not show, with the box they have
        there, sorted.

        Similar screens share most of their labelled targets with this one (the same dialog or
        page in another episode). Clicking one of their elements where it sits there, on a
        screen that lacks it, is the layout-habit ghost of the taxonomy's Visual Hallucination:
        its words are those of a real step of the same kind, so text alone cannot tell it.
        """
        if screenshot not in self._habit_memo:
            self._habit_memo[screenshot] = self._habit_ghosts(screenshot)
        return self._habit_memo[screenshot]

    def _habit_ghosts(self, screenshot: str) -> tuple[HabitGhost, ...]:
        labels = self._labels(screenshot)
        if len(labels) < HABIT_MIN_SHARED or screenshot in self.partial:
            return ()
        ghosts: dict[str, HabitGhost] = {}
        split = self.split_of(screenshot)
        for shot in _sharing(labels, self._label_index("screens", self.by_path), screenshot):
            if self.split_of(shot) != split:
                continue
            there = self.by_path[shot]
            for role in sorted({e.role for e in there if e.is_target}):
                # The same kind of screen around a list of ``role``: everything else on it
                # (menus, fields, buttons) is the same; the items may differ.
                if _jaccard(self._labels(screenshot, role), self._labels(shot, role)) < (
                    HABIT_SIMILARITY
                ):
                    continue
                for e in there:
                    key = e.label.strip().lower()
                    if e.role == role and e.is_target and key and key not in labels:
                        ghosts.setdefault(key, (e.label, e.role, *e.box))
        per_role: dict[str, list[HabitGhost]] = {}
        # By a hash of the label, not alphabetically: the kept few are a fair sample of the
        # list's items (the first by name would all start alike: "agenda_1", "agenda_2").
        for ghost in sorted(ghosts.values(), key=lambda g: (_label_hash(g[0]), g)):
            per_role.setdefault(ghost[1], []).append(ghost)
        return tuple(g for role in sorted(per_role) for g in per_role[role][:HABIT_MAX_GHOSTS])

    def note_steps(self, steps: Iterable[ExpertStep], splits: Mapping[str, str]) -> None:
        """Record the corpus' expert steps that click a labelled element (see ``habit_steps``)
        and the split of every screenshot, in place of any recorded before.

        Ghosts are drawn within a split only: a Bad made of another split's words or
        screens would carry what the held-out episodes show into training.
        """
        clicked: dict[str, list[ExpertStep]] = {}
        for step in dict.fromkeys(steps):  # instruction variants repeat their episode's steps
            clicked.setdefault(step.screenshot, []).append(step)
        self._clicked, self._splits, self._pairs = clicked, dict(splits), None
        self._by_label_index.pop("clicked", None)
        self._similar_memo.clear()
        self._habit_memo.clear()

    def split_of(self, screenshot: str) -> str:
        """The split a screenshot's episode is in (``""`` when none was recorded)."""
        return self._splits.get(screenshot, "")

    def habit_steps(self, mine: ExpertStep) -> tuple[ExpertStep, ...]:
        """The expert step of a similar screen in another episode that is ``mine``'s
        layout-habit ghost (empty when it has none).

        Similar screens share most of their labelled targets (the same app or dialog in
        another episode). Another step of such a screen, proposed on ``mine``'s, acts where its
        element sits there while this screen shows nothing: the layout-habit ghost of the
        taxonomy's Visual Hallucination, in the words of a real step.

        Steps are paired, each with one step that is a ghost on its screen and on whose screen
        it is a ghost in turn, and each step is in at most one pair: then every step's words
        are as often a Good as a Bad across the corpus, and which one of a pair is proposed
        where cannot be read from the words. Left free, the ghosts would come from the later
        stages of tasks (a dialog shows what its window does not) and from a few steps that
        are absent from almost every screen, and the words alone would give the Bad away.
        """
        partner = self._partners().get(mine)
        return () if partner is None else (partner,)

    def _partners(self) -> dict[ExpertStep, ExpertStep]:
        if self._pairs is None:
            steps = sorted((s for shots in self._clicked.values() for s in shots), key=_step_rank)
            partner: dict[ExpertStep, ExpertStep] = {}
            for step in steps:
                if step in partner:
                    continue
                for other in self._mutual_ghosts(step):
                    if other not in partner:
                        partner[step], partner[other] = other, step
                        break
            self._pairs = partner
        return self._pairs

    def ghost_of(self, here: ExpertStep, other: ExpertStep) -> bool:
        """Whether ``other``, proposed on ``here``'s screen, acts on nothing that screen shows:
        its element is absent and its point is dead space, far from ``here``'s target."""
        elements = self.get(here.screenshot)
        real = target_at(elements, *here.point)
        if real is None or other.label.strip().lower() in self._labels(here.screenshot):
            return False
        point = other.point
        return target_at(elements, *point) is None and box_gap(real.box, point) >= HABIT_DISTANCE

    def _mutual_ghosts(self, mine: ExpertStep) -> list[ExpertStep]:
        found: dict[tuple[str, str], ExpertStep] = {}
        split = self.split_of(mine.screenshot)
        for shot in self._similar_screens(mine.screenshot):
            if self.split_of(shot) != split:
                continue
            for step in self._clicked[shot]:
                if step.episode == mine.episode or step.role != mine.role:
                    continue
                if self.ghost_of(mine, step) and self.ghost_of(step, mine):
                    found.setdefault((step.intent, step.calls), step)
        return sorted(found.values(), key=_step_rank)

    def _similar_screens(self, screenshot: str) -> tuple[str, ...]:
        """Screens with expert steps that share most of their labelled targets with this one
        (worked out once per screen)."""
        memo = self._similar_memo
        if screenshot in memo:
            return memo[screenshot]
        labels = self._labels(screenshot)
        near: tuple[str, ...] = ()
        if len(labels) >= HABIT_MIN_SHARED and screenshot not in self.partial:
            near = _sharing(labels, self._label_index("clicked", self._clicked), screenshot)
        memo[screenshot] = tuple(
            shot for shot in near if _jaccard(labels, self._labels(shot)) >= HABIT_STEP_SIMILARITY
        )
        return memo[screenshot]

    def _labels(self, screenshot: str, but: str | None = None) -> frozenset[str]:
        """The screen's labelled targets, lower-case, those of role ``but`` left out (cached)."""
        memo, key = self._labels_memo, (screenshot, but)
        if key not in memo:
            memo[key] = frozenset(_target_labels(self.get(screenshot), but))
        return memo[key]

    def _label_index(self, name: str, shots: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Label -> the screens of ``shots`` (complete ones) that show it, built once per name."""
        if name not in self._by_label_index:
            index: dict[str, list[str]] = {}
            for shot in sorted(shots):
                if shot not in self.partial:
                    for label in self._labels(shot):
                        index.setdefault(label, []).append(shot)
            self._by_label_index[name] = {k: tuple(v) for k, v in index.items()}
        return self._by_label_index[name]

    def get(self, screenshot: str) -> tuple[Element, ...]:
        """Elements of a screenshot (empty when unknown)."""
        return self.by_path.get(screenshot, ())


@dataclass(frozen=True, order=True)
class ExpertStep:
    """An expert step that clicks a labelled element: what a layout-habit ghost proposes."""

    episode: str
    """The episode's key (its instruction variants share it)."""
    split: str
    screenshot: str
    point: tuple[int, int]
    label: str
    role: str
    intent: str
    calls: str
    """The step's tool-call arguments as JSON (kept as text so the step is hashable)."""


def box_gap(box: tuple[int, int, int, int], point: tuple[int, int]) -> int:
    """Grid distance from a point to a box (0 inside)."""
    x1, y1, x2, y2 = box
    dx = max(x1 - point[0], 0, point[0] - x2)
    dy = max(y1 - point[1], 0, point[1] - y2)
    return max(dx, dy)


HABIT_DISTANCE = 60
"""Least grid distance between a ghost's point and the expert target's box: nearer, the point
would read as a near miss (Grounding/Spatial Error) rather than a guessed element."""

HabitGhost = tuple[str, str, int, int, int, int]
"""A layout-habit ghost: label, role and the box ``x1, y1, x2, y2`` it has on a similar screen."""
HABIT_MIN_SHARED = 2
"""Labelled targets two screens share at the least to be compared."""
HABIT_SIMILARITY = 0.6
"""Jaccard similarity of two screens' labelled targets, a list's items left out, from which on
they are the same kind of screen around that list."""
HABIT_SCREENS_PER_LABEL = 64
"""Labels on more screens than this are left out of the search for similar screens."""
HABIT_STEP_SIMILARITY = 0.3
"""Jaccard similarity of two screens' labelled targets from which on one's expert steps are
layout habits on the other (the same app or page). On sparse Android screens the navigation
bar alone reaches a third, so two apps can pair there while those labels are on no more than
``HABIT_SCREENS_PER_LABEL`` screens (a small corpus)."""
HABIT_MAX_GHOSTS = 8
"""Layout-habit ghosts kept per screen and role (the first by a hash of the label)."""


def _target_labels(elements: Iterable[Element], but: str | None = None) -> set[str]:
    return {
        e.label.strip().lower()
        for e in elements
        if e.is_target and e.label.strip() and e.role != but
    }


def _step_rank(step: ExpertStep) -> tuple[str, ExpertStep]:
    """A step's place in the pairing order: by a hash, so no name or episode goes first."""
    return _label_hash(f"{step.episode}|{step.screenshot}|{step.intent}|{step.calls}"), step


def _label_hash(label: str) -> str:
    return hashlib.sha256(label.encode("utf-8")).hexdigest()


def _sharing(
    labels: Iterable[str], by_label: dict[str, tuple[str, ...]], screenshot: str
) -> tuple[str, ...]:
    """The other screens that share at least ``HABIT_MIN_SHARED`` of ``labels``, counting only
    labels on at most ``HABIT_SCREENS_PER_LABEL`` screens: a label on very many screens (a
    menu bar, "OK") says nothing about which screens are alike, and skipping it keeps the
    search linear in the corpus."""
    overlap: dict[str, int] = {}
    for label in labels:
        shots = by_label.get(label, ())
        if len(shots) <= HABIT_SCREENS_PER_LABEL:
            for shot in shots:
                overlap[shot] = overlap.get(shot, 0) + 1
    overlap.pop(screenshot, None)
    return tuple(sorted(s for s, n in overlap.items() if n >= HABIT_MIN_SHARED))


def _jaccard(a: Set[str], b: Set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0
