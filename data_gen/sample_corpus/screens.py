"""PIL drawing of synthetic GUI screens that remember where every interactive element is.

A ``Screen`` is a canvas plus the list of elements drawn on it (label, role, pixel box). Scenario
code composes screens from the widgets below and the platform chrome (taskbar, menu bar, dock,
browser bar, phone status bar); the element list becomes the sidecar the tests check actions
against. Drawing uses only the font bundled with Pillow, so output is identical on every machine
with the same Pillow version.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

Box = tuple[int, int, int, int]

# Colours per platform theme: (desktop background, window title bar, title text, accent).
THEMES: dict[str, tuple[str, str, str, str]] = {
    "windows": ("#1f4e79", "#f3f3f3", "#1b1b1b", "#0067c0"),
    "mac": ("#6b5b95", "#e8e6e8", "#2b2b2b", "#0a84ff"),
    "ubuntu": ("#4a1e3a", "#303030", "#f2f2f2", "#e95420"),
    "web": ("#dee1e6", "#ffffff", "#202124", "#1a73e8"),
    "android": ("#fafafa", "#ffffff", "#1d1b20", "#6750a4"),
}


@functools.lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The bundled Pillow font at ``size`` pixels (cached; creating fonts is slow)."""
    return ImageFont.load_default(size=max(8, size))


@dataclass(frozen=True)
class Element:
    """One interactive thing on a screen: what it says, what it is, and where (pixels)."""

    label: str
    role: str
    box: Box
    text: str | None = None
    """What is drawn for it where that is not ``label`` (a glyph; "" for nothing legible)."""

    def grid_box(self, width: int, height: int) -> list[int]:
        """The box on the 0–1000 grid of the screenshot (floor/ceil so it never shrinks)."""
        x1, y1, x2, y2 = self.box
        return [
            x1 * 1000 // width,
            y1 * 1000 // height,
            -(-x2 * 1000 // width),
            -(-y2 * 1000 // height),
        ]


class Screen:
    """A canvas of ``width`` × ``height`` pixels plus the elements drawn on it."""

    def __init__(self, width: int, height: int, background: str, unit: float) -> None:
        self.width = width
        self.height = height
        self.image = Image.new("RGB", (width, height), background)
        self.draw = ImageDraw.Draw(self.image)
        self.elements: list[Element] = []
        # One "unit" is one pixel of the reference layout (720 px desktop height, 540 px phone
        # width); every size below is multiplied by it so layouts scale with the screen.
        self.unit = unit

    def u(self, value: float) -> int:
        """``value`` reference pixels in this screen's pixels."""
        return max(1, round(value * self.unit))

    def element(self, label: str, role: str, box: Box, text: str | None = None) -> Element:
        """Register an element (drawn by the caller); ``text``: what is drawn for it where that
        is not ``label`` (a glyph, or "" for nothing legible)."""
        el = Element(label, role, tuple(int(v) for v in box), text)  # type: ignore[arg-type]
        self.elements.append(el)
        return el

    def find(self, label: str) -> Element:
        """The last element drawn with ``label`` (scenarios target elements by label)."""
        for el in reversed(self.elements):
            if el.label == label:
                return el
        raise KeyError(f"no element labelled {label!r} on this screen")

    # ---------------------------------------------------------------- primitives

    def text(self, xy: tuple[float, float], text: str, size: float, fill: str = "#202020") -> None:
        """Draw ``text`` with its left/middle at ``xy`` (size in reference pixels)."""
        self.draw.text(xy, text, font=font(self.u(size)), fill=fill, anchor="lm")

    def text_centered(self, box: Box, text: str, size: float, fill: str = "#202020") -> None:
        """Draw ``text`` centred in ``box``."""
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        self.draw.text((cx, cy), text, font=font(self.u(size)), fill=fill, anchor="mm")

    def rect(self, box: Box, fill: str, outline: str | None = None, radius: float = 0) -> None:
        """A (rounded) rectangle; ``radius`` in reference pixels."""
        self.draw.rounded_rectangle(
            box,
            radius=self.u(radius) if radius else 0,
            fill=fill,
            outline=outline,
            width=max(1, self.u(1)),
        )

    # ---------------------------------------------------------------- widgets

    def button(self, box: Box, label: str, primary: bool = False, role: str = "button") -> Element:
        """A push button with its label centred."""
        fill, ink = ("#0067c0", "#ffffff") if primary else ("#fdfdfd", "#1b1b1b")
        self.rect(box, fill, outline="#8a8a8a", radius=4)
        self.text_centered(box, label, 13, ink)
        return self.element(label, role, box)

    def field(self, box: Box, label: str, value: str, focused: bool = False) -> Element:
        """A one-line text field; empty fields show ``label`` as a grey placeholder."""
        self.rect(box, "#ffffff", outline="#0067c0" if focused else "#9a9a9a", radius=3)
        mid = (box[1] + box[3]) / 2
        if value:
            self.text((box[0] + self.u(8), mid), value, 13, "#111111")
        else:
            self.text((box[0] + self.u(8), mid), label, 13, "#8c8c8c")
        if focused:
            # The caret sits after the text so a filled field looks different from a focused one.
            width = self.draw.textlength(value, font=font(self.u(13))) if value else 0
            cx = box[0] + self.u(9) + width
            self.draw.line(
                (cx, box[1] + self.u(6), cx, box[3] - self.u(6)),
                fill="#111111",
                width=max(1, self.u(1)),
            )
        return self.element(label, "textbox", box)

    def checkbox(self, x: int, y: int, label: str, checked: bool) -> Element:
        """A checkbox with its label; the element covers box and label."""
        s = self.u(16)
        self.rect(
            (x, y, x + s, y + s), "#0067c0" if checked else "#ffffff", outline="#6b6b6b", radius=2
        )
        if checked:
            self.draw.line(
                (x + s * 0.2, y + s * 0.5, x + s * 0.45, y + s * 0.75, x + s * 0.8, y + s * 0.25),
                fill="#ffffff",
                width=max(1, self.u(2)),
            )
        self.text((x + s + self.u(8), y + s / 2), label, 13)
        width = self.draw.textlength(label, font=font(self.u(13)))
        return self.element(label, "checkbox", (x, y, int(x + s + self.u(8) + width), y + s))

    def rows(
        self,
        box: Box,
        items: list[str],
        offset: int,
        row_height: float,
        role: str = "listitem",
        selected: str | None = None,
        details: list[str] | None = None,
    ) -> list[Element]:
        """A scrollable list showing ``items[offset:]`` inside ``box``, with a scrollbar."""
        self.rect(box, "#ffffff", outline="#c8c8c8")
        rh = self.u(row_height)
        visible = max(1, (box[3] - box[1]) // rh)
        out = []
        for i, item in enumerate(items[offset : offset + visible]):
            top = box[1] + i * rh
            row = (box[0] + 1, top, box[2] - self.u(12), top + rh)
            if item == selected:
                self.rect(row, "#cce4f7")
            elif i % 2:
                self.rect(row, "#f7f7f7")
            self.text((row[0] + self.u(10), top + rh / 2), item, 13)
            if details:
                self.text((row[2] - self.u(120), top + rh / 2), details[offset + i], 12, "#6b6b6b")
            out.append(self.element(item, role, row))
        # Scrollbar thumb: its position is what makes a scroll visible in the next screenshot.
        track = (box[2] - self.u(10), box[1] + 2, box[2] - 2, box[3] - 2)
        self.rect(track, "#eeeeee")
        if len(items) > visible:
            span = track[3] - track[1]
            t0 = track[1] + span * offset // len(items)
            t1 = track[1] + span * min(len(items), offset + visible) // len(items)
            self.rect((track[0], t0, track[2], t1), "#9a9a9a", radius=3)
        self.element("list", "list", box)
        return out

    def spinner(self, cx: int, cy: int, label: str, radius: float = 28) -> Element:
        """A loading spinner with ``label`` under it; the element (role ``progress``) is the arc."""
        r = self.u(radius)
        self.draw.arc((cx - r, cy - r, cx + r, cy + r), 0, 270, fill="#1a73e8", width=self.u(6))
        self.text_centered(
            (cx - self.u(150), cy + r, cx + self.u(150), cy + r + self.u(40)), label, 16
        )
        return self.element(label, "progress", (cx - r, cy - r, cx + r, cy + r))

    def progress_bar(self, box: Box, fraction: float, label: str) -> Element:
        """A determinate progress bar, ``fraction`` full, with ``label`` (role ``progress``)."""
        self.rect(box, "#e6e6e6", outline="#9a9a9a", radius=3)
        fill = box[0] + int((box[2] - box[0]) * fraction)
        if fill > box[0]:
            self.rect((box[0], box[1], fill, box[3]), "#2e9d4f", radius=3)
        return self.element(label, "progress", box, text="")  # the bar alone is drawn

    def disabled_button(self, box: Box, label: str) -> Element:
        """A greyed-out button: visible but not clickable while something is busy."""
        self.rect(box, "#eeeeee", outline="#c4c4c4", radius=4)
        self.text_centered(box, label, 13, "#a0a0a0")
        return self.element(label, "button_disabled", box)

    def dropdown(self, x: int, y: int, items: list[str]) -> list[Element]:
        """An open menu below ``(x, y)``."""
        rh, w = self.u(26), self.u(180)
        self.rect((x + 3, y + 3, x + w + 3, y + rh * len(items) + 3), "#9a9a9a")  # shadow
        self.rect((x, y, x + w, y + rh * len(items)), "#ffffff", outline="#b0b0b0")
        out = []
        for i, item in enumerate(items):
            row = (x, y + i * rh, x + w, y + (i + 1) * rh)
            self.text((x + self.u(12), row[1] + rh / 2), item, 13)
            out.append(self.element(item, "menuitem", row))
        return out

    def dialog(self, width: float, height: float, title: str) -> Box:
        """A modal dialog centred on screen; returns its content box."""
        w, h = self.u(width), self.u(height)
        x0, y0 = (self.width - w) // 2, (self.height - h) // 2
        self.rect((x0 + 4, y0 + 4, x0 + w + 4, y0 + h + 4), "#555555")  # shadow
        self.rect((x0, y0, x0 + w, y0 + h), "#f6f6f6", outline="#7a7a7a", radius=6)
        bar = self.u(34)
        self.text((x0 + self.u(14), y0 + bar / 2), title, 14, "#111111")
        self.element(title, "dialog", (x0, y0, x0 + w, y0 + h))
        return (x0 + self.u(14), y0 + bar, x0 + w - self.u(14), y0 + h - self.u(10))

    def grid_elements(self) -> list[dict]:
        """Sidecar form: every element with its box on the 0–1000 grid."""
        out = []
        for e in self.elements:
            row = {"label": e.label, "role": e.role, "box": e.grid_box(self.width, self.height)}
            if e.text is not None:
                row["text"] = e.text
            out.append(row)
        return out


# -------------------------------------------------------------------- platform chrome


def desktop(
    platform: str,
    width: int,
    height: int,
    clock: str,
    title: str,
    menus: tuple[str, ...] = ("File", "Edit", "View", "Help"),
) -> tuple[Screen, Box]:
    """A desktop with one maximised application window; returns the window's content box.

    Windows gets a bottom taskbar with the clock, macOS a top menu bar and a dock, Ubuntu a top
    bar with the clock in the middle and a dock on the left.
    """
    bg, bar_fill, bar_ink, _ = THEMES[platform]
    scr = Screen(width, height, bg, unit=height / 720)
    u = scr.u
    left, top, right, bottom = 0, 0, width, height
    if platform == "windows":
        bottom = height - u(40)
        scr.rect((0, bottom, width, height), "#e9eef5")
        scr.button((u(6), bottom + u(6), u(70), height - u(6)), "Start")
        for i, app in enumerate(("Explorer", "Edge", "Notepad")):
            x = u(90 + 100 * i)
            scr.button((x, bottom + u(6), x + u(92), height - u(6)), app, role="taskbar")
        scr.text((width - u(70), bottom + u(20)), clock, 13)
        scr.element(clock, "clock", (width - u(74), bottom + u(8), width - u(10), height - u(8)))
    elif platform == "mac":
        top = u(24)
        scr.rect((0, 0, width, top), "#f2f2f2")
        scr.text((u(14), top / 2), title.split(" - ")[-1], 13, "#000000")
        scr.text((width - u(110), top / 2), f"Mon {clock}", 13, "#000000")
        scr.element(clock, "clock", (width - u(114), 0, width - u(20), top))
        dock_top = height - u(56)
        scr.rect(
            (width // 2 - u(150), dock_top, width // 2 + u(150), height - u(6)),
            "#d9d9e0",
            radius=12,
        )
        for i, app in enumerate(("Finder", "Safari", "Mail", "Notes", "Music")):
            x = width // 2 - u(140) + u(58) * i
            scr.rect((x, dock_top + u(6), x + u(46), dock_top + u(44)), "#8fa3c8", radius=9)
            scr.text_centered(
                (x, dock_top + u(6), x + u(46), dock_top + u(44)), app[:2], 14, "#fff"
            )
            scr.element(app, "dock", (x, dock_top + u(6), x + u(46), dock_top + u(44)), app[:2])
        bottom = dock_top - u(4)
    else:  # ubuntu
        top = u(28)
        scr.rect((0, 0, width, top), "#1d1d1d")
        scr.text((u(12), top / 2), "Activities", 13, "#ffffff")
        scr.text_centered(
            (width // 2 - u(60), 0, width // 2 + u(60), top), f"Nov 3  {clock}", 13, "#ffffff"
        )
        scr.element(clock, "clock", (width // 2 - u(60), 0, width // 2 + u(60), top))
        left = u(56)
        scr.rect((0, top, left, height), "#2c2c2c")
        for i, app in enumerate(("Files", "Firefox", "Text Editor", "Terminal")):
            y = top + u(10) + u(52) * i
            scr.rect((u(6), y, left - u(6), y + u(44)), "#5e5e5e", radius=8)
            scr.text_centered((u(6), y, left - u(6), y + u(44)), app[:2], 14, "#ffffff")
            scr.element(app, "dock", (u(6), y, left - u(6), y + u(44)), app[:2])
    # The application window.
    win = (left + u(8), top + u(8), right - u(8), bottom - u(8))
    scr.rect(win, "#ffffff", outline="#6f6f6f", radius=6)
    bar = u(32)
    scr.rect((win[0], win[1], win[2], win[1] + bar), bar_fill, radius=6)
    if platform == "mac":
        for i, colour in enumerate(("#ff5f57", "#febc2e", "#28c840")):
            cx, cy = win[0] + u(16) + u(20) * i, win[1] + bar // 2
            scr.draw.ellipse((cx - u(6), cy - u(6), cx + u(6), cy + u(6)), fill=colour)
        scr.text_centered((win[0], win[1], win[2], win[1] + bar), title, 13, bar_ink)
    else:
        scr.text((win[0] + u(12), win[1] + bar / 2), title, 13, bar_ink)
        for i, glyph in enumerate(("X", "[]", "_")):
            box = (win[2] - u(46) * (i + 1), win[1], win[2] - u(46) * i, win[1] + bar)
            scr.text_centered(box, glyph, 13, bar_ink)
            name = {"X": "Close", "[]": "Maximize", "_": "Minimize"}[glyph]
            scr.element(name, "button", box, glyph)
    scr.element(title, "titlebar", (win[0], win[1], win[2] - u(140), win[1] + bar))
    y = win[1] + bar
    if menus:
        mh = u(26)
        scr.rect((win[0] + 1, y, win[2] - 1, y + mh), "#f9f9f9")
        x = win[0] + u(8)
        for name in menus:
            w = u(14) + int(scr.draw.textlength(name, font=font(u(13))))
            scr.text((x + u(7), y + mh / 2), name, 13)
            scr.element(name, "menu", (x, y, x + w, y + mh))
            x += w + u(4)
        y += mh
    return scr, (win[0] + u(1), y, win[2] - u(1), win[3] - u(1))


def status_bar(scr: Screen, content: Box, message: str) -> Box:
    """A window status bar at the bottom of ``content``; returns the content box above it."""
    h = scr.u(24)
    bar = (content[0], content[3] - h, content[2], content[3])
    scr.rect(bar, "#f0f0f0")
    scr.text((bar[0] + scr.u(10), bar[1] + h / 2), message, 12, "#444444")
    scr.element(message, "status", bar)
    return (content[0], content[1], content[2], bar[1])


def browser(width: int, height: int, clock: str, url: str, tab: str) -> tuple[Screen, Box]:
    """A browser viewport with tab strip, address bar and a clock; returns the page box."""
    scr = Screen(width, height, THEMES["web"][0], unit=height / 720)
    u = scr.u
    scr.rect((u(8), u(6), u(260), u(36)), "#ffffff", radius=6)
    scr.text((u(20), u(21)), tab, 13)
    scr.element(tab, "tab", (u(8), u(6), u(260), u(36)))
    scr.text((width - u(60), u(21)), clock, 12, "#3c4043")
    scr.element(clock, "clock", (width - u(64), u(6), width - u(8), u(36)))
    scr.rect((0, u(36), width, u(80)), "#ffffff")
    for i, glyph in enumerate(("<", ">", "R")):
        box = (u(10) + u(34) * i, u(44), u(38) + u(34) * i, u(72))
        scr.text_centered(box, glyph, 14, "#5f6368")
        scr.element({"<": "Back", ">": "Forward", "R": "Reload"}[glyph], "button", box, glyph)
    bar = (u(120), u(44), width - u(20), u(72))
    scr.rect(bar, "#f1f3f4", radius=14)
    scr.text((bar[0] + u(16), u(58)), url, 13, "#202124")
    scr.element(url, "addressbar", bar)
    scr.rect((0, u(80), width, height), "#ffffff")
    return scr, (0, u(80), width, height)


def phone(width: int, height: int, clock: str) -> tuple[Screen, Box]:
    """An Android phone screen with status bar (clock) and navigation bar; returns the app box."""
    scr = Screen(width, height, THEMES["android"][0], unit=width / 540)
    u = scr.u
    sb = u(44)
    scr.rect((0, 0, width, sb), "#f3edf7")
    scr.text((u(24), sb / 2), clock, 15, "#1d1b20")
    scr.element(clock, "clock", (u(16), 0, u(90), sb))
    scr.text((width - u(90), sb / 2), "5G  86%", 14, "#1d1b20")
    nav = height - u(56)
    scr.rect((0, nav, width, height), "#f3edf7")
    for i, name in enumerate(("Back", "Home", "Recents")):
        cx = width * (i + 1) // 4
        box = (cx - u(36), nav + u(6), cx + u(36), height - u(6))
        glyph = {"Back": "<", "Home": "O", "Recents": "[]"}[name]
        scr.text_centered(box, glyph, 18, "#49454f")
        scr.element(name, "navigation", box, glyph)
    return scr, (0, sb, width, nav)
