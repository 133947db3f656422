"""Shared pieces of the scenarios: vocabulary, step and episode records, call formatting."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from data_gen.sample_corpus.screens import Screen

WORDS = (
    "budget",
    "invoice",
    "roadmap",
    "notes",
    "report",
    "summary",
    "minutes",
    "draft",
    "agenda",
    "photos",
    "receipts",
    "contract",
    "slides",
    "plan",
    "survey",
    "backup",
    "taxes",
    "menu",
    "itinerary",
    "results",
    "poster",
    "schedule",
    "letter",
    "checklist",
    "inventory",
    "quote",
)
EXTENSIONS = (".pdf", ".docx", ".xlsx", ".txt", ".png", ".csv")
SENTENCES = (
    "Quarterly numbers are due on Friday.",
    "Remember to book the meeting room for Tuesday.",
    "The supplier confirmed the new delivery date.",
    "Draft the reply to the customer about the refund.",
    "Move the team lunch to next week.",
    "Check the backup logs every morning.",
    "Update the price list before the sale starts.",
    "Send the slides to Maria after the review.",
)
PRODUCTS = (
    ("Wireless Mouse M185", "$19.99"),
    ("USB-C Hub 7-in-1", "$34.50"),
    ("Mechanical Keyboard K2", "$79.00"),
    ("Noise Cancelling Headphones", "$129.99"),
    ("27in 4K Monitor", "$289.00"),
    ("Laptop Stand Aluminium", "$25.90"),
    ("Webcam 1080p Pro", "$49.95"),
    ("Portable SSD 1TB", "$89.99"),
    ("Bluetooth Speaker Mini", "$29.99"),
    ("Ergonomic Office Chair", "$199.00"),
    ("Desk Lamp LED", "$22.49"),
    ("Phone Charger 30W", "$18.99"),
)
PEOPLE = (
    "Ada Moreno",
    "Ben Okafor",
    "Carla Nunes",
    "Dev Patel",
    "Elena Petrova",
    "Farid Haddad",
    "Grace Liu",
    "Hugo Martin",
    "Ines Duarte",
    "Jonas Berg",
    "Keiko Tanaka",
    "Liam Walsh",
    "Maya Cohen",
    "Nico Rossi",
    "Olga Ivanova",
    "Pablo Ruiz",
    "Quinn Baker",
    "Rosa Silva",
    "Sam Novak",
    "Tara Singh",
    "Umar Aziz",
    "Vera Lund",
    "Will Chen",
    "Xena Park",
    "Yara Saleh",
    "Zoe Adams",
)
APPS = ("Clock", "Contacts", "Settings", "Camera", "Photos", "Chrome", "Maps", "Calendar")


@dataclass
class StepSpec:
    """One generated step: the screen it acts on and the record fields it becomes."""

    screen: Screen
    think: str
    operation: str
    calls: list[str]
    targets: list[str | None]
    """Label of the element each call aims at (``None`` for calls without coordinates)."""


@dataclass
class Episode:
    """A generated episode: instruction variants share the screenshots and actions."""

    scenario: str
    platform: str
    app: str
    instructions: list[str]
    steps: list[StepSpec] = field(default_factory=list)
    outcome: str = "success"


@dataclass
class Ctx:
    """What a scenario needs: randomness, platform, screen size and the seed-derived clock."""

    rng: random.Random
    platform: str
    size: tuple[int, int]
    start_minute: int
    """Minutes after midnight shown by the clock on the first screen (derived from the seed)."""

    def clock(self, step: int) -> str:
        """The clock text of screen ``step``: one minute passes per step."""
        m = (self.start_minute + step) % (24 * 60)
        return f"{m // 60:02d}:{m % 60:02d}"


# ------------------------------------------------------------------------ call formatting


def _point(ctx: Ctx, scr: Screen, label: str) -> tuple[float, float]:
    """A unit-scale point in the middle half of the element, as a human would click it."""
    x1, y1, x2, y2 = scr.find(label).box
    fx = ctx.rng.uniform(0.3, 0.7)
    fy = ctx.rng.uniform(0.35, 0.65)
    return round((x1 + fx * (x2 - x1)) / scr.width, 4), round((y1 + fy * (y2 - y1)) / scr.height, 4)


def at(
    ctx: Ctx, scr: Screen, name: str, label: str, lead: str = "", tail: str = ""
) -> tuple[str, str]:
    """``name([lead, ]x=…, y=…[, tail])`` aimed at ``label``; returns (call, target label)."""
    x, y = _point(ctx, scr, label)
    head = f"{lead}, " if lead else ""
    end = f", {tail}" if tail else ""
    return f"{name}({head}x={x}, y={y}{end})", label


def step(scr: Screen, think: str, operation: str, *calls: tuple[str, str | None] | str) -> StepSpec:
    """A step from calls given as ``(call, target)`` pairs or plain call strings (no target)."""
    pairs = [c if isinstance(c, tuple) else (c, None) for c in calls]
    return StepSpec(scr, think, operation, [c for c, _ in pairs], [t for _, t in pairs])


def terminate(ok: bool, rng: random.Random, info: str | None = None) -> str:
    """A final ``terminate`` call; failures use both spellings the real data has."""
    status = "success" if ok else rng.choice(("failure", "fail"))
    return f"terminate(status={status!r}, info={info!r})"


def file_names(rng: random.Random, n: int) -> list[str]:
    names = {
        f"{rng.choice(WORDS)}_{rng.randint(1, 99)}{rng.choice(EXTENSIONS)}" for _ in range(n * 2)
    }
    return sorted(names)[:n]
