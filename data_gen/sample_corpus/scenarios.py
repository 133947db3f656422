"""Coherent multi-step tasks on synthetic screens, one function per scenario.

Every scenario renders the screen before each step, picks the action that a careful human would
take on *that* screen (coordinates inside the target element), and renders the next screen with
the effect of the action (a menu opens, a dialog appears, a field fills, a list scrolls). Each step
records which element every call aims at, so tests can check that ingested coordinates land
inside the right box.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from data_gen.sample_corpus.screens import (
    Box,
    Screen,
    browser,
    desktop,
    font,
    phone,
    status_bar,
)

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


def at(ctx: Ctx, scr: Screen, name: str, label: str, lead: str = "") -> tuple[str, str]:
    """``name([lead, ]x=…, y=…)`` aimed at ``label``; returns (call, target label)."""
    x, y = _point(ctx, scr, label)
    head = f"{lead}, " if lead else ""
    return f"{name}({head}x={x}, y={y})", label


def step(scr: Screen, think: str, operation: str, *calls: tuple[str, str | None] | str) -> StepSpec:
    """A step from calls given as ``(call, target)`` pairs or plain call strings (no target)."""
    pairs = [c if isinstance(c, tuple) else (c, None) for c in calls]
    return StepSpec(scr, think, operation, [c for c, _ in pairs], [t for _, t in pairs])


def terminate(ok: bool, rng: random.Random, info: str | None = None) -> str:
    """A final ``terminate`` call; failures use both spellings the real data has."""
    status = "success" if ok else rng.choice(("failure", "fail"))
    return f"terminate(status={status!r}, info={info!r})"


def _file_names(rng: random.Random, n: int) -> list[str]:
    names = {
        f"{rng.choice(WORDS)}_{rng.randint(1, 99)}{rng.choice(EXTENSIONS)}" for _ in range(n * 2)
    }
    return sorted(names)[:n]


# ------------------------------------------------------------------------ desktop


def _app_name(platform: str, kind: str) -> str:
    table = {
        "editor": {"windows": "Notepad", "mac": "TextEdit", "ubuntu": "Text Editor"},
        "files": {"windows": "File Explorer", "mac": "Finder", "ubuntu": "Files"},
    }
    return table[kind][platform]


def _document(scr: Screen, box: Box, lines: list[str], selected: bool = False) -> None:
    for i, line in enumerate(lines):
        y = box[1] + scr.u(24) + i * scr.u(24)
        if selected:
            width = scr.draw.textlength(line, font=font(scr.u(14)))
            scr.rect(
                (box[0] + scr.u(14), y - scr.u(10), box[0] + scr.u(18) + width, y + scr.u(10)),
                "#9ec5f0",
            )
        scr.text((box[0] + scr.u(16), y), line, 14, "#111111")
    scr.element(
        "Document", "document", (box[0], box[1], box[2], box[1] + scr.u(24) * (len(lines) + 1))
    )


def save_as(ctx: Ctx) -> Episode:
    """Editor: File menu → Save As… → type the name and press Enter in the dialog."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "editor")
    name = f"{rng.choice(WORDS)}_{rng.randint(2, 30)}.txt"
    lines = rng.sample(SENTENCES, 5)

    def frame(k: int, title: str, status: str, menu: bool = False, dialog: str | None = None):
        scr, content = desktop(p, w, h, ctx.clock(k), f"{title} - {app}")
        content = status_bar(scr, content, status)
        _document(scr, content, lines)
        if menu:
            f = scr.find("File").box
            scr.dropdown(f[0], f[3], ["New", "Open...", "Save", "Save As...", "Exit"])
        if dialog is not None:
            body = scr.dialog(520, 260, "Save As")
            scr.rows(
                (body[0], body[1], body[2], body[1] + scr.u(110)),
                ["Desktop", "Documents", "Downloads"],
                0,
                34,
                role="folder",
                selected="Documents",
            )
            y = body[1] + scr.u(126)
            scr.text((body[0], y + scr.u(14)), "File name:", 13)
            scr.field((body[0] + scr.u(90), y, body[2], y + scr.u(28)), "File name", dialog, True)
            scr.button(
                (body[2] - scr.u(200), body[3] - scr.u(34), body[2] - scr.u(110), body[3]),
                "Save",
                primary=True,
            )
            scr.button((body[2] - scr.u(96), body[3] - scr.u(34), body[2], body[3]), "Cancel")
        return scr

    s0 = frame(0, "Untitled", "Ln 1, Col 1")
    s1 = frame(1, "Untitled", "Ln 1, Col 1", menu=True)
    s2 = frame(2, "Untitled", "Ln 1, Col 1", dialog="")
    s3 = frame(3, name, f"Saved {name}")
    ep = Episode(
        "save_as",
        p,
        app,
        [
            f"Save the current document as {name}.",
            f"Use Save As to store this note under the name {name}.",
            f"In {app}, save the open text with the file name {name}.",
        ],
    )
    ep.steps = [
        step(
            s0,
            f"{app} shows an unsaved document titled Untitled. Saving under a new name starts "
            "from the File menu in the menu bar.",
            "Open the File menu in the menu bar",
            at(ctx, s0, "click", "File"),
        ),
        step(
            s1,
            "The File menu is open and lists Save As..., which lets me choose the name.",
            "Click Save As... in the File menu",
            at(ctx, s1, "click", "Save As..."),
        ),
        step(
            s2,
            "The Save As dialog is open with the file name field focused and empty.",
            f"Type {name} into the file name field and press Enter to save",
            f"write(message={name!r})",
            "press(keys='enter')",
        ),
        step(
            s3,
            f"The title bar now reads {name}, so the document was saved.",
            "The document is saved, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def open_file(ctx: Ctx) -> Episode:
    """File manager: scroll a long list, open a file and report its size (or fail if absent)."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "files")
    files = _file_names(rng, 34)
    sizes = [f"{rng.randint(2, 900)} KB" for _ in files]
    missing = rng.random() < 0.3
    target = (
        "quarterly_review.pptx" if missing else files[rng.randint(len(files) // 2, len(files) - 2)]
    )

    def frame(k: int, offset: int, opened: bool = False):
        scr, content = desktop(p, w, h, ctx.clock(k), f"Documents - {app}")
        content = status_bar(scr, content, f"{len(files)} items")
        box = (
            content[0] + scr.u(10),
            content[1] + scr.u(10),
            content[2] - scr.u(10),
            content[3] - scr.u(10),
        )
        scr.rows(box, files, offset, 30, role="file", details=sizes)
        if opened:
            body = scr.dialog(420, 200, f"{target} Properties")
            scr.text((body[0], body[1] + scr.u(30)), f"Name: {target}", 13)
            scr.text((body[0], body[1] + scr.u(60)), f"Size: {sizes[files.index(target)]}", 13)
            scr.button((body[2] - scr.u(90), body[3] - scr.u(34), body[2], body[3]), "OK", True)
        return scr

    s0 = frame(0, 0)
    visible = sum(1 for e in s0.elements if e.role == "file")
    last = max(0, len(files) - visible)
    shift = last if missing else min(last, files.index(target) - visible + 3)
    s1 = frame(1, shift)
    ep = Episode(
        "open_file",
        p,
        app,
        [
            f"Open {target} from the Documents folder and tell me its size.",
            f"What is the size of the file {target} in Documents?",
            f"Find {target} in {app} and report how large it is.",
        ],
    )
    # pyautogui convention: negative clicks scroll the view down (one click = one row here).
    scroll = at(ctx, s0, "scroll", "list", f"clicks={-shift}")
    ep.steps = [
        step(
            s0,
            f"The Documents folder lists {len(files)} files sorted by name; {target} is "
            "not visible yet, so I need to scroll down the list.",
            "Scroll down the file list to reveal more files",
            scroll,
        )
    ]
    if missing:
        ep.outcome = "failure"
        ep.steps.append(
            step(
                s1,
                f"The list is at its end and {target} is not in the folder.",
                f"Stop, because {target} does not exist in this folder",
                terminate(False, rng, f"{target} is not in Documents"),
            )
        )
        return ep
    s2 = frame(2, shift, opened=True)
    s3 = frame(3, shift, opened=True)
    size = sizes[files.index(target)]
    ep.steps += [
        step(
            s1,
            f"{target} is now visible in the list.",
            f"Double-click {target} to open it",
            at(ctx, s1, "doubleClick", target),
        ),
        step(
            s2,
            f"The properties dialog shows the size {size}.",
            f"Report that the size is {size}",
            f"response(answer={size!r})",
        ),
        step(s3, "The answer has been given.", "The task is complete", terminate(True, rng)),
    ]
    return ep


def drag_file(ctx: Ctx) -> Episode:
    """File manager: drag a file from the list onto a sidebar folder (moveTo + dragTo)."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "files")
    files = _file_names(rng, 8)
    target = rng.choice(files)
    folder = rng.choice(("Archive", "Projects", "Shared"))

    def frame(k: int, items: list[str], status: str):
        scr, content = desktop(p, w, h, ctx.clock(k), f"Downloads - {app}")
        content = status_bar(scr, content, status)
        side = (
            content[0] + scr.u(8),
            content[1] + scr.u(8),
            content[0] + scr.u(200),
            content[3] - scr.u(8),
        )
        scr.rows(
            side,
            ["Desktop", "Downloads", "Archive", "Projects", "Shared"],
            0,
            32,
            role="folder",
            selected="Downloads",
        )
        scr.rows(
            (side[2] + scr.u(10), side[1], content[2] - scr.u(8), side[3]),
            items,
            0,
            30,
            role="file",
        )
        return scr

    s0 = frame(0, files, f"{len(files)} items")
    s1 = frame(1, [f for f in files if f != target], f"Moved 1 item to {folder}")
    ep = Episode(
        "drag_file",
        p,
        app,
        [
            f"Move {target} from Downloads into the {folder} folder by dragging it.",
            f"Drag the file {target} onto {folder} in the sidebar.",
        ],
    )
    ep.steps = [
        step(
            s0,
            f"{target} is in the Downloads list and {folder} is in the sidebar.",
            f"Drag {target} onto the {folder} folder in the sidebar",
            at(ctx, s0, "moveTo", target),
            at(ctx, s0, "dragTo", folder),
        ),
        step(
            s1,
            f"The status bar confirms the file was moved to {folder}.",
            "The file has been moved, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def copy_text(ctx: Ctx) -> Episode:
    """Editor: click into the text, select all and copy with positional ``hotkey`` calls."""
    p, (w, h), rng = ctx.platform, ctx.size, ctx.rng
    app = _app_name(p, "editor")
    mod = "command" if p == "mac" else "ctrl"
    lines = rng.sample(SENTENCES, 4)

    def frame(k: int, selected: bool, status: str):
        scr, content = desktop(p, w, h, ctx.clock(k), f"notes.txt - {app}")
        content = status_bar(scr, content, status)
        _document(scr, content, lines, selected)
        return scr

    s0 = frame(0, False, "Ln 1, Col 1")
    s1 = frame(1, False, "Ln 2, Col 8")
    s2 = frame(2, True, f"{len(lines)} lines selected")
    s3 = frame(3, True, "Copied to clipboard")
    ep = Episode(
        "copy_text",
        p,
        app,
        [
            "Copy the whole text of notes.txt to the clipboard.",
            "Select everything in the open note and copy it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The note is open; the text area needs focus before the shortcut works.",
            "Click inside the document text to focus it",
            at(ctx, s0, "click", "Document"),
        ),
        step(
            s1,
            "The caret is in the document.",
            "Select all text with the keyboard shortcut",
            f"hotkey({mod!r}, 'a')",
        ),
        step(s2, "All lines are highlighted.", "Copy the selected text", f"hotkey({mod!r}, 'c')"),
        step(
            s3,
            "The status bar says the text was copied.",
            "The text is copied, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


# ------------------------------------------------------------------------ web


def _shop_header(scr: Screen, page: Box, query: str, focused: bool) -> None:
    u = scr.u
    scr.rect((page[0], page[1], page[2], page[1] + u(64)), "#232f3e")
    scr.text((u(24), page[1] + u(32)), "ShopLite", 22, "#ffffff")
    scr.element("ShopLite", "link", (u(16), page[1] + u(12), u(130), page[1] + u(52)))
    scr.field(
        (u(180), page[1] + u(16), page[2] - u(260), page[1] + u(48)),
        "Search products",
        query,
        focused,
    )
    scr.button(
        (page[2] - u(250), page[1] + u(16), page[2] - u(160), page[1] + u(48)), "Search", True
    )
    scr.button((page[2] - u(140), page[1] + u(16), page[2] - u(24), page[1] + u(48)), "Cart (0)")


def web_search(ctx: Ctx) -> Episode:
    """Shop: search, swipe the results (finger direction), open one, answer its price."""
    (w, h), rng = ctx.size, ctx.rng
    products = rng.sample(PRODUCTS, 10)
    missing = rng.random() < 0.25
    query = "vintage typewriter" if missing else products[rng.randint(6, 9)][0]
    url = "http://shoplite.test/"

    def frame(
        k: int,
        q: str,
        focused: bool,
        results: int | None,
        offset: int = 0,
        product: tuple[str, str] | None = None,
    ):
        scr, page = browser(
            w,
            h,
            ctx.clock(k),
            url + (f"search?q={q.replace(' ', '+')}" if results is not None else ""),
            "ShopLite",
        )
        _shop_header(scr, page, q, focused)
        body = (page[0] + scr.u(24), page[1] + scr.u(80), page[2] - scr.u(24), page[3] - scr.u(16))
        if product is not None:
            scr.text((body[0], body[1] + scr.u(30)), product[0], 22)
            scr.text((body[0], body[1] + scr.u(70)), f"Price: {product[1]}", 18, "#b12704")
            scr.button(
                (body[0], body[1] + scr.u(100), body[0] + scr.u(160), body[1] + scr.u(136)),
                "Add to cart",
                True,
            )
        elif results == 0:
            scr.text((body[0], body[1] + scr.u(30)), f'No results for "{q}".', 18)
        elif results is not None:
            scr.rows(
                body,
                [n for n, _ in products],
                offset,
                72,
                role="link",
                details=[pr for _, pr in products],
            )
        else:
            scr.text((body[0], body[1] + scr.u(30)), "Deals of the day", 20)
        return scr

    s0 = frame(0, "", False, None)
    s1 = frame(1, "", True, None)
    ep = Episode(
        "web_search",
        "web",
        "ShopLite",
        [
            f"Find the price of '{query}' on ShopLite.",
            f"Search ShopLite for {query} and tell me how much it costs.",
            f"How much is the {query} on the ShopLite store?",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The ShopLite home page has a search box at the top.",
            "Click the search box",
            at(ctx, s0, "click", "Search products"),
        ),
        step(
            s1,
            "The search box is focused.",
            f"Type {query} and press Enter to search",
            f"write(message={query!r})",
            "press(keys='enter')",
        ),
    ]
    if missing:
        ep.outcome = "failure"
        s2 = frame(2, query, False, 0)
        ep.steps.append(
            step(
                s2,
                "The store has no results for this product.",
                "Give up, the product is not sold here",
                terminate(False, rng, "no results"),
            )
        )
        return ep
    s2 = frame(2, query, False, len(products))
    visible = sum(1 for e in s2.elements if e.role == "link" and e.label != "ShopLite")
    shift = max(0, min(len(products) - visible, products.index((query, dict(products)[query])) - 1))
    s3 = frame(3, query, False, len(products), shift)
    price = dict(products)[query]
    s4 = frame(4, query, False, None, product=(query, price))
    s5 = frame(5, query, False, None, product=(query, price))
    ep.steps += [
        step(
            s2,
            "The results list is longer than the page; the product is further down.",
            "Scroll down the results page",
            "swipe(direction='up', amount=0.5)",
        ),
        step(
            s3,
            f"{query} is now visible in the results.",
            f"Open the result {query}",
            at(ctx, s3, "click", query),
        ),
        step(
            s4,
            f"The product page shows the price {price}.",
            f"Answer that it costs {price}",
            f"response(answer={price!r})",
        ),
        step(s5, "The price has been reported.", "The task is complete", terminate(True, rng)),
    ]
    return ep


def web_form(ctx: Ctx) -> Episode:
    """Contact form: click + type into two fields (multi-call steps), tick a box, submit."""
    (w, h), rng = ctx.size, ctx.rng
    name = rng.choice(PEOPLE)
    email = name.split()[0].lower() + "@example.org"

    def frame(k: int, n: str, e: str, agreed: bool, sent: bool = False):
        scr, page = browser(w, h, ctx.clock(k), "http://helpdesk.test/contact", "Contact us")
        u = scr.u
        x0, y = page[0] + u(80), page[1] + u(40)
        if sent:
            scr.text((x0, y), f"Thanks, {n}! Your message was sent.", 22)
            scr.button((x0, y + u(40), x0 + u(180), y + u(76)), "Back to home")
            return scr
        scr.text((x0, y), "Contact us", 24)
        for i, (label, value) in enumerate((("Full name", n), ("Email address", e))):
            top = y + u(50) + i * u(70)
            scr.text((x0, top), label, 13)
            scr.field((x0, top + u(14), x0 + u(420), top + u(46)), label, value)
        scr.checkbox(x0, y + u(200), "I agree to the privacy policy", agreed)
        scr.button((x0, y + u(240), x0 + u(120), y + u(276)), "Submit", True)
        return scr

    s0 = frame(0, "", "", False)
    s1 = frame(1, name, "", False)
    s2 = frame(2, name, email, False)
    s3 = frame(3, name, email, True)
    s4 = frame(4, name, email, True, sent=True)
    ep = Episode(
        "web_form",
        "web",
        "Helpdesk",
        [
            f"Submit the contact form as {name} with email {email}.",
            f"Fill in the helpdesk contact form for {name} ({email}) and send it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The contact form is empty.",
            f"Enter {name} in the Full name field",
            at(ctx, s0, "click", "Full name"),
            f"write(message={name!r})",
        ),
        step(
            s1,
            "The name is filled in; the email field is next.",
            f"Enter {email} in the Email address field",
            at(ctx, s1, "click", "Email address"),
            f"write(message={email!r})",
        ),
        step(
            s2,
            "Both fields are filled; the privacy checkbox must be ticked before submitting.",
            "Tick the privacy policy checkbox",
            at(ctx, s2, "click", "I agree to the privacy policy"),
        ),
        step(s3, "The checkbox is ticked.", "Click Submit", at(ctx, s3, "click", "Submit")),
        step(
            s4,
            "The confirmation message is shown.",
            "The form was sent, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


# ------------------------------------------------------------------------ android


def _home(scr: Screen, box: Box) -> None:
    u = scr.u
    for i, app in enumerate(APPS):
        col, row = i % 4, i // 4
        x = box[0] + u(30) + col * u(124)
        y = box[1] + u(60) + row * u(140)
        scr.rect((x, y, x + u(88), y + u(88)), "#d0bcff", radius=24)
        scr.text_centered((x, y, x + u(88), y + u(88)), app[:2], 26, "#21005d")
        scr.text_centered((x - u(16), y + u(92), x + u(104), y + u(118)), app, 15)
        scr.element(app, "icon", (x, y, x + u(88), y + u(118)))


def set_alarm(ctx: Ctx) -> Episode:
    """Clock app: open it, add an alarm, type a label, save."""
    (w, h), rng = ctx.size, ctx.rng
    hour, minute = rng.choice((6, 7, 8)), rng.choice((0, 15, 30, 45))
    label = rng.choice(("Gym", "Meds", "Standup", "School run", "Call mum"))
    when = f"{hour}:{minute:02d} AM"

    def frame(k: int, view: str, text: str = "", alarms: tuple[str, ...] = ("6:00 AM", "9:30 AM")):
        scr, box = phone(w, h, ctx.clock(k))
        u = scr.u
        if view == "home":
            _home(scr, box)
            return scr
        scr.text((box[0] + u(24), box[1] + u(40)), "Alarm", 26)
        if view == "new":
            scr.text((box[0] + u(24), box[1] + u(120)), when, 40)
            scr.field(
                (box[0] + u(24), box[1] + u(200), box[2] - u(24), box[1] + u(256)),
                "Label",
                text,
                focused=bool(text),
            )
            scr.button(
                (box[2] - u(240), box[1] + u(300), box[2] - u(140), box[1] + u(350)), "Cancel"
            )
            scr.button(
                (box[2] - u(124), box[1] + u(300), box[2] - u(24), box[1] + u(350)), "Save", True
            )
            return scr
        scr.rows(
            (box[0] + u(16), box[1] + u(80), box[2] - u(16), box[3] - u(140)),
            list(alarms),
            0,
            88,
            role="alarm",
        )
        scr.button((box[2] - u(110), box[3] - u(120), box[2] - u(30), box[3] - u(40)), "+")
        return scr

    s0 = frame(0, "home")
    s1 = frame(1, "list")
    s2 = frame(2, "new")
    s3 = frame(3, "new", label)
    s4 = frame(4, "list", alarms=("6:00 AM", "9:30 AM", f"{when}  {label}"))
    ep = Episode(
        "set_alarm",
        "android",
        "Clock",
        [
            f"Set an alarm for {when} labelled {label}.",
            f"Create a {when} alarm called {label} in the Clock app.",
            f"Add a new alarm at {when} with the label {label}.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The home screen shows the Clock app icon.",
            "Open the Clock app",
            at(ctx, s0, "click", "Clock"),
        ),
        step(
            s1,
            "The Alarm list is open; the + button adds a new alarm.",
            "Tap the + button to create a new alarm",
            at(ctx, s1, "click", "+"),
        ),
        step(
            s2,
            f"The new alarm is set to {when}; the label is still empty.",
            f"Tap the Label field and type {label}",
            at(ctx, s2, "click", "Label"),
            f"write(message={label!r})",
        ),
        step(s3, "The label is filled in.", "Tap Save", at(ctx, s3, "click", "Save")),
        step(
            s4,
            f"The list now contains the {when} alarm labelled {label}.",
            "The alarm is set, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep


def find_contact(ctx: Ctx) -> Episode:
    """Contacts: open the app, swipe the list (from/to coordinates), read a phone number."""
    (w, h), rng = ctx.size, ctx.rng
    people = sorted(rng.sample(PEOPLE, 20))
    missing = rng.random() < 0.25
    person = "Zack Tremont" if missing else people[rng.randint(12, 19)]
    phones = [f"+1 555 01{rng.randint(10, 99)}" for _ in people]

    def frame(k: int, view: str, offset: int = 0):
        scr, box = phone(w, h, ctx.clock(k))
        u = scr.u
        if view == "home":
            _home(scr, box)
        elif view == "list":
            scr.text((box[0] + u(24), box[1] + u(36)), "Contacts", 26)
            scr.rows(
                (box[0] + u(8), box[1] + u(72), box[2] - u(8), box[3] - u(8)),
                people,
                offset,
                64,
                role="contact",
            )
        else:
            scr.text((box[0] + u(24), box[1] + u(60)), person, 28)
            scr.text(
                (box[0] + u(24), box[1] + u(120)), f"Mobile {phones[people.index(person)]}", 18
            )
            scr.button(
                (box[0] + u(24), box[1] + u(160), box[0] + u(164), box[1] + u(210)), "Call", True
            )
        return scr

    s0 = frame(0, "home")
    s1 = frame(1, "list")
    lst = s1.find("list").box
    visible = sum(1 for e in s1.elements if e.role == "contact")
    shift = len(people) - visible
    # The finger moves up by exactly `shift` rows, so the next screen shows the list that far down.
    fy, ty = 0.8, 0.8 - shift * s1.u(64) / h
    fx = round((lst[0] + lst[2]) / 2 / w, 4)
    swipe = (f"swipe(from_coord=[{fx}, {fy}], to_coord=[{fx}, {round(ty, 4)}])", "list")
    s2 = frame(2, "list", shift)
    ep = Episode(
        "find_contact",
        "android",
        "Contacts",
        [
            f"Look up the mobile number of {person} in Contacts.",
            f"What is {person}'s phone number?",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The home screen is visible.",
            "Open the Contacts app",
            "open_app(app_name='Contacts')",
        ),
        step(
            s1,
            f"The contact list is alphabetical and {person} is further down.",
            "Swipe up on the list to scroll down",
            swipe,
        ),
    ]
    if missing:
        ep.outcome = "failure"
        s3 = frame(3, "home")
        ep.steps += [
            step(
                s2,
                f"The end of the list is reached and {person} is not there.",
                "Go back, the contact does not exist",
                "navigate_back()",
            ),
            step(
                s3,
                "Back on the home screen; the contact could not be found.",
                "Stop, the contact is not saved",
                terminate(False, rng),
            ),
        ]
        return ep
    number = phones[people.index(person)]
    s3, s4 = frame(3, "detail"), frame(4, "detail")
    ep.steps += [
        step(s2, f"{person} is now visible.", f"Tap {person}", at(ctx, s2, "click", person)),
        step(
            s3,
            f"The contact page shows the number {number}.",
            f"Answer {number}",
            f"response(answer={number!r})",
        ),
        step(s4, "The number has been reported.", "The task is complete", terminate(True, rng)),
    ]
    return ep


Scenario = Callable[[Ctx], Episode]

SCENARIOS: dict[str, tuple[Scenario, ...]] = {
    "windows": (save_as, open_file, drag_file, copy_text),
    "mac": (save_as, open_file, drag_file, copy_text),
    "ubuntu": (save_as, open_file, drag_file, copy_text),
    "web": (web_search, web_form),
    "android": (set_alarm, find_contact),
}
