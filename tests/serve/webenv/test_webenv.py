"""The real GUI environment: the test web application in headless Chromium (serve.webenv).

Ground truth comes from the browser itself: element boxes from the DOM, pixels from Chromium's
screenshots. One browser serves the whole module.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from hivig.actions import (
    Answer,
    Key,
    LeftClick,
    Open,
    Scroll,
    Terminate,
    Type,
    Wait,
)
from hivig.messages import PointMark
from hivig.recurrence import DetectorConfig, new_state, update
from hivig.vision import POINT_COLOUR, canonical_frame
from serve.webenv import (
    BROWSER_ENV_VAR,
    TASKS,
    VIEWPORT,
    BrowserEnv,
    BrowserNotFound,
    WebApp,
    WebTask,
    find_browser,
    grid_to_px,
    px_to_grid,
)

pytestmark = pytest.mark.slow

MIN_PX = 65_536
SMALL_MAX_PX = 409_600  # 1280x800 -> an 800x480 frame: markers are drawn on a scaled screen
SLOW_S = 2.0


@pytest.fixture(scope="module")
def env():
    if find_browser() is None:
        pytest.skip(f"no Chromium executable (apt-get install chromium, or set {BROWSER_ENV_VAR})")
    with BrowserEnv(slow_seconds=SLOW_S) as browser:
        yield browser


@pytest.fixture
def quiet(env):
    """The env with the header clock off: unchanged screens give byte-identical PNGs."""
    env.clock = False
    yield env
    env.clock = True


@functools.lru_cache(maxsize=32)
def _rgb(png: bytes) -> np.ndarray:
    """Decoded pixels (read-only; cached, since most screenshots are compared several times)."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    pixels.flags.writeable = False
    return pixels


def _diff_mask(a: bytes, b: bytes) -> np.ndarray:
    return (_rgb(a) != _rgb(b)).any(axis=2)


def _inside(mask: np.ndarray, boxes, margin: int = 6) -> bool:
    """Whether every True pixel of ``mask`` lies inside one of the pixel ``boxes`` (x0,y0,x1,y1)."""
    allowed = np.zeros_like(mask)
    for x0, y0, x1, y1 in boxes:
        allowed[
            max(0, int(y0) - margin) : int(y1) + margin + 1,
            max(0, int(x0) - margin) : int(x1) + margin + 1,
        ] = True
    return not (mask & ~allowed).any()


def _xyxy(box):
    x, y, w, h = box
    return (x, y, x + w, y + h)


def _goto(env, page: str):
    return env.reset(WebTask(instruction="look around", start=page))


# --- screenshots ------------------------------------------------------------------------------


def test_screenshots_are_chromium_pngs_of_the_viewport(env):
    obs = env.reset()
    assert set(obs) == {"screenshot", "instruction", "accessibility_tree"}
    assert obs["accessibility_tree"] is None
    png = obs["screenshot"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert Image.open(io.BytesIO(png)).size == VIEWPORT
    shots = {"index": png}
    for page in ("items", "form", "reports"):
        obs, _, _, info = env.step(LeftClick(env.center_grid(f"#nav-{page}")))
        assert info["url"].endswith(f"/{page}.html")
        shots[page] = obs["screenshot"]
    arrays = {k: _rgb(v) for k, v in shots.items()}
    clock = _xyxy(env.bounding_box("#clock"))
    for a in arrays:
        assert arrays[a].std() > 10, f"{a} is a blank screen"
        for b in arrays:
            if a < b:
                changed = _diff_mask(shots[a], shots[b])
                assert not _inside(changed, [clock]), f"{a} and {b} look the same"


def test_same_screen_renders_byte_identically(quiet):
    first = quiet.reset("add_contact")["screenshot"]
    again = quiet.reset("add_contact")["screenshot"]
    assert first == again
    assert quiet.screenshot() == again


def test_only_the_clock_changes_on_its_own(env):
    env.reset()
    before = env.screenshot()
    deadline = time.monotonic() + 2.5
    while (after := env.screenshot()) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    changed = _diff_mask(before, after)
    assert changed.any(), "the clock should tick"
    assert _inside(changed, env.volatile_boxes(), margin=1)
    ((x0, y0, x1, y1),) = env.volatile_regions()
    box = env.bounding_box("#clock")
    assert (x0, y0) <= px_to_grid(box[0], box[1], *VIEWPORT)
    assert (x1, y1) >= px_to_grid(box[0] + box[2], box[1] + box[3], *VIEWPORT)


# --- coordinates: grid -> pixels -> DOM element -> marker -------------------------------------

# Per page: elements whose geometry and marker are checked, then the ones clicked (in order).
ELEMENTS = {
    "index.html": (("#refresh-btn", "#settings-btn", "#nav-items"), ("#refresh-btn", "#nav-items")),
    "items.html": (("#item-7", "#item-12", "#nav-form"), ("#item-7", "#item-12")),
    "form.html": (("#email", "#submit-btn", "#subscribe"), ("#email", "#submit-btn")),
}


def test_grid_conversion_round_trips():
    w, h = VIEWPORT
    assert grid_to_px(0, 0, w, h) == (0.0, 0.0)
    assert grid_to_px(500, 500, w, h) == (640.0, 400.0)
    assert grid_to_px(1000, 1000, w, h) == (w - 1, h - 1)  # still on screen
    for gx, gy in [(0, 0), (1, 999), (333, 667), (500, 500)]:
        assert px_to_grid(*grid_to_px(gx, gy, w, h), w, h) == (gx, gy)


def _red_pixels(marked: Image.Image, plain: Image.Image) -> np.ndarray:
    m, p = np.asarray(marked), np.asarray(plain)
    return (m == POINT_COLOUR).all(axis=2) & (m != p).any(axis=2)


def _check_marker(png: bytes, grid: tuple[int, int], box) -> None:
    """The red X for ``grid`` lies on ``box`` (CSS px) scaled into a smaller canonical frame."""
    x, y, w, h = box
    plain = canonical_frame(png, min_pixels=MIN_PX, max_pixels=SMALL_MAX_PX, size_class="desktop")
    marked = canonical_frame(
        png,
        min_pixels=MIN_PX,
        max_pixels=SMALL_MAX_PX,
        marks=(PointMark(*grid),),
        size_class="desktop",
    )
    fw, fh = marked.size
    assert (fw, fh) == (800, 480)  # scaled, so the check exercises the frame mapping
    sx, sy = fw / VIEWPORT[0], fh / VIEWPORT[1]
    ys, xs = np.nonzero(_red_pixels(marked, plain))
    assert len(xs) > 20
    assert xs.min() >= x * sx and xs.max() <= (x + w) * sx
    assert ys.min() >= y * sy and ys.max() <= (y + h) * sy
    # The open centre sits on the element's centre (within the grid's rounding).
    assert abs((xs.min() + xs.max()) / 2 - (x + w / 2) * sx) <= 2
    assert abs((ys.min() + ys.max()) / 2 - (y + h / 2) * sy) <= 2


@pytest.mark.parametrize("page", sorted(ELEMENTS))
def test_grid_points_reach_the_dom_elements_and_their_markers(env, page):
    png = _goto(env, page)["screenshot"]
    checked, clicked = ELEMENTS[page]
    for selector in checked:
        box = env.bounding_box(selector)
        x, y, w, h = box
        element_id = selector[1:]
        # The centre and an off-centre point, both as a policy would emit them on the grid.
        for fx, fy in ((0.5, 0.5), (0.2, 0.7)):
            grid = px_to_grid(x + fx * w, y + fy * h, *VIEWPORT)
            px, py = env.to_px(grid)
            assert x <= px <= x + w and y <= py <= y + h
            assert env.element_at(px, py).id == element_id, selector
        # Negative control: a point just above the element hits something else.
        above = env.element_at(x + w / 2, y - 8)
        assert above is None or above.id != element_id
        if min(w, h) >= 24:  # room for the whole X in the scaled frame
            _check_marker(png, px_to_grid(x + w / 2, y + h / 2, *VIEWPORT), box)
    for selector in clicked:
        box = env.bounding_box(selector)
        x, y, w, h = box
        _, _, _, info = env.step(LeftClick(px_to_grid(x + w / 2, y + h / 2, *VIEWPORT)))
        assert info["target"]["id"] == selector[1:]
        assert info["target"]["box"] == pytest.approx(box)
        if selector.startswith("#nav-"):
            assert info["url"].endswith("/items.html")  # the click navigated
        else:
            assert env.page.evaluate("() => window.__hivigLastClick") == selector[1:]


def test_marker_check_can_fail(env):
    # Negative control: the marker of a neighbouring element is not on this one.
    png = _goto(env, "items.html")["screenshot"]
    box = env.bounding_box("#item-7")
    other = env.center_grid("#item-9")
    with pytest.raises(AssertionError):
        _check_marker(png, other, box)


def test_pixel_coordinates_are_accepted(env):
    _goto(env, "items.html")
    x, y, w, h = env.bounding_box("#item-4")
    _, _, _, info = env.step(LeftClick((int(x + w / 2), int(y + h / 2))), coord_space="screen_px")
    assert info["target"]["id"] == "item-4"
    assert env.state()["selected"] == "item-4"
    assert "Tailspin" in env.page.inner_text("#selection")


def _frame(png: bytes) -> Image.Image:
    return Image.fromarray(_rgb(png))


def _clock_region(env) -> list[list[int]]:
    """The session's volatile regions as a runner would declare them: the header clock."""
    x, y, w, h = env.bounding_box("#clock")
    return [[*px_to_grid(x - 2, y - 2, *VIEWPORT), *px_to_grid(x + w + 2, y + h + 2, *VIEWPORT)]]


def _feed(env, state, actions, cfg):
    """Execute ``actions`` one by one, feeding each screenshot to the detector."""
    signals, shots = [], []
    for action in actions:
        obs, *_ = env.step(action)
        state, sig = update(state, _frame(obs["screenshot"]), [action], cfg)
        signals.append(sig)
        shots.append(obs["screenshot"])
    return state, signals, shots


# --- behaviours the critic and the detector must cope with -----------------------------------


def _same_outside(a: bytes, b: bytes, boxes) -> bool:
    return _inside(_diff_mask(a, b), boxes, margin=1)


def test_disabled_button_click_leaves_the_screen_unchanged_and_triggers_r3(env):
    cfg = DetectorConfig()
    start = env.reset("publish")["screenshot"]
    clock = [_xyxy(env.bounding_box("#clock"))]
    state, _ = update(new_state("web", _clock_region(env)), _frame(start), None, cfg)
    publish = env.center_grid("#publish-btn")
    shots, signals = [], []
    for _ in range(2):
        obs, reward, done, info = env.step(LeftClick(publish))
        assert info["target"]["id"] == "publish-btn" and info["target"]["disabled"]
        assert (reward, done) == (0.0, False)
        shots.append(obs["screenshot"])
        state, sig = update(state, _frame(obs["screenshot"]), [LeftClick(publish)], cfg)
        signals.append(sig)
    assert _same_outside(start, shots[0], clock) and _same_outside(start, shots[1], clock)
    assert "published" not in env.state()
    first, second = signals
    assert first.change["no_effect"] and first.recurrence["same_key_no_effect_run"] == 1
    assert not first.recurrence["r3_trigger"]
    assert second.change["no_effect"] and second.recurrence["same_key_no_effect_run"] == 2
    assert second.recurrence["r3_trigger"]


def test_first_no_effect_click_after_another_button_is_not_identical(env):
    # A real side effect: the clicked Refresh button keeps a focus ring until the click on the
    # disabled button moves focus away; only the repeats after that are identical. The R3
    # trigger still fires, counted from the first unchanged transition at the latest.
    cfg = DetectorConfig()
    obs = env.reset("publish")
    clock = [_xyxy(env.bounding_box("#clock"))]
    state, _ = update(new_state("web", _clock_region(env)), _frame(obs["screenshot"]), None, cfg)
    refresh = LeftClick(env.center_grid("#refresh-btn"))
    publish = LeftClick(env.center_grid("#publish-btn"))
    state, signals, shots = _feed(env, state, [refresh, publish, publish, publish], cfg)
    assert not signals[0].change["no_effect"]  # the status line appeared
    first = _diff_mask(shots[0], shots[1])
    assert first.any()
    assert _inside(first, [_xyxy(env.bounding_box("#refresh-btn")), *clock])
    assert not _inside(first, clock)  # more than the clock changed: the ring went away
    assert _same_outside(shots[1], shots[2], clock) and _same_outside(shots[2], shots[3], clock)
    triggers = [s.recurrence["r3_trigger"] for s in signals[1:]]
    assert not triggers[0] and triggers[-1]


@pytest.fixture(scope="module")
def report_wait(env):
    """One episode on the report page: wait in 0.3 s steps until the report shows.

    Records the screenshots, timings and the detector's signals for the tests below, so the
    two-second wait is paid once.
    """
    cfg = DetectorConfig()
    t0 = time.monotonic()
    obs = env.reset("q3_revenue")
    run = {
        "spinner": env.bounding_box("#spinner"),
        "content_at_start": env.bounding_box("#report-content"),
        "clock": env.bounding_box("#clock"),
        "waiting": [obs["screenshot"]],
        "spinning": [],
        "loaded": None,
        "loaded_at": None,
        "done_while_waiting": False,
    }
    x, y, w, h = run["spinner"] or (0, 0, 0, 0)
    run["spinner_hit"] = env.element_at(x + w / 2, y + h / 2)
    state, _ = update(new_state("web", _clock_region(env)), _frame(obs["screenshot"]), None, cfg)
    while time.monotonic() - t0 < SLOW_S + 6:
        obs, _, done, _ = env.step(Wait(0.3))
        run["done_while_waiting"] |= done
        state, sig = update(state, _frame(obs["screenshot"]), [Wait(0.3)], cfg)
        if env.bounding_box("#report-content") is not None:
            run["loaded_at"] = time.monotonic() - t0
            shot = env.screenshot()
            # Compared outside the clock: a clock tick between the two screenshots is no arrival.
            if not _same_outside(shot, obs["screenshot"], [_xyxy(run["clock"])]):
                # The table arrived between the step's screenshot and this check: the step's frame
                # still shows the spinner, so the arrival is the next (waiting) frame.
                run["waiting"].append(obs["screenshot"])
                run["spinning"].append(sig)
                state, sig = update(state, _frame(shot), [Wait(0.3)], cfg)
            run["loaded"] = sig
            break
        run["waiting"].append(obs["screenshot"])
        run["spinning"].append(sig)
    run["spinner_after"] = env.bounding_box("#spinner")
    run["table"] = env.page.inner_text("#report-table") if run["loaded"] else ""
    _, run["answer_reward"], run["answer_done"], _ = env.step(Answer("Q3 revenue was $4.2M"))
    return run


def test_slow_panel_shows_a_spinner_then_the_report(report_wait):
    run = report_wait
    assert run["spinner"] is not None and run["content_at_start"] is None
    assert run["spinner_hit"].id == "spinner"
    assert run["loaded_at"] is not None, "the report never appeared"
    assert SLOW_S * 0.75 <= run["loaded_at"] <= SLOW_S + 4
    assert not run["done_while_waiting"]
    assert len(run["waiting"]) >= 2
    # While waiting, only the spinner (and the clock) moves; it does move.
    spinner = _xyxy(run["spinner"])
    volatile = [spinner, _xyxy(run["clock"])]
    moved = [_diff_mask(a, b) for a, b in zip(run["waiting"], run["waiting"][1:], strict=False)]
    assert all(_inside(m, volatile, margin=2) for m in moved)
    x0, y0, x1, y1 = (int(v) for v in spinner)
    assert any(m[y0:y1, x0:x1].any() for m in moved)
    assert run["spinner_after"] is None
    assert "$4.2M" in run["table"]
    assert (run["answer_reward"], run["answer_done"]) == (1.0, True)


def test_spinner_while_waiting_is_not_a_loop(report_wait):
    assert report_wait["spinning"] and report_wait["loaded"] is not None
    for sig in [*report_wait["spinning"], report_wait["loaded"]]:
        rec = sig.recurrence
        assert not rec["r3_trigger"] and rec["same_key_no_effect_run"] == 0
        assert rec["cycle_len"] is None
        assert rec["screen_revisits"] == 0


def test_report_arriving_during_a_wait_is_a_change(report_wait):
    assert report_wait["loaded"] is not None
    assert not report_wait["loaded"].change["no_effect"]


def test_typing_into_the_form(env):
    env.reset("add_contact")
    env.step(LeftClick(env.center_grid("#nav-form")))
    obs, reward, _, _ = env.step(LeftClick(env.center_grid("#submit-btn")))
    assert reward == 0.0 and env.page.inner_text("#form-result") == "Name is required"
    env.step(LeftClick(env.center_grid("#name")))
    before, *_ = env.step(Type("Grace Hopper"))
    assert env.page.input_value("#name") == "Grace Hopper"
    env.step(Key(("ctrl", "a")))
    after, *_ = env.step(Type("Ada Lovelace"))
    assert env.page.input_value("#name") == "Ada Lovelace"
    changed = _diff_mask(before["screenshot"], after["screenshot"])
    assert _inside(changed, [_xyxy(env.bounding_box("#name")), _xyxy(env.bounding_box("#clock"))])
    obs, reward, done, info = env.step(LeftClick(env.center_grid("#submit-btn")))
    assert (reward, done, info["success"]) == (1.0, True, True)
    assert env.page.inner_text("#form-result") == "Saved contact Ada Lovelace"
    assert env.state()["form"]["name"] == "Ada Lovelace"


def test_settings_dialog_opens_and_closes(env):
    home = env.reset("dark_mode")["screenshot"]
    is_open = "() => document.getElementById('settings-dialog').open"
    opened, *_ = env.step(LeftClick(env.center_grid("#settings-btn")))
    assert env.page.evaluate(is_open)
    dialog = _xyxy(env.bounding_box("#settings-dialog"))
    assert not _inside(_diff_mask(home, opened["screenshot"]), [dialog])  # the backdrop dims
    # The modal blocks the page: the point of the Refresh button now hits the backdrop.
    rx, ry = env.to_px(env.center_grid("#refresh-btn"))
    assert env.element_at(rx, ry).id != "refresh-btn"
    env.step(LeftClick(env.center_grid("#settings-close")))
    assert not env.page.evaluate(is_open)
    env.step(LeftClick(env.center_grid("#settings-btn")))
    assert env.page.evaluate(is_open)
    _, reward, _, _ = env.step(Key(("Escape",)))
    assert not env.page.evaluate(is_open) and reward == 0.0
    env.step(LeftClick(env.center_grid("#settings-btn")))
    env.step(LeftClick(env.center_grid("#dark-toggle")))
    dark, reward, done, _ = env.step(LeftClick(env.center_grid("#settings-save")))
    assert (reward, done) == (1.0, True)
    assert not env.page.evaluate(is_open)
    assert _rgb(dark["screenshot"]).mean() < _rgb(home).mean() - 40


def test_scroll_reveals_new_content_and_comes_back(quiet):
    top = quiet.reset(WebTask(instruction="", start="items.html"))["screenshot"]
    assert quiet.bounding_box("#item-18")[1] > VIEWPORT[1]  # below the fold
    down, *_ = quiet.step(Scroll(-300, (500, 500)))
    assert quiet.page.evaluate("() => window.scrollY") > 0
    assert down["screenshot"] != top
    assert quiet.bounding_box("#item-18")[1] < VIEWPORT[1]
    back, *_ = quiet.step(Scroll(300, (500, 500)))
    assert back["screenshot"] == top
    quiet.step(Scroll(-300, (500, 500)))
    again = quiet.reset(WebTask(instruction="", start="items.html"))["screenshot"]
    assert quiet.page.evaluate("() => window.scrollY") == 0 and again == top


# --- the recurrence detector on real screenshots --------------------------------------------


def test_clicks_that_change_the_screen_do_not_trigger(env):
    cfg = DetectorConfig()
    obs = env.reset(WebTask(instruction="", start="items.html"))
    state, _ = update(new_state("web", _clock_region(env)), _frame(obs["screenshot"]), None, cfg)
    rows = [LeftClick(env.center_grid(f"#item-{i}")) for i in (1, 2, 3, 4)]
    state, signals, _ = _feed(env, state, rows, cfg)
    for sig in signals:
        assert not sig.change["no_effect"] and not sig.recurrence["r3_trigger"]
        assert sig.recurrence["same_key_no_effect_run"] == 0


# --- interface details -------------------------------------------------------------------------


def test_dict_actions_unsupported_actions_and_episode_end(env):
    env.reset(WebTask(instruction="explore", start="items.html", max_steps=3))
    grid = list(env.center_grid("#item-2"))
    _, _, done, info = env.step({"action": "left_click", "coordinate": grid})
    assert info["target"]["id"] == "item-2" and env.state()["selected"] == "item-2"
    assert not done
    _, _, done, info = env.step(Open("Calculator"))
    assert info["error"] == "unsupported_action" and not done
    _, _, done, _ = env.step(Wait(0))
    assert done  # max_steps reached
    env.reset()
    _, reward, done, _ = env.step(Terminate("success"))
    assert (reward, done) == (0.0, True)
    with pytest.raises(ValueError, match="bad action"):
        env.step({"action": "left_click", "coordinate": [2000, 1]})


def test_reset_names_built_in_tasks(env):
    obs = env.reset("select_invoice")
    assert obs["instruction"] == TASKS["select_invoice"].instruction
    with pytest.raises(ValueError, match="built-in tasks"):
        env.reset("no_such_task")
    with pytest.raises(ValueError, match="start must be one of"):
        WebTask(instruction="x", start="missing.html")


def test_reset_starts_clean(env):
    env.reset(WebTask(instruction="", start="items.html"))
    env.step(LeftClick(env.center_grid("#item-3")))
    env.step(LeftClick(env.center_grid("#nav-form")))
    assert env.state()["selected"] == "item-3"
    env.reset(WebTask(instruction="", start="items.html"))
    assert env.state() == {}
    assert env.page.query_selector("#item-list li.selected") is None
    assert env.page.go_back() is None  # no history from the last episode
    assert env.page.url.endswith("/items.html")


def test_refuses_to_start_inside_an_event_loop(env):
    errors = []

    async def start():
        try:
            BrowserEnv()
        except RuntimeError as exc:
            errors.append(str(exc))

    # A thread of its own: the module's browser already holds this thread's event loop.
    worker = threading.Thread(target=asyncio.run, args=(start(),))
    worker.start()
    worker.join(timeout=30)
    assert len(errors) == 1 and "asyncio.to_thread" in errors[0]


def test_find_browser_honours_the_override(monkeypatch, tmp_path):
    monkeypatch.setenv(BROWSER_ENV_VAR, str(tmp_path / "no-chromium"))
    assert find_browser() is None
    with pytest.raises(BrowserNotFound, match="apt-get install chromium"):
        BrowserEnv()
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(BROWSER_ENV_VAR, str(fake))
    assert find_browser() == str(fake)


def test_web_app_serves_pages_and_the_slow_report():
    with WebApp(slow_seconds=0.2) as app:
        with urllib.request.urlopen(app.url("form.html"), timeout=5) as page:
            assert page.status == 200 and 'id="contact-form"' in page.read().decode()
            assert page.headers["Cache-Control"] == "no-store"
        t0 = time.monotonic()
        with urllib.request.urlopen(app.url("api/report"), timeout=5) as report:
            rows = json.loads(report.read())["rows"]
        assert time.monotonic() - t0 >= 0.2
        assert ["Q3", "$4.2M"] in rows
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(app.url("nope.html"), timeout=5)
    with pytest.raises(ValueError, match="port"):
        WebApp(port=70000)
