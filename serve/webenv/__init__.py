"""A real GUI environment: a small local web application in headless Chromium.

The application ("Acme Desk", HTML/CSS/JS in ``static/``) has four pages linked from a header bar
with a ticking clock:

* ``index.html`` (Home): a *Refresh* button, a *Settings* button opening a modal dialog (dark
  mode and e-mail checkboxes, *Cancel* / *Save*), and a disabled *Publish* button;
* ``items.html``: a list of 18 invoices, a click selects one;
* ``form.html``: a contact form (name, e-mail, role, checkbox) validated on submit;
* ``reports.html``: a panel that shows a spinner until the server's report endpoint answers
  (``slow_seconds``, 2 s by default), then a table.

Rendering is reproducible: fixed viewport at device scale factor 1, system fonts only, nothing
loaded from the network, every animation and transition off except the spinner, the text caret
hidden in screenshots. The clock (``#clock``) and the spinner (``#spinner``) are the only regions
that change on their own; ``BrowserEnv.volatile_regions()`` gives them on the 0–1000 grid (the
gateway's ``volatile_regions``), or pass ``clock=False``.

Running an episode (the runner interface mimics OSWorld)::

    from hivig.actions import LeftClick, Type
    from serve.webenv import BrowserEnv, find_browser

    assert find_browser() is not None            # system Chromium, e.g. apt-get install chromium
    with BrowserEnv() as env:                    # 1280x800, coordinates on the 0-1000 grid
        obs = env.reset("add_contact")           # or a WebTask, or None
        # obs == {"screenshot": PNG bytes, "instruction": str, "accessibility_tree": None}
        x, y = env.center_grid("#nav-form")      # where a perfect policy would click
        obs, reward, done, info = env.step(LeftClick((x, y)))
        obs, reward, done, info = env.step(LeftClick(env.center_grid("#name")))
        obs, reward, done, info = env.step(Type("Ada Lovelace"))
        obs, reward, done, info = env.step({"action": "left_click",
                                            "coordinate": list(env.center_grid("#submit-btn"))})
        assert reward == 1.0 and done

``step`` accepts a hivig typed ``Action`` or its Qwen3-VL ``arguments`` dict; coordinates are
read on the 0–1000 grid (``x / 1000 · width`` CSS pixels) unless ``coord_space="screen_px"`` is
given to the constructor or to ``step``. ``info`` holds the pixel point (``point_px``), the DOM
element found there before acting (``target``), the URL, ``success`` and an ``error`` code for
actions with no browser meaning (``open``, ``call_user``, unknown keys).

For a gateway session: ``platform="web"``, ``screen={"w": env.width, "h": env.height}``,
``coord_space="screen_px"`` if the policy's actions are sent as pixels (``info["point_px"]``)
or ``"norm1000"`` for grid actions, and ``volatile_regions=env.volatile_regions()`` read right
after ``reset`` (the clock, plus the spinner when the start page shows one).

``BrowserEnv`` uses Playwright's synchronous API: create and use it in one thread with no
running asyncio event loop (it refuses to start inside one). From async code, run the whole
episode loop in one worker thread, or pair it with the synchronous gateway client.

Helpers for tests: ``element_at(x_px, y_px)``, ``bounding_box(selector)``, ``center_grid``,
``state()`` (the application's state that task checks read), ``page`` (the Playwright page),
``grid_to_px`` / ``px_to_grid``. ``WebApp`` serves the application alone
(``python -m serve.webenv --port 8000`` to look at it in a browser).

Chromium is the system's (``find_browser``: ``$HIVIG_CHROMIUM``, else ``chromium`` and friends on
the ``PATH``), driven by the ``playwright`` package; Playwright's browser download is not used.
"""

from serve.webenv._app import DEFAULT_SLOW_SECONDS, PAGES, REPORT_ROWS, WebApp, static_dir
from serve.webenv._browser import (
    BROWSER_ENV_VAR,
    VIEWPORT,
    BrowserEnv,
    BrowserNotFound,
    ElementInfo,
    find_browser,
    grid_to_px,
    px_to_grid,
)
from serve.webenv._tasks import TASKS, WebTask

__all__ = [
    "BROWSER_ENV_VAR",
    "DEFAULT_SLOW_SECONDS",
    "PAGES",
    "REPORT_ROWS",
    "TASKS",
    "VIEWPORT",
    "BrowserEnv",
    "BrowserNotFound",
    "ElementInfo",
    "WebApp",
    "WebTask",
    "find_browser",
    "grid_to_px",
    "px_to_grid",
    "static_dir",
]
