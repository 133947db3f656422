"""A drawn stand-in for the browser application, for machines without Chromium.

It has the parts of the web application's home page that the demo episode uses: a *Settings*
button opening a dialog (a *Dark mode* checkbox and *Save*), and a disabled *Publish* button.
Same runner interface as ``serve.webenv.BrowserEnv`` (``reset``, ``step``, ``center_grid``,
``volatile_regions``); actions are Qwen3-VL ``arguments`` dicts on the 0–1000 grid.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageDraw

_BOXES = {
    "#settings-btn": (300, 160, 420, 200),
    "#publish-btn": (440, 160, 560, 200),
    "#dark-toggle": (460, 330, 480, 350),
    "#settings-save": (700, 520, 800, 560),
    "#settings-close": (580, 520, 680, 560),
}


class SyntheticDesk:
    """The demo's environment drawn with PIL (1280x800)."""

    width, height = 1280, 800

    def __init__(self) -> None:
        """A closed dialog, dark mode off."""
        self.dialog = False
        self.dark = False
        self.pending_dark = False
        self.instruction = ""

    def __enter__(self) -> SyntheticDesk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release."""

    def reset(self, task: str | None = None) -> dict[str, Any]:
        """Start the episode; ``task`` is ``dark_mode`` (the one task here) or an instruction."""
        self.dialog = self.dark = self.pending_dark = False
        named = task in (None, "dark_mode")
        self.instruction = "Turn on dark mode in the settings." if named else str(task)
        return self._obs()

    def volatile_regions(self) -> list[list[int]]:
        """No region changes on its own here."""
        return []

    def center_grid(self, selector: str) -> tuple[int, int]:
        """The centre of an element on the 0–1000 grid."""
        x0, y0, x1, y1 = _BOXES[selector]
        return (
            round((x0 + x1) / 2 / self.width * 1000),
            round((y0 + y1) / 2 / self.height * 1000),
        )

    def step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Apply an action (``{"action": ..., "coordinate": [x, y]}`` on the grid)."""
        name = action.get("action")
        target = None
        if name in ("left_click", "click") and action.get("coordinate"):
            gx, gy = action["coordinate"]
            px, py = gx / 1000 * self.width, gy / 1000 * self.height
            target = next(
                (k for k, (x0, y0, x1, y1) in _BOXES.items() if x0 <= px <= x1 and y0 <= py <= y1),
                None,
            )
            self._click(target)
        done = name in ("terminate", "answer") or self.dark
        return self._obs(), 1.0 if self.dark else 0.0, done, {"target": target}

    def _click(self, target: str | None) -> None:
        if target == "#settings-btn" and not self.dialog:
            self.dialog, self.pending_dark = True, self.dark
        elif self.dialog and target == "#dark-toggle":
            self.pending_dark = not self.pending_dark
        elif self.dialog and target == "#settings-save":
            self.dialog, self.dark = False, self.pending_dark
        elif self.dialog and target == "#settings-close":
            self.dialog = False
        # "#publish-btn" is disabled: a click there changes nothing.

    def _obs(self) -> dict[str, Any]:
        return {
            "screenshot": self._render(),
            "instruction": self.instruction,
            "accessibility_tree": None,
        }

    def _render(self) -> bytes:
        bg, fg = ((30, 32, 38), (230, 230, 230)) if self.dark else ((246, 247, 249), (30, 30, 30))
        img = Image.new("RGB", (self.width, self.height), bg)
        d = ImageDraw.Draw(img)
        d.rectangle((0, 0, self.width, 60), fill=(35, 60, 110))
        d.text((24, 22), "Acme Desk    Home   Items   Form   Reports", fill=(255, 255, 255))
        d.text((300, 110), "Dashboard", fill=fg)
        self._button(d, "#settings-btn", "Settings", (70, 110, 200), (255, 255, 255))
        self._button(d, "#publish-btn", "Publish", (205, 208, 214), (150, 150, 150))
        if self.dialog:
            d.rectangle((0, 60, self.width, self.height), fill=(120, 120, 125))
            d.rectangle((400, 260, 880, 600), fill=(255, 255, 255), outline=(80, 80, 80))
            d.text((430, 280), "Settings", fill=(0, 0, 0))
            x0, y0, x1, y1 = _BOXES["#dark-toggle"]
            d.rectangle((x0, y0, x1, y1), outline=(40, 40, 40), width=2)
            if self.pending_dark:
                d.line(
                    (x0 + 3, y0 + 10, x0 + 8, y1 - 3, x1 - 3, y0 + 3), fill=(20, 90, 200), width=3
                )
            d.text((x1 + 12, y0 + 3), "Dark mode", fill=(0, 0, 0))
            self._button(d, "#settings-close", "Cancel", (225, 227, 232), (30, 30, 30))
            self._button(d, "#settings-save", "Save", (70, 110, 200), (255, 255, 255))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return buf.getvalue()

    @staticmethod
    def _button(d: ImageDraw.ImageDraw, key: str, label: str, fill: tuple, text: tuple) -> None:
        x0, y0, x1, y1 = _BOXES[key]
        d.rounded_rectangle((x0, y0, x1, y1), radius=6, fill=fill)
        d.text((x0 + 18, y0 + 13), label, fill=text)
