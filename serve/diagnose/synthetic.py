"""Failed runs with a known, injected root cause, for testing and measuring the diagnoser.

A small simulated settings app (sidebar menu, tabs, form fields, a Save button, a Back button)
is drawn with PIL. Each case has a task ("In Mail, open the Profile tab, set Name to ... and
save"), a correct prefix of the plan, then one injected error at step ``root_step``, followed by
its consequences; the run always fails. Error kinds and their critic dimension:

* ``dead_click`` (Grounding/Spatial Error): a click beside the intended element, on empty space;
  no effect; repeated, then the agent gives up or declares success.
* ``wrong_element`` (Semantic Error): a click on a wrong menu item or tab that opens a wrong page;
  the agent either carries on there and "saves" the wrong form, or backs out and repeats the
  same wrong click.
* ``premature_done`` (Termination Misjudgment): ``DONE`` before the task is complete.
* ``unfocused_type`` (Procedural Prerequisite Neglect): typing without clicking the field first;
  no effect; retyped, or saved empty.
* ``wrong_scroll`` (Parameter Vector Miscalibration): scrolling up at the top of a long page to
  reach the Save button below; no effect; repeated.
* ``malformed`` (Action Formulation Error): pyautogui code that does not parse; no effect.

Correct prefixes carry distractors real runs have: harmless waits, hovers and a no-effect click
on the page heading. Cases are written as OSWorld result folders (``write_osworld``) and as
gateway traces with a simulated, imperfect critic and history model (``write_trace``).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from hivig.actions import ActionError, render_tool_calls
from hivig.taxonomy import DIMENSIONS
from hivig.vision import encode_png
from serve.diagnose.loaders import parse_osworld_action

W, H = 960, 540
SIDEBAR = 200
TITLE = 40

KINDS = (
    "dead_click",
    "wrong_element",
    "premature_done",
    "unfocused_type",
    "wrong_scroll",
    "malformed",
)
"""Injected error kinds."""

DIMENSION_OF = {
    "dead_click": "Grounding/Spatial Error",
    "wrong_element": "Semantic Error",
    "premature_done": "Termination Misjudgment",
    "unfocused_type": "Procedural Prerequisite Neglect",
    "wrong_scroll": "Parameter Vector Miscalibration",
    "malformed": "Action Formulation Error",
}
"""The critic dimension of each kind (its CUADebug code via ``hivig.taxonomy``)."""

_PAGES = ("Home", "Mail", "Calendar", "Contacts", "Settings", "Files", "Photos", "Notes")
_TABS = ("General", "Profile", "Privacy", "Security", "Display", "Sound")
_FIELDS = ("Name", "Email", "City", "Phone", "Title", "Company")
_VALUES = ("Ada Lovelace", "ada@example.org", "Lisbon", "555-0199", "Engineer", "Acme Ltd")


# --------------------------------------------------------------------------------------------
# The simulated app


@dataclass
class AppState:
    """What the app shows."""

    page: str
    tab: int = 0
    focus: int | None = None
    offset: int = 0
    saved: bool = False
    values: dict[tuple[str, int, int], str] = field(default_factory=dict)
    back: list[tuple[str, int]] = field(default_factory=list)


class App:
    """Layout, hit-testing, transitions and rendering of one seeded app."""

    def __init__(self, rng: random.Random, long_page: bool) -> None:
        self.pages = rng.sample(_PAGES, 6)
        self.tabs = {p: rng.sample(_TABS, 3) for p in self.pages}
        self.fields = {p: rng.sample(_FIELDS, 3) for p in self.pages}
        self.long_page = long_page
        self.bg = tuple(rng.randint(228, 250) for _ in range(3))
        self.accent = (rng.randint(20, 90), rng.randint(70, 140), rng.randint(150, 220))

    # Geometry (pixels) ----------------------------------------------------------------------

    @staticmethod
    def menu_box(i: int) -> tuple[int, int, int, int]:
        """Sidebar row ``i``."""
        return (0, 52 + 48 * i, SIDEBAR, 52 + 48 * i + 42)

    @staticmethod
    def tab_box(j: int) -> tuple[int, int, int, int]:
        """Tab ``j`` of the content area."""
        return (220 + 130 * j, 96, 340 + 130 * j, 128)

    @staticmethod
    def field_box(f: int, offset: int) -> tuple[int, int, int, int]:
        """Text field ``f`` at scroll ``offset``."""
        y = 160 + 70 * f - offset
        return (330, y, 720, y + 32)

    def save_box(self, offset: int) -> tuple[int, int, int, int]:
        """The Save button (below the fold on a long page)."""
        y = (640 if self.long_page else 380) - offset
        return (220, y, 330, y + 34)

    back_box = (8, 8, 72, 32)
    heading_box = (220, 52, 520, 84)

    def max_offset(self) -> int:
        """How far the content scrolls."""
        return 320 if self.long_page else 0

    @staticmethod
    def visible(box: tuple[int, int, int, int]) -> bool:
        """Whether a content box lies inside the visible content area."""
        return box[1] >= 136 and box[3] <= H

    @staticmethod
    def centre(box: tuple[int, int, int, int]) -> tuple[int, int]:
        """Centre of a box."""
        return ((box[0] + box[2]) // 2, (box[1] + box[3]) // 2)

    # Transitions ---------------------------------------------------------------------------

    def click(self, s: AppState, x: int, y: int) -> AppState:
        """The state after a left click at pixel ``(x, y)``."""

        def inside(b: tuple[int, int, int, int]) -> bool:
            return b[0] <= x < b[2] and b[1] <= y < b[3]

        if inside(self.back_box):
            if not s.back:
                return s
            page, tab = s.back[-1]
            return replace(
                s, page=page, tab=tab, focus=None, offset=0, saved=False, back=s.back[:-1]
            )
        for i, page in enumerate(self.pages):
            if inside(self.menu_box(i)):
                if page == s.page:
                    return s
                return replace(
                    s,
                    page=page,
                    tab=0,
                    focus=None,
                    offset=0,
                    saved=False,
                    back=[*s.back, (s.page, s.tab)],
                )
        for j in range(3):
            if inside(self.tab_box(j)):
                if j == s.tab:
                    return s
                return replace(
                    s, tab=j, focus=None, offset=0, saved=False, back=[*s.back, (s.page, s.tab)]
                )
        for f in range(3):
            box = self.field_box(f, s.offset)
            if self.visible(box) and inside(box):
                return replace(s, focus=f)
        box = self.save_box(s.offset)
        if self.visible(box) and inside(box):
            return replace(s, saved=True, focus=None)
        return s

    def type_text(self, s: AppState, text: str) -> AppState:
        """The state after typing ``text`` (nothing happens without a focused field)."""
        if s.focus is None:
            return s
        key = (s.page, s.tab, s.focus)
        values = dict(s.values)
        values[key] = values.get(key, "") + text
        return replace(s, values=values, saved=False)

    def scroll(self, s: AppState, clicks: int) -> AppState:
        """The state after a wheel scroll (negative scrolls the content up, showing more)."""
        offset = min(self.max_offset(), max(0, s.offset - 64 * clicks))
        return s if offset == s.offset else replace(s, offset=offset)

    # Rendering ------------------------------------------------------------------------------

    def render(self, s: AppState) -> Image.Image:
        """The screenshot of a state."""
        img = Image.new("RGB", (W, H), self.bg)
        d = ImageDraw.Draw(img)
        d.rectangle((0, 0, W, TITLE), fill=self.accent)
        d.rectangle(self.back_box, fill=(235, 235, 235), outline=(40, 40, 40))
        d.text((20, 14), "Back", fill=(20, 20, 20))
        d.text((90, 14), f"Settings app - {s.page}", fill=(255, 255, 255))
        d.rectangle((0, TITLE, SIDEBAR, H), fill=(215, 218, 225))
        for i, page in enumerate(self.pages):
            box = self.menu_box(i)
            if page == s.page:
                d.rectangle(box, fill=(180, 195, 230))
            d.text((24, box[1] + 14), page, fill=(20, 20, 20))
        d.text(
            (self.heading_box[0], self.heading_box[1] + 8),
            f"{s.page} preferences",
            fill=(30, 30, 30),
        )
        for j, tab in enumerate(self.tabs[s.page]):
            box = self.tab_box(j)
            d.rectangle(
                box, fill=self.accent if j == s.tab else (225, 225, 225), outline=(90, 90, 90)
            )
            d.text(
                (box[0] + 16, box[1] + 10),
                tab,
                fill=(255, 255, 255) if j == s.tab else (20, 20, 20),
            )
        for f, name in enumerate(self.fields[s.page]):
            box = self.field_box(f, s.offset)
            if not self.visible(box):
                continue
            d.text((220, box[1] + 10), f"{self.tabs[s.page][s.tab]} {name}", fill=(40, 40, 40))
            focused = s.focus == f
            d.rectangle(
                box,
                fill=(255, 255, 255),
                outline=self.accent if focused else (150, 150, 150),
                width=3 if focused else 1,
            )
            value = s.values.get((s.page, s.tab, f), "")
            d.text((box[0] + 8, box[1] + 10), value, fill=(10, 10, 10))
            if focused:
                cx = box[0] + 10 + 6 * len(value)
                d.line((cx, box[1] + 6, cx, box[3] - 6), fill=(0, 0, 0), width=2)
        if self.long_page:
            for k in range(4):  # filler rows so the page needs scrolling
                y = 380 + 50 * k - s.offset
                if 136 <= y <= H - 20:
                    d.rectangle((220, y, 900, y + 30), fill=(236, 236, 240))
                    d.text((230, y + 9), f"Advanced option {k + 1}", fill=(90, 90, 90))
        box = self.save_box(s.offset)
        if self.visible(box):
            d.rectangle(box, fill=(40, 140, 60), outline=(20, 60, 20))
            d.text((box[0] + 36, box[1] + 11), "Save", fill=(255, 255, 255))
        if s.saved:
            d.rectangle((700, 52, 940, 84), fill=(210, 240, 210), outline=(40, 140, 60))
            d.text((712, 62), "Changes saved", fill=(20, 80, 20))
        return img


# --------------------------------------------------------------------------------------------
# Cases


@dataclass
class SyntheticStep:
    """One executed action: pyautogui code, its intent, and the screen after it."""

    code: str
    intent: str
    after: Image.Image


@dataclass
class SyntheticCase:
    """A failed run with its injected root cause.

    Attributes:
        seed: The generator seed.
        kind: One of ``KINDS``.
        task: The instruction.
        root_step: The injected step, 1-based (the first step is always correct).
        dimension: The critic dimension of the injected error.
        initial: The screen before step 1.
        steps: The executed actions, in order.
    """

    seed: int
    kind: str
    task: str
    root_step: int
    dimension: str
    initial: Image.Image
    steps: list[SyntheticStep]


class _Agent:
    """Executes actions on the app, recording code, intent and screens."""

    def __init__(self, app: App, state: AppState) -> None:
        self.app = app
        self.state = state
        self.steps: list[SyntheticStep] = []

    def _record(self, code: str, intent: str) -> None:
        self.steps.append(SyntheticStep(code, intent, self.app.render(self.state)))

    def click(self, xy: tuple[int, int], intent: str) -> None:
        self.state = self.app.click(self.state, *xy)
        self._record(f"pyautogui.click({xy[0]}, {xy[1]})", intent)

    def type(self, text: str, intent: str) -> None:
        self.state = self.app.type_text(self.state, text)
        self._record(f"pyautogui.typewrite({text!r})", intent)

    def scroll(self, clicks: int, intent: str) -> None:
        self.state = self.app.scroll(self.state, clicks)
        self._record(f"pyautogui.scroll({clicks})", intent)

    def hover(self, xy: tuple[int, int], intent: str) -> None:
        self._record(f"pyautogui.moveTo({xy[0]}, {xy[1]})", intent)

    def special(self, code: str, intent: str) -> None:
        self._record(code, intent)

    def raw(self, code: str, intent: str) -> None:
        self._record(code, intent)  # malformed code changes nothing


def _plan(app: App, page: str, tab: int, fld: int, value: str) -> list[tuple[str, Any, str]]:
    """The correct plan as ``(op, argument, intent)``; ``op`` in click/type/scroll/done."""
    i = app.pages.index(page)
    tab_name, field_name = app.tabs[page][tab], app.fields[page][fld]
    plan: list[tuple[str, Any, str]] = [
        ("click", app.centre(app.menu_box(i)), f"Open {page} in the sidebar"),
    ]
    if tab != 0:
        plan.append(("click", app.centre(app.tab_box(tab)), f"Open the {tab_name} tab"))
    plan.append(("click", app.centre(app.field_box(fld, 0)), f"Click the {field_name} field"))
    plan.append(("type", value, f"Type {value!r} into {field_name}"))
    offset = 0
    if app.long_page:
        plan.append(("scroll", -5, "Scroll down to the Save button"))
        offset = app.max_offset()
    plan.append(("click", app.centre(app.save_box(offset)), "Click Save"))
    plan.append(("done", None, "The task is complete"))
    return plan


def _do(agent: _Agent, op: str, arg: Any, intent: str) -> None:
    if op == "click":
        agent.click(arg, intent)
    elif op == "type":
        agent.type(arg, intent)
    elif op == "scroll":
        agent.scroll(arg, intent)
    elif op == "done":
        agent.special("DONE", intent)


def _distract(agent: _Agent, rng: random.Random) -> None:
    """Harmless prefix noise: a wait, a hover, or a no-effect click on the heading."""
    roll = rng.random()
    if roll < 0.2:
        agent.special("WAIT", "Wait for the page to settle")
    elif roll < 0.4:
        agent.hover((rng.randint(400, 900), rng.randint(150, 500)), "Look at the form")
    elif roll < 0.55:
        agent.click(
            agent.app.centre(agent.app.heading_box), "Click the heading to focus the window"
        )


def _root_positions(kind: str, plan: list[tuple[str, Any, str]]) -> list[int]:
    """Plan indices (>= 1) where ``kind`` can be injected."""
    ops = [op for op, _, _ in plan]
    out = []
    for k in range(1, len(plan)):
        op, intent = ops[k], plan[k][2]
        ok = {
            "dead_click": op == "click",
            "wrong_element": op == "click" and ("tab" in intent or "sidebar" in intent),
            "premature_done": op != "done",
            "unfocused_type": op == "click" and "field" in intent,
            "wrong_scroll": op == "scroll",
            "malformed": op == "click",
        }[kind]
        if ok:
            out.append(k)
    return out


def _inject(agent: _Agent, kind: str, plan: list, k: int, rng: random.Random) -> None:
    """Execute the injected error at plan index ``k`` and its consequences."""
    app = agent.app
    op, arg, intent = plan[k]
    if kind == "dead_click":
        x, y = arg
        spot = (min(W - 5, x + rng.choice((1, -1)) * rng.randint(70, 110)), y)
        if app.click(agent.state, *spot) is not agent.state:
            spot = (940, 520)  # the bottom-right corner is empty in every layout
        for _ in range(1 + rng.randint(1, 3)):
            agent.click(spot, intent)
        agent.special(rng.choice(("FAIL", "DONE")), "It does not respond")
    elif kind == "wrong_element":
        is_tab = "tab" in intent
        if is_tab:
            choices = [j for j in range(3) if j not in (agent.state.tab, _tab_of(app, arg))]
            wrong = app.centre(app.tab_box(rng.choice(choices)))
        else:
            current = app.pages.index(agent.state.page) if agent.state.page in app.pages else -1
            target = next(i for i in range(6) if app.centre(app.menu_box(i)) == arg)
            choices = [i for i in range(6) if i not in (current, target)]
            wrong = app.centre(app.menu_box(rng.choice(choices)))
        agent.click(wrong, intent)
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 2)):  # backs out, then repeats the same wrong click
                agent.click(app.centre(app.back_box), "Go back, that was the wrong page")
                agent.click(wrong, intent)
            agent.special("FAIL", "I cannot find the option")
        else:  # carries on with the rest of the plan on the wrong page
            for op2, arg2, intent2 in plan[k + 1 :]:
                _do(agent, op2, arg2, intent2)
    elif kind == "premature_done":
        agent.special("DONE", "The task is complete")
    elif kind == "unfocused_type":
        value = next(a for o, a, _ in plan if o == "type")
        for _ in range(1 + rng.randint(0, 2)):
            agent.type(value, f"Type {value!r}")
        if rng.random() < 0.5:
            for op2, arg2, intent2 in plan[k + 2 :]:
                _do(agent, op2, arg2, intent2)
        else:
            agent.special("FAIL", "The text does not appear")
    elif kind == "wrong_scroll":
        for _ in range(1 + rng.randint(1, 2)):
            agent.scroll(5, intent)
        agent.click(plan[k + 1][1], "Click Save")  # where Save should be: still off-screen
        agent.special(rng.choice(("FAIL", "DONE")), "Giving up")
    elif kind == "malformed":
        x, y = arg
        code = rng.choice(
            (f"pyautogui.click(x={x} y={y})", f"pyautogui.clickk({x}, {y})", f"click({x}, {y}")
        )
        for _ in range(1 + rng.randint(0, 2)):
            agent.raw(code, intent)
        agent.special("FAIL", "The action keeps failing")


def _tab_of(app: App, xy: tuple[int, int]) -> int:
    return next(j for j in range(3) if app.centre(app.tab_box(j)) == xy)


def make_case(seed: int, kind: str | None = None) -> SyntheticCase:
    """Generate one failed run.

    Args:
        seed: Seed of layout, task, injected position and consequences.
        kind: The error kind; by default ``KINDS[seed % len(KINDS)]``.

    Returns:
        The case; ``root_step`` is the 1-based index of the injected action.

    Raises:
        ValueError: ``kind`` is not one of ``KINDS``.
    """
    kind = kind or KINDS[seed % len(KINDS)]
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {KINDS}")
    rng = random.Random(f"hivig-diagnose-{seed}-{kind}")
    app = App(rng, long_page=kind == "wrong_scroll" or rng.random() < 0.3)
    start, page = rng.sample(app.pages, 2)
    tab = rng.randrange(3) if kind != "wrong_element" else rng.randrange(1, 3)
    fld = rng.randrange(3)
    value = rng.choice(_VALUES)
    task = (
        f"In {page}, open the {app.tabs[page][tab]} tab, set {app.fields[page][fld]} to "
        f"'{value}' and save."
    )
    plan = _plan(app, page, tab, fld, value)
    k = rng.choice(_root_positions(kind, plan))
    agent = _Agent(app, AppState(page=start))
    initial = app.render(agent.state)
    for op, arg, intent in plan[:k]:
        _do(agent, op, arg, intent)
        if rng.random() < 0.3:
            _distract(agent, rng)
    root = len(agent.steps) + 1
    _inject(agent, kind, plan, k, rng)
    return SyntheticCase(seed, kind, task, root, DIMENSION_OF[kind], initial, agent.steps)


def make_cases(n: int, seed0: int = 0) -> list[SyntheticCase]:
    """``n`` cases with seeds ``seed0..seed0+n-1``, kinds in turn."""
    return [make_case(seed0 + i) for i in range(n)]


# --------------------------------------------------------------------------------------------
# Writers


def _timestamp(k: int) -> str:
    return f"20260101@{10 + k // 3600:02d}{(k // 60) % 60:02d}{k % 60:02d}"


def write_osworld(
    case: SyntheticCase, folder: str | Path, *, response_objects: bool = True
) -> Path:
    """Write a case as an OSWorld result folder (``traj.jsonl``, screenshots, ``result.txt``).

    Args:
        case: The case.
        folder: The folder to create.
        response_objects: Write ``response`` as an object on every other line (some forks do),
            else always as a string.

    Returns:
        The folder.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for n, step in enumerate(case.steps, start=1):
        ts = _timestamp(n * 7)
        name = f"step_{n}_{ts}.png"
        (out / name).write_bytes(encode_png(step.after, compress_level=1))
        response: Any = f"Thought: {step.intent}.\nAction: {step.code}"
        if response_objects and n % 2 == 0:
            response = {"thought": step.intent, "action": step.code}
        done = step.code in ("DONE", "FAIL")
        lines.append(
            {
                "step_num": n,
                "action_timestamp": ts,
                "action": step.code,
                "response": response,
                "reward": 0,
                "done": done,
                "info": {},
                "screenshot_file": name,
            }
        )
    (out / "traj.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    (out / "result.txt").write_text("0.0\n", encoding="utf-8")
    (out / "task.json").write_text(json.dumps({"instruction": case.task}), encoding="utf-8")
    return out


def _store(images: Path, image: Image.Image) -> str:
    data = encode_png(image, compress_level=1)
    digest = hashlib.sha256(data).hexdigest()
    path = images / f"{digest}.png"
    if not path.exists():
        path.write_bytes(data)
    return f"sha256:{digest}"


def _action_obj(code: str, intent: str) -> dict[str, Any]:
    parsed = parse_osworld_action(code, W, H)
    if isinstance(parsed, ActionError):
        return {
            "intent": intent,
            "action_text": code,
            "raw": code,
            "parse_error": f"{parsed.reason}: {parsed.message}",
        }
    return {
        "intent": intent,
        "action_text": render_tool_calls(parsed, "computer_use"),
        "raw": code,
        "parse_error": None,
    }


def write_trace(
    case: SyntheticCase,
    state_dir: str | Path,
    *,
    critic_recall: float = 0.5,
    critic_false_bad: float = 0.08,
    history_recall: float = 0.7,
) -> Path:
    """Write a case as a gateway session trace with a simulated, imperfect critic and history.

    The simulated critic flags the injected step Bad with probability ``critic_recall`` and any
    other step with ``critic_false_bad``; some steps also carry a rejected alternative (a Bad
    critique of an action that was not executed). The simulated history reports a no-effect
    step as a failure with probability ``history_recall``.

    Args:
        case: The case.
        state_dir: The gateway state folder (``traces/`` and ``images/`` are created).
        critic_recall: P(Bad verdict on the injected step).
        critic_false_bad: P(Bad verdict on any other executed step).
        history_recall: P(the history reports a no-effect step as failed).

    Returns:
        The trace file.
    """
    rng = random.Random(f"trace-{case.seed}-{case.kind}")
    root = Path(state_dir)
    images, traces = root / "images", root / "traces"
    images.mkdir(parents=True, exist_ok=True)
    traces.mkdir(parents=True, exist_ok=True)
    sid = f"synthetic-{case.seed}"
    screens = [case.initial] + [s.after for s in case.steps]
    refs = [_store(images, s) for s in screens]
    t = "2026-01-01T10:00:00Z"
    lines: list[dict[str, Any]] = [
        {
            "event": "session",
            "session_id": sid,
            "time": t,
            "task": case.task,
            "platform": "ubuntu",
            "screen": {"w": W, "h": H},
            "coord_space": "screen_px",
        }
    ]
    summary = "No action has been taken yet."
    terminal = case.steps[-1].code in ("DONE", "FAIL")
    last_obs = len(case.steps) - 1 if terminal else len(case.steps)
    others = [d.name for d in DIMENSIONS]
    for k in range(last_obs + 1):
        obs: dict[str, Any] = {
            "event": "observe",
            "session_id": sid,
            "step_idx": k,
            "time": t,
            "image_ref": refs[k],
            "status": "ok",
            "reason": None,
        }
        if k > 0:
            step = case.steps[k - 1]
            no_effect = screens[k].tobytes() == screens[k - 1].tobytes()
            if no_effect and rng.random() < history_recall:
                result = "The action had no visible effect; the screen is unchanged."
            else:
                result = f"The screen now shows {step.intent.lower()}."
                summary = f"{summary} Then: {step.intent}."
            obs.update(
                prev_image_ref=refs[k - 1],
                prev_action=_action_obj(step.code, step.intent),
                history={
                    "progress_summary": summary,
                    "last_action_result": result,
                    "version": k,
                    "stale": False,
                },
            )
        lines.append(obs)
        if k < len(case.steps):
            step = case.steps[k]
            injected = k + 1 == case.root_step
            bad = rng.random() < (critic_recall if injected else critic_false_bad)
            dim = None
            if bad:
                dim = case.dimension if injected and rng.random() < 0.6 else rng.choice(others)
            if rng.random() < 0.15:  # a rejected alternative the agent did not execute
                lines.append(
                    _critique(
                        sid,
                        k,
                        refs[k],
                        "pyautogui.click(5, 530)",
                        "Alternative",
                        "bad",
                        "Visual Hallucination",
                        rng,
                    )
                )
            lines.append(
                _critique(
                    sid, k, refs[k], step.code, step.intent, "bad" if bad else "good", dim, rng
                )
            )
    lines.append({"event": "close", "session_id": sid, "time": t})
    path = traces / f"{sid}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def _critique(
    sid: str, k: int, ref: str, code: str, intent: str, verdict: str, dim: str | None, rng: Any
) -> dict[str, Any]:
    explanation = (
        "The step targets an element that does not advance the task."
        if dim
        else ("The step moves the task forward.")
    )
    return {
        "event": "critique",
        "session_id": sid,
        "step_idx": k,
        "time": "2026-01-01T10:00:00Z",
        "image_ref": ref,
        # The gateway's shape: one entry per candidate (a single action is a list of one).
        "actions": [_action_obj(code, intent)],
        "marks": [[]],
        "prompt": [],
        "raw_outputs": [None],
        "verdicts": [
            {
                "status": "ok",
                "verdict": verdict,
                "source": "model",
                "reason": None,
                "error_dimension": dim,
                "explanation": explanation,
                "confidence": round(rng.uniform(0.55, 0.99), 2),
            }
        ],
        "timing_ms": {"total": 1},
    }
