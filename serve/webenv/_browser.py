"""``BrowserEnv``: headless Chromium driven through Playwright, with an OSWorld-shaped interface.

The browser is the system's Chromium (``find_browser``); Playwright's own browser download is
never used. One ``BrowserEnv`` owns one browser process and one browser context; ``reset`` loads
the task's start page afresh with the application's state, the history and the pointer cleared.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hivig.actions.model import (
    GRID_MAX,
    Action,
    ActionError,
    Answer,
    CallUser,
    Click,
    DoubleClick,
    HScroll,
    Key,
    LeftClick,
    LeftClickDrag,
    LongPress,
    MiddleClick,
    MobileKey,
    MouseMove,
    Open,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    TripleClick,
    Type,
    Wait,
    action_from_arguments,
)
from hivig.logging import get_logger
from serve.webenv._app import DEFAULT_SLOW_SECONDS, WebApp
from serve.webenv._tasks import TASKS, WebTask

logger = get_logger(__name__)

BROWSER_ENV_VAR = "HIVIG_CHROMIUM"
"""Environment variable naming a Chromium executable; checked before the ``PATH``."""

_BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

VIEWPORT = (1280, 800)
"""Default viewport (width, height) in CSS pixels; screenshots have exactly this size."""

CoordSpace = Literal["norm1000", "screen_px"]

# Flags for reproducible pixels: one colour profile, greyscale antialiasing, no hinting, and a
# shared-memory fallback for containers with a small /dev/shm. --no-sandbox: CI runs as root.
_LAUNCH_ARGS = (
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--force-color-profile=srgb",
    "--disable-lcd-text",
    "--font-render-hinting=none",
    "--disable-extensions",
    # Tabs of the one origin share a renderer, so a reset does not start a new process.
    "--process-per-site",
)

# Resolves after two animation frames, i.e. once the last DOM change is painted; reports whether
# a link click started a navigation in this document.
_SETTLE_JS = """() => new Promise(resolve => requestAnimationFrame(() =>
    requestAnimationFrame(() => resolve(window.__hivigNavigating === true))))"""

_ELEMENT_AT_JS = """([x, y]) => {
  const hit = document.elementFromPoint(x, y);
  if (!hit) return null;
  const el = hit.closest('[id]') || hit;
  const r = el.getBoundingClientRect();
  return {tag: el.tagName.toLowerCase(), id: el.id || null, hit_tag: hit.tagName.toLowerCase(),
          text: (el.innerText || el.value || '').trim().slice(0, 80),
          box: [r.x, r.y, r.width, r.height], disabled: !!el.disabled};
}"""

# A task's success expression over the application state ``s``.
_CHECK_JS = "() => { const s = window.hivigState ? window.hivigState() : {}; return !!(EXPR); }"

# pyautogui / Qwen key names -> Playwright key names; anything else is passed through.
_KEYS = {
    "ctrl": "Control",
    "ctrlleft": "Control",
    "ctrlright": "Control",
    "control": "Control",
    "alt": "Alt",
    "altleft": "Alt",
    "altright": "Alt",
    "option": "Alt",
    "shift": "Shift",
    "shiftleft": "Shift",
    "shiftright": "Shift",
    "cmd": "Meta",
    "command": "Meta",
    "win": "Meta",
    "winleft": "Meta",
    "winright": "Meta",
    "super": "Meta",
    "meta": "Meta",
    "enter": "Enter",
    "return": "Enter",
    "esc": "Escape",
    "escape": "Escape",
    "tab": "Tab",
    "space": "Space",
    "backspace": "Backspace",
    "delete": "Delete",
    "del": "Delete",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "PageUp",
    "pgup": "PageUp",
    "pagedown": "PageDown",
    "pgdn": "PageDown",
    "up": "ArrowUp",
    "down": "ArrowDown",
    "left": "ArrowLeft",
    "right": "ArrowRight",
    "capslock": "CapsLock",
}
_KEYS.update({f"f{i}": f"F{i}" for i in range(1, 25)})

_LONG_PRESS_MAX_S = 5.0
"""Longest hold executed for ``long_press`` (the action allows an hour; a test env never needs
it)."""


class BrowserNotFound(RuntimeError):
    """No Chromium executable was found; the message names the fix."""


def find_browser() -> str | None:
    """Path of a Chromium executable, or ``None``.

    Looks at ``$HIVIG_CHROMIUM`` first, then ``chromium``, ``chromium-browser``,
    ``google-chrome`` and ``google-chrome-stable`` on the ``PATH``.

    Returns:
        An absolute path to an executable file, or ``None`` when there is none.
    """
    override = os.environ.get(BROWSER_ENV_VAR)
    if override:
        return override if os.path.isfile(override) and os.access(override, os.X_OK) else None
    for name in _BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def grid_to_px(x: float, y: float, width: int, height: int) -> tuple[float, float]:
    """A 0–1000 grid point in CSS pixels of a ``width`` × ``height`` viewport.

    ``x / 1000 · width`` (the marker's mapping before truncation), kept inside the last pixel so
    that 1000 still lands on the screen.
    """
    px = min(x * width / GRID_MAX, width - 1)
    py = min(y * height / GRID_MAX, height - 1)
    return (max(px, 0.0), max(py, 0.0))


def px_to_grid(x: float, y: float, width: int, height: int) -> tuple[int, int]:
    """CSS pixels to the nearest 0–1000 grid point (clamped); the inverse of ``grid_to_px``."""
    gx = int(x / width * GRID_MAX + 0.5)
    gy = int(y / height * GRID_MAX + 0.5)
    return (min(max(gx, 0), GRID_MAX), min(max(gy, 0), GRID_MAX))


@dataclass(frozen=True)
class ElementInfo:
    """The DOM element under a point.

    Attributes:
        tag: Tag of the nearest element with an ``id`` (the hit element itself if none has one).
        id: That element's ``id``, or ``None``.
        hit_tag: Tag of the innermost element hit (e.g. ``span`` inside a button).
        text: Its visible text (or an input's value), trimmed to 80 characters.
        box: ``(x, y, width, height)`` of the ``id`` element in CSS pixels of the viewport.
        disabled: Whether it is a disabled form control.
    """

    tag: str
    id: str | None
    hit_tag: str
    text: str
    box: tuple[float, float, float, float]
    disabled: bool


def _no_running_loop() -> None:
    """Refuse to start inside a running asyncio loop, with the fix, before Playwright does."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "BrowserEnv is synchronous and cannot run inside an asyncio event loop; create and use "
        "it in one worker thread (e.g. run the episode loop with asyncio.to_thread)"
    )


def _task(task: WebTask | str | None) -> WebTask:
    if task is None:
        return WebTask(instruction="", name="explore")
    if isinstance(task, WebTask):
        return task
    if task in TASKS:
        return TASKS[task]
    raise ValueError(f"unknown task {task!r}; built-in tasks: {sorted(TASKS)}")


class BrowserEnv:
    """A real GUI environment: the test web application in headless Chromium.

    Args:
        viewport: ``(width, height)`` in CSS pixels (device scale factor 1).
        coord_space: How action coordinates are read: ``"norm1000"`` (the 0–1000 grid, the
            default) or ``"screen_px"`` (CSS pixels of the viewport).
        clock: Show the ticking header clock (a volatile region, as on a desktop). Off gives
            byte-identical screenshots of unchanged screens. Read at every ``reset``.
        slow_seconds: How long the report panel's spinner stays up.
        settle_seconds: Extra wait after every action, before the screenshot (OSWorld's
            ``sleep_after_execution``); rendering is always awaited.
        executable_path: Chromium to drive; ``None`` uses ``find_browser()``.
        base_url: Serve an already running copy of the application from here instead of
            starting one.

    Raises:
        BrowserNotFound: No Chromium executable.
        ValueError: A bad argument.
    """

    def __init__(
        self,
        *,
        viewport: tuple[int, int] = VIEWPORT,
        coord_space: CoordSpace = "norm1000",
        clock: bool = True,
        slow_seconds: float = DEFAULT_SLOW_SECONDS,
        settle_seconds: float = 0.0,
        executable_path: str | None = None,
        base_url: str | None = None,
    ) -> None:
        if coord_space not in ("norm1000", "screen_px"):
            raise ValueError(f"coord_space must be 'norm1000' or 'screen_px', got {coord_space!r}")
        if min(viewport) < 64:
            raise ValueError(f"viewport sides must be at least 64 px, got {viewport}")
        executable = executable_path or find_browser()
        if executable is None:
            raise BrowserNotFound(
                "no Chromium found: install it (apt-get install chromium) "
                f"or set {BROWSER_ENV_VAR}=/path/to/chromium"
            )
        _no_running_loop()
        from playwright.sync_api import sync_playwright

        self.width, self.height = viewport
        self.coord_space: CoordSpace = coord_space
        self.clock = clock
        self.settle_seconds = settle_seconds
        self._app = None if base_url else WebApp(slow_seconds=slow_seconds)
        self._pw = None
        try:
            if self._app is not None:
                self._app.start()
            self._base_url = base_url.rstrip("/") + "/" if base_url else self._app.base_url
            self._pw = sync_playwright().start()
            self._browser = self._pw.chromium.launch(
                executable_path=executable, headless=True, args=list(_LAUNCH_ARGS)
            )
        except Exception:
            # Leave nothing running behind a failed start (server thread, driver process).
            if self._pw is not None:
                self._pw.stop()
                self._pw = None
            if self._app is not None:
                self._app.close()
            raise
        self._context = None
        self._page = None
        self._page_clock = clock
        self._cdp = None
        self.task: WebTask = _task(None)
        self.steps = 0

    # --- episode -------------------------------------------------------------------------

    def reset(self, task: WebTask | str | None = None) -> dict[str, Any]:
        """Start an episode: a fresh load of the task's start page with empty app state.

        Args:
            task: A ``WebTask``, the name of a built-in task (``TASKS``), or ``None`` (the home
                page with an empty instruction).

        Returns:
            The first observation.
        """
        self.task = _task(task)
        self.steps = 0
        if self._context is None:
            self._context = self._browser.new_context(
                viewport={"width": self.width, "height": self.height},
                device_scale_factor=1,
                locale="en-US",
                timezone_id="UTC",
                color_scheme="light",
            )
        if not self._reuse_tab():
            self._new_tab()
        self._page.goto(self.url(self.task.start), wait_until="load")
        # Back must not lead into the previous episode.
        self._cdp.send("Page.resetNavigationHistory")
        self._settle()
        return self._observation()

    def step(
        self, action: Action | dict[str, Any], *, coord_space: CoordSpace | None = None
    ) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Execute one action and observe the result.

        Args:
            action: A hivig typed ``Action``, or its Qwen3-VL ``arguments`` dict
                (``{"action": "left_click", "coordinate": [500, 300]}``).
            coord_space: Override the environment's ``coord_space`` for this action.

        Returns:
            ``(observation, reward, done, info)``: reward is 1.0 once the task's check holds,
            else 0.0; done after ``terminate``/``answer``, on success, or at ``max_steps``.
            ``info`` has ``step``, ``url``, ``point_px`` (where a pointer action landed),
            ``target`` (the ``ElementInfo`` there, as a dict, before acting), ``success`` and
            ``error`` (a reason code for an action that could not be executed, else ``None``).

        Raises:
            RuntimeError: ``reset`` was not called.
            ValueError: A dict that is not a valid action.
        """
        page = self._require_page()
        if isinstance(action, dict):
            parsed = action_from_arguments(action)
            if isinstance(parsed, ActionError):
                raise ValueError(f"bad action {action!r}: {parsed}")
            action = parsed
        space = coord_space or self.coord_space
        self.steps += 1
        info: dict[str, Any] = {"step": self.steps, "point_px": None, "target": None, "error": None}
        point = getattr(action, "coordinate", None)
        if point is not None:
            px = self.to_px(point, space)
            info["point_px"] = px
            target = self.element_at(*px)
            info["target"] = None if target is None else asdict(target)
        error = self._execute(page, action, space)
        info["error"] = error
        self._settle()
        if self.settle_seconds > 0:
            page.wait_for_timeout(self.settle_seconds * 1000)
            self._settle()
        success = self._success(action)
        finished = isinstance(action, (Terminate, Answer))
        done = success or finished or self.steps >= self.task.max_steps
        info.update(url=page.url, success=success)
        return self._observation(), (1.0 if success else 0.0), done, info

    def screenshot(self) -> bytes:
        """PNG bytes of the viewport as the browser renders it now (caret hidden)."""
        return self._require_page().screenshot(type="png", caret="hide", animations="allow")

    def close(self) -> None:
        """Close the browser, Playwright and the application server. Idempotent."""
        if self._pw is None:
            return
        try:
            self._browser.close()
        finally:
            self._pw.stop()
            self._pw = None
            if self._app is not None:
                self._app.close()

    def __enter__(self) -> BrowserEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers for tests and examples ---------------------------------------------------

    @property
    def page(self):
        """The Playwright ``Page`` of the current episode (for assertions in tests)."""
        return self._require_page()

    def url(self, page: str = "index.html") -> str:
        """Absolute URL of one page of the application."""
        return self._base_url + page.lstrip("/")

    def to_px(
        self, point: tuple[float, float], space: CoordSpace | None = None
    ) -> tuple[float, float]:
        """An action coordinate in CSS pixels of the viewport."""
        if (space or self.coord_space) == "screen_px":
            return (float(point[0]), float(point[1]))
        return grid_to_px(point[0], point[1], self.width, self.height)

    def to_grid(self, x_px: float, y_px: float) -> tuple[int, int]:
        """CSS pixels to the 0–1000 grid of this viewport."""
        return px_to_grid(x_px, y_px, self.width, self.height)

    def element_at(self, x_px: float, y_px: float) -> ElementInfo | None:
        """The DOM element at a viewport point (CSS pixels), or ``None`` outside the page."""
        found = self._require_page().evaluate(_ELEMENT_AT_JS, [x_px, y_px])
        if found is None:
            return None
        found["box"] = tuple(found["box"])
        return ElementInfo(**found)

    def bounding_box(self, selector: str) -> tuple[float, float, float, float] | None:
        """``(x, y, width, height)`` in CSS pixels of the first match, ``None`` if not shown."""
        handle = self._require_page().query_selector(selector)
        if handle is None:
            return None
        box = handle.bounding_box()
        return None if box is None else (box["x"], box["y"], box["width"], box["height"])

    def center_grid(self, selector: str) -> tuple[int, int]:
        """The 0–1000 grid point at the centre of an element (what a perfect policy clicks).

        Raises:
            LookupError: No visible element matches ``selector``.
        """
        box = self.bounding_box(selector)
        if box is None:
            raise LookupError(f"no visible element matches {selector!r}")
        x, y, w, h = box
        return self.to_grid(x + w / 2, y + h / 2)

    def volatile_boxes(self) -> list[tuple[float, float, float, float]]:
        """Pixel boxes ``(x0, y0, x1, y1)`` that change without any action, as shown now: the
        clock (when on) and the spinner (while one is up)."""
        boxes = []
        for selector in ("#clock", "#spinner") if self._page_clock else ("#spinner",):
            box = self.bounding_box(selector)
            if box is not None:
                x, y, w, h = box
                boxes.append((x, y, x + w, y + h))
        return boxes

    def volatile_regions(self) -> list[list[int]]:
        """``volatile_boxes`` on the 0–1000 grid, widened to whole grid cells (the gateway's
        session ``volatile_regions``)."""
        regions = []
        for x0, y0, x1, y1 in self.volatile_boxes():
            regions.append(
                [
                    max(0, math.floor(x0 / self.width * GRID_MAX)),
                    max(0, math.floor(y0 / self.height * GRID_MAX)),
                    min(GRID_MAX, math.ceil(x1 / self.width * GRID_MAX)),
                    min(GRID_MAX, math.ceil(y1 / self.height * GRID_MAX)),
                ]
            )
        return regions

    def state(self) -> dict[str, Any]:
        """The application's state object (what task checks read)."""
        return self._require_page().evaluate("() => window.hivigState ? window.hivigState() : {}")

    # --- internals -----------------------------------------------------------------------

    def _new_tab(self) -> None:
        """Replace the episode's tab with a new one (empty session storage, history, pointer)."""
        page = self._context.new_page()
        if self._page is not None:
            self._page.close()
        self._page = page
        self._page_clock = self.clock
        self._cdp = self._context.new_cdp_session(page)
        if not self.clock:
            page.add_init_script("window.__hivigNoClock = true;")

    def _reuse_tab(self) -> bool:
        """Prepare the current tab for a new episode; ``False`` when a new tab is needed.

        Reusing the tab saves starting a renderer (about half of a reset). The next page load
        resets the document (focus, dialogs, scroll: the app turns scroll restoration off);
        here the app's state in session storage is cleared and the pointer parked in the
        corner, where nothing reacts to hover.
        """
        from playwright.sync_api import Error as PlaywrightError

        page = self._page
        if page is None or page.is_closed() or self._page_clock != self.clock:
            return False
        if not page.url.startswith(self._base_url):
            return False
        try:
            page.evaluate("() => sessionStorage.clear()")
        except PlaywrightError:
            return False
        page.mouse.move(0, 0)
        return True

    def _require_page(self):
        if self._page is None:
            raise RuntimeError("no episode: call reset() first")
        return self._page

    def _observation(self) -> dict[str, Any]:
        return {
            "screenshot": self.screenshot(),
            "instruction": self.task.instruction,
            "accessibility_tree": None,
        }

    def _settle(self) -> None:
        """Wait until a started navigation has finished and the last change is painted."""
        from playwright.sync_api import Error as PlaywrightError

        page = self._require_page()
        deadline = time.monotonic() + 10
        while True:
            try:
                navigating = page.evaluate(_SETTLE_JS)
            except PlaywrightError:
                # The document went away under the evaluation: a navigation is committing.
                navigating = True
            if not navigating or time.monotonic() > deadline:
                break
            page.wait_for_load_state("load")
            page.wait_for_timeout(10)
        page.wait_for_load_state("load")

    def _success(self, action: Action) -> bool:
        task = self.task
        if task.answer is not None and isinstance(action, Answer):
            return task.answer.lower() in action.text.lower()
        if task.success_js is None:
            return False
        check = _CHECK_JS.replace("EXPR", task.success_js)
        return bool(self._require_page().evaluate(check))

    def _execute(self, page, action: Action, space: CoordSpace) -> str | None:
        """Perform ``action``; returns an error code when it has no browser meaning."""
        mouse, keyboard = page.mouse, page.keyboard
        if isinstance(action, (LeftClick, Click)):
            mouse.click(*self.to_px(action.coordinate, space))
        elif isinstance(action, RightClick):
            mouse.click(*self.to_px(action.coordinate, space), button="right")
        elif isinstance(action, MiddleClick):
            mouse.click(*self.to_px(action.coordinate, space), button="middle")
        elif isinstance(action, DoubleClick):
            mouse.dblclick(*self.to_px(action.coordinate, space))
        elif isinstance(action, TripleClick):
            mouse.click(*self.to_px(action.coordinate, space), click_count=3)
        elif isinstance(action, MouseMove):
            mouse.move(*self.to_px(action.coordinate, space))
        elif isinstance(action, LeftClickDrag):
            if action.start is not None:
                mouse.move(*self.to_px(action.start, space))
            mouse.down()
            mouse.move(*self.to_px(action.coordinate, space), steps=8)
            mouse.up()
        elif isinstance(action, Swipe):
            mouse.move(*self.to_px(action.coordinate, space))
            mouse.down()
            mouse.move(*self.to_px(action.coordinate2, space), steps=8)
            mouse.up()
        elif isinstance(action, LongPress):
            mouse.move(*self.to_px(action.coordinate, space))
            mouse.down()
            page.wait_for_timeout(min(action.time, _LONG_PRESS_MAX_S) * 1000)
            mouse.up()
        elif isinstance(action, (Scroll, HScroll)):
            if action.coordinate is not None:
                mouse.move(*self.to_px(action.coordinate, space))
            # Qwen: positive scroll pixels go up, positive hscroll pixels go right.
            dx, dy = (action.pixels, 0) if isinstance(action, HScroll) else (0, -action.pixels)
            mouse.wheel(dx, dy)
            # The wheel scrolls asynchronously on the compositor thread.
            page.wait_for_timeout(100)
        elif isinstance(action, Type):
            keyboard.type(action.text)
        elif isinstance(action, Key):
            return self._press(keyboard, action.keys)
        elif isinstance(action, MobileKey):
            return self._press(keyboard, (action.text,))
        elif isinstance(action, Wait):
            page.wait_for_timeout(action.time * 1000)
        elif isinstance(action, SystemButton):
            return self._system_button(page, action.button)
        elif isinstance(action, (Open, CallUser)):
            return "unsupported_action"
        # Terminate and Answer end the episode without touching the page.
        return None

    @staticmethod
    def _press(keyboard, keys: tuple[str, ...]) -> str | None:
        names = [_KEYS.get(k.lower(), k) for k in keys]
        from playwright.sync_api import Error as PlaywrightError

        pressed: list[str] = []
        try:
            for name in names:
                keyboard.down(name)
                pressed.append(name)
        except PlaywrightError:
            return "bad_key"
        finally:
            for name in reversed(pressed):
                keyboard.up(name)
        return None

    def _system_button(self, page, button: str) -> str | None:
        if button == "Back":
            page.go_back(wait_until="load")
        elif button == "Home":
            page.goto(self.url(self.task.start), wait_until="load")
        elif button == "Enter":
            page.keyboard.press("Enter")
        else:
            return "unsupported_action"
        return None
