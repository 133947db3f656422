"""Runner adapters inside loops shaped like the real harnesses, against a real gateway.

Every test drives a fake written from the upstream loop's facts (call signature, return arity,
executor, the agent's memory attributes) through ``serve.adapters`` and a gateway served on
127.0.0.1 by uvicorn with a scripted critic backend, and checks what the critic saw (the
backend keeps the critique prompts) against what the fake executor ran:

* OSWorld give-up: by default nothing is made up for the evaluator (``FAIL`` scores 1.0 on an
  infeasible task); ending the episode is opt-in and then has the agent's own arity (OpenCUA's
  loop unpacks three values).
* Repaired action text is judged as written, clean text as canonical tool calls.
* AndroidWorld index actions are judged at their element's centre, the marker on the element.
* ScaleCUA's multi-command AndroidWorld step is ONE proposal: nothing runs on a rejection and
  the agent is asked again.
* ScaleCUA's memory (``history_instruction``, ``step_his``, ``turn_number``) leaves no trace of
  a rejected proposal; ``[0, 1]`` coordinates under a pixel space are loud, not silent.
* Attribute writes reach the wrapped agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from serve.adapters import GuardedAndroidWorldAgent, GuardedOSWorldAgent, GuardedScaleCUAAgent
from serve.adapters.qwen import TOOL_CALL_FORMAT, qwen_messages
from serve.app import create_app
from serve.client import CriticClient
from serve.guard import GuardConfig, PolicyContext, R3Config
from tests.fakes.gateway import LiveServer, ScriptedBackend, screen, serve_config

OSWORLD_SCREEN = (640, 360)


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[tuple[ScriptedBackend, str]]:
    """One real gateway for the module; tests reset its scripted backend."""
    backend = ScriptedBackend()
    cfg = serve_config(tmp_path_factory.mktemp("gw") / "state", "sessions.store=memory")
    with LiveServer(create_app(cfg, backend)) as srv:
        yield backend, srv.url


@pytest.fixture
def gateway(live) -> Iterator[tuple[ScriptedBackend, CriticClient]]:
    backend, url = live
    backend.calls.clear()
    backend.bad_if, backend.verdict = None, "good"
    with CriticClient(url) as client:
        yield backend, client


def critiques(backend: ScriptedBackend) -> list[str]:
    """The proposed step of every critique prompt the critic got, in order."""
    out = []
    for kind, messages in backend.calls:
        if kind == "critique":
            text = messages[-1].text()
            out.append(text[text.index("Current Proposed Step:") :])
    return out


# ---------------------------------------------------------------------------------------------
# OSWorld: give-up, the evaluator's view, the stop value's arity


@dataclasses.dataclass
class FakeDesktopEnv:
    """OSWorld's ``DesktopEnv`` as ``lib_run_single`` uses it: ``step(action)`` runs pyautogui
    code or a special string; ``evaluate()`` scores the episode. On an infeasible task OSWorld's
    evaluator returns 1.0 exactly when the last action is ``FAIL`` (0 elsewhere)."""

    infeasible: bool
    executed: list[str] = dataclasses.field(default_factory=list)

    def observation(self) -> dict[str, Any]:
        # A click on dead space: the screen never changes.
        return {"screenshot": screen(*OSWORLD_SCREEN), "accessibility_tree": None}

    def step(self, action: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        self.executed.append(action)
        return self.observation(), 0.0, action in ("DONE", "FAIL"), {}

    def evaluate(self) -> float:
        last = self.executed[-1] if self.executed else None
        if self.infeasible:
            return 1.0 if last == "FAIL" else 0.0
        return 0.0


class DeadClickAgent:
    """An OSWorld PromptAgent-like agent (``thoughts``/``actions`` lists) stuck on one click;
    ``arity=3`` answers like OpenCUA's agent: ``(response, actions, info)``."""

    def __init__(self, arity: int = 2) -> None:
        self.arity = arity
        self.thoughts: list[str] = []
        self.actions: list[list[str]] = []

    def reset(self, _logger: Any = None) -> None:
        self.thoughts, self.actions = [], []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[Any, ...]:
        out = ("The button must be there.", ["pyautogui.click(100, 100)"])
        self.thoughts.append(out[0])
        self.actions.append(out[1])
        return out if self.arity == 2 else (*out, {"usage": 1})


def run_osworld(agent: Any, env: FakeDesktopEnv, max_steps: int, unpack: int) -> float:
    """``lib_run_single.run_single_example``'s loop; ``unpack`` values per ``predict``."""
    agent.reset()
    obs = env.observation()
    for _ in range(max_steps):
        if unpack == 3:
            response, actions, info = agent.predict("Turn on the VPN", obs)
            assert isinstance(info, dict)
        else:
            response, actions = agent.predict("Turn on the VPN", obs)
        done = False
        for action in actions:
            obs, _, done, _ = env.step(action)
            if done:
                break
        if done:
            break
    return env.evaluate()


def test_osworld_give_up_never_fabricates_fail_by_default(gateway):
    """The loop on a dead click: R3 fires, every reroute fails. The guard used to answer FAIL,
    which the evaluator scored 1.0 on an infeasible task."""
    backend, client = gateway
    env = FakeDesktopEnv(infeasible=True)
    guarded = GuardedOSWorldAgent(DeadClickAgent(), client, screen=OSWORLD_SCREEN)
    score = run_osworld(guarded, env, max_steps=8, unpack=2)
    assert "FAIL" not in env.executed and score == 0.0
    assert env.executed == ["pyautogui.click(100, 100)"] * 8  # the policy's proposals ran
    assert guarded.guard.events["r3_failed"] == 1 and guarded.guard.events["gave_up"] == 1
    assert [r["step_idx"] for r in guarded.log if r.get("gave_up") == "r3_failed"]
    assert not any(r.get("outcome") == "r3_failed" for r in guarded.log)


def test_osworld_explicit_stop_is_fail_with_the_agents_own_arity(gateway):
    """``on_failure: terminate`` ends the episode with OSWorld's FAIL (what that option costs:
    1.0 on an infeasible task); the stop comes at a step where the agent was not asked again,
    and OpenCUA's loop still gets its three values."""
    backend, client = gateway
    env = FakeDesktopEnv(infeasible=True)
    cfg = GuardConfig(r3=R3Config(on_failure="terminate"))
    guarded = GuardedOSWorldAgent(
        DeadClickAgent(arity=3), client, screen=OSWORLD_SCREEN, config=cfg
    )
    score = run_osworld(guarded, env, max_steps=10, unpack=3)
    assert env.executed[-1] == "FAIL" and score == 1.0
    assert guarded.log[-1]["outcome"] == "r3_failed" and guarded.log[-1]["proposals"] == []


def test_stop_value_before_any_output_follows_the_arity_setting(gateway):
    _, client = gateway
    assert GuardedOSWorldAgent(DeadClickAgent(), client).stop_value() == ("", ["FAIL"])
    opencua = GuardedOSWorldAgent(DeadClickAgent(arity=3), client, arity=3)
    assert opencua.stop_value() == ("", ["FAIL"], {})
    with pytest.raises(ValueError, match="arity"):
        GuardedOSWorldAgent(DeadClickAgent(), client, arity=1)


# ---------------------------------------------------------------------------------------------
# The critic judges what will execute


class OneShotAgent:
    def __init__(self, code: str) -> None:
        self.code = code

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        return ("thinking", [self.code])


BROKEN = "pyautogui.typewrite('it's done')"  # the VM's exec fails on this
CLEAN = 'pyautogui.typewrite("it\'s done")'


def test_repaired_text_is_sent_as_written_and_clean_text_as_tool_calls(gateway):
    _, client = gateway
    sent = []
    for code in (BROKEN, CLEAN):
        guarded = GuardedOSWorldAgent(OneShotAgent(code), client, screen=OSWORLD_SCREEN)
        _, actions = guarded.predict("Type it", {"screenshot": screen(*OSWORLD_SCREEN)})
        assert actions == [code]  # what the VM runs
        sent.append(guarded.log[0]["proposals"][0]["action"])
    assert sent[0] == {"raw": BROKEN, "format": "osworld", "verbatim": True}
    assert sent[1]["format"] == "qwen" and '"text": "it\'s done"' in sent[1]["raw"]


def test_the_critic_prompt_shows_repaired_text_as_written(gateway):
    backend, client = gateway
    guarded = GuardedOSWorldAgent(OneShotAgent(BROKEN), client, screen=OSWORLD_SCREEN)
    guarded.predict("Type it", {"screenshot": screen(*OSWORLD_SCREEN)})
    assert BROKEN in critiques(backend)[0]


@pytest.mark.parametrize(
    "code",
    [
        "pyautogui.press('ctrl+s')",  # pyautogui: one unknown key, nothing is pressed
        "pyautogui.hotkey('ctrl+s')",
        "pyautogui.hotkey(['ctrl', 'a'])",  # pyautogui raises on a list
        "pyautogui.keyDown('shift')",  # the key stays held
    ],
)
def test_a_key_combo_pyautogui_would_not_press_is_judged_as_written(gateway, code):
    backend, client = gateway
    guarded = GuardedOSWorldAgent(OneShotAgent(code), client, screen=OSWORLD_SCREEN)
    _, actions = guarded.predict("Save it", {"screenshot": screen(*OSWORLD_SCREEN)})
    assert actions == [code]
    sent = guarded.log[0]["proposals"][0]["action"]
    assert sent["format"] == "osworld" and sent["raw"] == code
    prompt = critiques(backend)[0]
    assert code in prompt and '"action": "key"' not in prompt.split("Current Proposed Step")[-1]


def test_a_key_combo_pyautogui_presses_is_judged_as_the_combo(gateway):
    backend, client = gateway
    code = "pyautogui.hotkey('ctrl', 's')"
    guarded = GuardedOSWorldAgent(OneShotAgent(code), client, screen=OSWORLD_SCREEN)
    guarded.predict("Save it", {"screenshot": screen(*OSWORLD_SCREEN)})
    sent = guarded.log[0]["proposals"][0]["action"]
    assert sent["format"] == "qwen" and '"keys": ["ctrl", "s"]' in sent["raw"]


# ---------------------------------------------------------------------------------------------
# AndroidWorld: index actions and multi-command steps


@dataclasses.dataclass(frozen=True)
class BoundingBox:
    """android_world's ``BoundingBox`` field order: x_min, x_max, y_min, y_max (pixels)."""

    x_min: float
    x_max: float
    y_min: float
    y_max: float


@dataclasses.dataclass
class UIElement:
    text: str
    bbox_pixels: BoundingBox | None


@dataclasses.dataclass
class JSONAction:
    """android_world's ``JSONAction`` (unset fields None)."""

    action_type: str | None = None
    index: int | None = None
    x: int | None = None
    y: int | None = None
    text: str | None = None
    direction: str | None = None
    goal_status: str | None = None

    def json_str(self) -> str:
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})


DEVICE = (540, 1200)
ELEMENTS = [
    UIElement("Search", BoundingBox(20, 520, 100, 180)),  # centre (270, 140)
    UIElement("Wi-Fi", BoundingBox(40, 500, 400, 480)),  # centre (270, 440)
    UIElement("Bluetooth", BoundingBox(40, 501, 600, 681)),  # centre (270, 640) truncated
    UIElement("Decor", None),
]


class FakeAndroidEnv:
    """``AsyncEnv``: ``get_state`` gives pixels and UI elements; ``execute_action`` actuates
    (index actions tap the element's bbox centre) and returns nothing."""

    def __init__(self) -> None:
        self.executed: list[Any] = []
        self.taps: list[tuple[int, int]] = []

    def get_state(self, wait_to_stabilize: bool = False) -> Any:
        pixels = np.full((DEVICE[1], DEVICE[0], 3), 40, dtype=np.uint8)
        pixels[:, :, 0] = min(40 + 20 * len(self.executed), 255)
        return type("State", (), {"pixels": pixels, "ui_elements": list(ELEMENTS)})()

    def execute_action(self, action: JSONAction) -> None:
        self.executed.append(action)
        if action.index is not None:
            box = ELEMENTS[action.index].bbox_pixels
            self.taps.append((int((box.x_min + box.x_max) / 2), int((box.y_min + box.y_max) / 2)))

    def hide_automation_ui(self) -> None:
        pass


def grid(x: int, y: int) -> str:
    """How the critique prompt writes a device point (0-1000 grid, as ``hivig.actions``)."""
    return f'"coordinate": [{round(x / DEVICE[0] * 1000)}, {round(y / DEVICE[1] * 1000)}]'


class FakeT3A:
    """M3A/T3A's step: read the state, pick an element by index, execute it, then read the
    state again to summarise the result; ``history`` is its memory."""

    def __init__(self, env: FakeAndroidEnv, choose) -> None:
        self.env = env
        self.choose = choose
        self.history: list[dict[str, Any]] = []
        self._transition_pause: float | None = None
        self.seen_after: list[int] = []

    @property
    def transition_pause(self) -> float | None:
        return self._transition_pause

    @transition_pause.setter
    def transition_pause(self, value: float | None) -> None:
        self._transition_pause = value

    def reset(self, go_home: bool = False) -> None:
        self.history = []

    def step(self, goal: str) -> Any:
        self.env.get_state(wait_to_stabilize=False)
        action = self.choose(goal)
        self.env.execute_action(action)
        after = self.env.get_state(wait_to_stabilize=False)  # the summary's "after" screen
        self.seen_after.append(int(after.pixels[0, 0, 0]))
        self.history.append({"action_output_json": action, "summary": f"tapped {action.index}"})
        return type("Result", (), {"done": False, "data": {}})()


@pytest.mark.parametrize(
    ("action", "point"),
    [
        (JSONAction("click", index=1), (270, 440)),
        (JSONAction("long_press", index=2), (270, 640)),
        (JSONAction("input_text", index=0, text="vpn"), (270, 140)),
    ],
)
def test_index_actions_are_judged_at_the_elements_centre(gateway, action, point):
    backend, client = gateway
    env = FakeAndroidEnv()
    agent = FakeT3A(env, lambda goal: action)
    guarded = GuardedAndroidWorldAgent(agent, client)
    guarded.step("Turn on Wi-Fi")
    assert env.executed == [action]  # the agent's own index action ran
    assert agent.seen_after == [60]  # and had run before the agent looked at the result
    assert grid(*point) in critiques(backend)[0]
    # The gateway's marker (drawn on the critic's image) sits on the element.
    marker = guarded.log[0]["proposals"][0]["verdict"]["marker"]
    assert abs(marker["x_px"] - point[0]) <= 1 and abs(marker["y_px"] - point[1]) <= 1


@pytest.mark.parametrize("index", [3, 9])  # an element without a box, an index out of range
def test_unresolvable_index_actions_are_judged_as_raw_text(gateway, index):
    backend, client = gateway
    env = FakeAndroidEnv()
    env.execute_action = lambda a: env.executed.append(a)  # type: ignore[method-assign]
    agent = FakeT3A(env, lambda goal: JSONAction("click", index=index))
    guarded = GuardedAndroidWorldAgent(agent, client)
    guarded.step("t")
    sent = guarded.log[0]["proposals"][0]["action"]
    assert sent == {
        "raw": f'{{"action_type": "click", "index": {index}}}',
        "format": "androidworld",
    }
    assert f'"index": {index}' in critiques(backend)[0]


def test_rejected_index_action_is_reasked_and_the_accepted_one_executed(gateway):
    backend, client = gateway
    backend.bad_if = grid(270, 440)  # Wi-Fi is the wrong element
    env = FakeAndroidEnv()
    agent = FakeT3A(env, lambda goal: JSONAction("click", index=2 if "critic" in goal else 1))
    guarded = GuardedAndroidWorldAgent(agent, client)
    guarded.step("Turn on Bluetooth")
    assert env.executed == [JSONAction("click", index=2)] and env.taps == [(270, 640)]
    assert [h["summary"] for h in agent.history] == ["tapped 2"]  # the rejection rolled back
    assert [p["ruling"] for p in guarded.log[0]["proposals"]] == ["rejected", "accepted"]


class FakeScaleCUAAndroidAgent:
    """ScaleCUA's AndroidWorld agent (``step_agent``): ``turn_number += 1``, read the state,
    append the operation to the ``step_his`` string, then execute every line of ``<action>`` as
    its own ``execute_action`` call, each in a ``try`` that ignores failures."""

    def __init__(self, env: FakeAndroidEnv, respond) -> None:
        self.env = env
        self.respond = respond
        self.history: list[Any] = []
        self.step_his = ""
        self.turn_number = 0
        self.last_action: str | None = None
        self.repeat_time = 0
        self.goals: list[str] = []

    def step(self, instruction: str) -> Any:
        self.turn_number += 1
        self.env.get_state(wait_to_stabilize=False)
        self.goals.append(instruction)
        operation, commands = self.respond(instruction)
        self.step_his += f"Step {self.turn_number}: {operation}\n"
        self.repeat_time = self.repeat_time + 1 if self.last_action == operation else 0
        self.last_action = operation
        for command in commands:
            with contextlib.suppress(Exception):  # upstream logs a failure and carries on
                self.env.execute_action(command)
        return type("Result", (), {"done": False, "data": {"step_history": self.step_his}})()


def test_a_multi_command_step_is_one_proposal(gateway):
    backend, client = gateway
    backend.bad_if = grid(100, 300)  # tapping the wrong field
    env = FakeAndroidEnv()

    def respond(instruction):
        if "critic judged" in instruction:
            return "Type into the search box", [
                JSONAction("click", x=270, y=140),
                JSONAction("input_text", text="vpn"),
            ]
        return "Type into the field", [
            JSONAction("click", x=100, y=300),
            JSONAction("input_text", text="vpn"),
        ]

    agent = FakeScaleCUAAndroidAgent(env, respond)
    guarded = GuardedAndroidWorldAgent(agent, client)
    guarded.step("Search for vpn")
    # One review per run of the agent's step, both commands in it; nothing ran on the reject.
    prompts = critiques(backend)
    assert len(prompts) == 2 and all('"text": "vpn"' in p for p in prompts)
    assert grid(100, 300) in prompts[0] and grid(270, 140) in prompts[1]
    assert env.executed == [JSONAction("click", x=270, y=140), JSONAction("input_text", text="vpn")]
    assert len(agent.goals) == 2 and "critic judged" in agent.goals[1]
    # ScaleCUA's own memory: the rejected run left no trace (a str and an int restored).
    assert agent.step_his == "Step 1: Type into the search box\n" and agent.turn_number == 1
    assert agent.repeat_time == 0 and agent.last_action == "Type into the search box"
    assert guarded.guard.history == [
        '{"action_type": "click", "x": 270, "y": 140}; {"action_type": "input_text", "text": "vpn"}'
    ]


def test_a_rejected_multi_command_step_runs_nothing_and_stops_when_configured(gateway):
    backend, client = gateway
    backend.verdict = "bad"
    env = FakeAndroidEnv()
    commands = [JSONAction("click", x=100, y=300), JSONAction("input_text", text="x")]
    agent = FakeScaleCUAAndroidAgent(env, lambda i: ("Type", commands))
    cfg = GuardConfig(on_exhausted="stop")
    result = GuardedAndroidWorldAgent(agent, client, config=cfg).step("t")
    assert result.done and env.executed == [] and agent.turn_number == 1


def test_attribute_writes_reach_the_wrapped_agent(gateway):
    _, client = gateway
    agent = FakeT3A(FakeAndroidEnv(), lambda goal: JSONAction("wait"))
    guarded = GuardedAndroidWorldAgent(agent, client)
    guarded.transition_pause = 0.5  # run.py sets it on the agent it was handed
    assert agent.transition_pause == 0.5 and "transition_pause" not in vars(guarded)
    guarded.config = GuardConfig(max_reproposals=2)  # the wrapper's own names stay its own
    assert guarded.config.max_reproposals == 2 and not hasattr(agent, "config")
    osworld = GuardedOSWorldAgent(DeadClickAgent(), client)
    osworld.temperature = 0.0
    assert osworld.agent.temperature == 0.0 and osworld.arity == 2


# ---------------------------------------------------------------------------------------------
# AndroidWorld replay: the agent's pauses, actuation errors, execute_first, indexed scrolls

PAUSE = 0.2
"""Seconds the fake agents sleep after a command (short real sleeps)."""


class TimedAndroidEnv(FakeAndroidEnv):
    """``FakeAndroidEnv`` that stamps every call with ``time.monotonic()``; ``open_app`` of an
    app that is not installed raises, as actuation's ``ValueError`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[float, str]] = []

    def get_state(self, wait_to_stabilize: bool = False) -> Any:
        self.calls.append((time.monotonic(), "get_state"))
        return super().get_state(wait_to_stabilize)

    def execute_action(self, action: JSONAction) -> None:
        self.calls.append((time.monotonic(), action.action_type or ""))
        if action.action_type == "open_app":
            raise ValueError("app not installed")
        super().execute_action(action)

    def gap(self, first: str, then: str) -> float:
        """Seconds from the first ``first`` call to the next ``then`` call after it."""
        i = next(k for k, (_, name) in enumerate(self.calls) if name == first)
        j = next(k for k in range(i + 1, len(self.calls)) if self.calls[k][1] == then)
        return self.calls[j][0] - self.calls[i][0]


class SleepingScaleCUAAgent(FakeScaleCUAAndroidAgent):
    """ScaleCUA's ``step_agent``: each command in a ``try`` that logs a failure and carries
    on, then a sleep before the next one."""

    def step(self, instruction: str) -> Any:
        self.turn_number += 1
        self.env.get_state(wait_to_stabilize=False)
        operation, commands = self.respond(instruction)
        self.step_his += f"Step {self.turn_number}: {operation}\n"
        for command in commands:
            try:
                self.env.execute_action(command)
            except Exception:  # noqa: BLE001 - upstream logs it and goes on
                self.history.append("error")
            time.sleep(PAUSE)
        return type("Result", (), {"done": False, "data": {}})()


class FakeM3A:
    """M3A's step: read the state, execute one action in a ``try``, sleep
    ``wait_after_action_seconds``, read the "after" state and summarise into ``history``."""

    def __init__(self, env: FakeAndroidEnv) -> None:
        self.env = env
        self.history: list[dict[str, Any]] = []
        self.wait_after_action_seconds = PAUSE
        self.runs = 0

    def step(self, goal: str) -> Any:
        self.runs += 1
        self.env.get_state(wait_to_stabilize=False)
        action = JSONAction("click", x=100 + self.runs, y=300)
        with contextlib.suppress(Exception):
            self.env.execute_action(action)
        time.sleep(self.wait_after_action_seconds)
        self.env.get_state(wait_to_stabilize=False)
        self.history.append({"action_output_json": action, "summary": f"tapped x={action.x}"})
        return type("Result", (), {"done": False, "data": {"x": action.x}})()


def test_replay_keeps_the_pauses_between_a_steps_commands(gateway):
    _, client = gateway
    env = TimedAndroidEnv()
    commands = [JSONAction("click", x=270, y=140), JSONAction("input_text", text="vpn")]
    agent = SleepingScaleCUAAgent(env, lambda i: ("Type vpn", commands))
    GuardedAndroidWorldAgent(agent, client).step("Search for vpn")
    assert env.executed == commands
    # The type lands a pause after the tap, as unwrapped (not a few microseconds later).
    assert env.gap("click", "input_text") >= PAUSE * 0.9


def test_replay_waits_before_the_agent_reads_the_after_screen(gateway):
    _, client = gateway
    env = TimedAndroidEnv()
    agent = FakeM3A(env)
    GuardedAndroidWorldAgent(agent, client).step("Open settings")
    assert env.executed == [JSONAction("click", x=101, y=300)]
    assert env.gap("click", "get_state") >= PAUSE * 0.9  # wait_after_action_seconds kept


def test_a_failing_command_is_logged_and_the_rest_of_the_step_runs(gateway, caplog):
    _, client = gateway
    env = TimedAndroidEnv()
    commands = [JSONAction("open_app", text="Nope"), JSONAction("navigate_home")]
    agent = SleepingScaleCUAAgent(env, lambda i: ("Open Nope", commands))
    guarded = GuardedAndroidWorldAgent(agent, client)
    with caplog.at_level(logging.WARNING, logger="serve.adapters.androidworld"):
        result = guarded.step("Open Nope")  # the agent's own try would have swallowed it
    assert result.done is False
    assert [name for _, name in env.calls if name != "get_state"] == ["open_app", "navigate_home"]
    assert guarded.guard.events["command_error"] == 1
    assert "app not installed" in caplog.text


def test_execute_first_hands_back_the_executed_runs_memory_and_result(gateway):
    backend, client = gateway
    backend.verdict = "bad"
    env = TimedAndroidEnv()
    agent = FakeM3A(env)
    cfg = GuardConfig(max_reproposals=1, on_exhausted="execute_first")
    result = GuardedAndroidWorldAgent(agent, client, config=cfg).step("Open settings")
    assert agent.runs == 2
    assert env.executed == [JSONAction("click", x=101, y=300)]  # the first proposal ran
    assert [h["summary"] for h in agent.history] == ["tapped x=101"]  # and is remembered
    assert result.data == {"x": 101}


@pytest.mark.parametrize(
    ("index", "start", "end"),
    [
        (1, (270, 440), (270, 400)),  # inside Wi-Fi's box (40, 500, 400, 480), to its top edge
        (0, (270, 600), (270, 0)),  # index 0: the whole screen, as actuation's ``if index:``
    ],
)
def test_scroll_with_an_index_is_judged_as_a_swipe_inside_its_box(gateway, index, start, end):
    backend, client = gateway
    env = FakeAndroidEnv()
    action = JSONAction("scroll", index=index, direction="down")
    guarded = GuardedAndroidWorldAgent(FakeT3A(env, lambda goal: action), client)
    guarded.step("Scroll the list")
    assert env.executed == [action]
    prompt = critiques(backend)[0]
    assert '"swipe"' in prompt and grid(*start) in prompt
    assert grid(*end).replace('"coordinate"', '"coordinate2"') in prompt


# ---------------------------------------------------------------------------------------------
# ScaleCUA's OSWorld agent


class FakeScaleCUAOSWorldAgent:
    """ScaleCUA's OSWorld agent: ``predict`` appends the ``<operation>`` to the
    ``history_instruction`` list and returns ``(response, pyautogui_actions)``."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.history_instruction: list[str] = []

    def reset(self, _logger: Any = None) -> None:
        self.history_instruction = []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        operation, call = self.respond(instruction)
        self.history_instruction.append(operation)
        response = f"<operation>{operation}</operation>\n<action>\n{call}\n</action>"
        return response, [self.to_pyautogui(call)]

    @staticmethod
    def to_pyautogui(call: str) -> str:
        """The agent's own conversion of a ``click`` in 1932x1092 frame pixels (1920x1080)."""
        x, y = (float(v) for v in re.findall(r"=([0-9.]+)", call))
        x, y = f"{x / 1932 * 1920:.4f}", f"{y / 1092 * 1080:.4f}"
        return f'pyautogui.click(x={x}, y={y}, clicks=1, button="left")'


def test_scalecua_history_instruction_keeps_no_rejected_operation(gateway):
    backend, client = gateway
    backend.bad_if = '"coordinate": [100, 100]'

    def respond(instruction):
        if "critic judged" in instruction:
            return "Click Save", "click(x=966, y=546)"
        return "Click the corner", "click(x=193, y=109)"

    agent = FakeScaleCUAOSWorldAgent(respond)
    guarded = GuardedScaleCUAAgent(agent, client, screen=(1920, 1080))
    guarded.predict("Save", {"screenshot": screen(320, 180)})
    assert agent.history_instruction == ["Click Save"]
    assert '"coordinate": [500, 500]' in critiques(backend)[1]


def test_scalecua_fractions_under_pixels_are_loud_not_a_corner_click(gateway, caplog):
    _, client = gateway
    agent = FakeScaleCUAOSWorldAgent(lambda i: ("Click OK", "click(x=0.42, y=0.31)"))
    # The agent's returned code clicks where its conversion put the point (the corner), and
    # that is what runs and is judged; the block alone is judged as written.
    guarded = GuardedScaleCUAAgent(agent, client, screen=(1920, 1080))
    with caplog.at_level(logging.WARNING, logger="serve.adapters.osworld"):
        guarded.predict("t", {"screenshot": screen(320, 180)})
    assert any("coord_space='norm01'" in r.getMessage() for r in caplog.records)
    sent = guarded.log[0]["proposals"][0]["action"]
    assert sent["raw"] == 'pyautogui.click(x=0.4174, y=0.3066, clicks=1, button="left")'
    assert guarded.guard.events["coords_look_norm01"] == 1
    caplog.clear()
    guarded = GuardedScaleCUAAgent(agent, client, screen=(1920, 1080), judge="block")
    with caplog.at_level(logging.WARNING, logger="serve.adapters.osworld"):
        for k in range(2):
            guarded.predict("t", {"screenshot": screen(320, 180, seed=k)})
    warnings = [r for r in caplog.records if "coord_space='norm01'" in r.getMessage()]
    assert len(warnings) == 1 and guarded.guard.events["coords_look_norm01"] == 2
    sent = guarded.log[0]["proposals"][0]["action"]
    assert sent["verbatim"] is True and sent["raw"] == "\nclick(x=0.42, y=0.31)\n"
    # Named explicitly, the same output is read as fractions: no warning, a real point.
    guarded = GuardedScaleCUAAgent(
        agent, client, screen=(1920, 1080), coord_space="norm01", judge="block"
    )
    guarded.predict("t", {"screenshot": screen(320, 180)})
    assert '"coordinate": [420, 310]' in guarded.log[0]["proposals"][0]["action"]["raw"]


def test_scalecua_fractions_get_no_marker_at_the_corner(gateway):
    backend, client = gateway
    agent = FakeScaleCUAOSWorldAgent(lambda i: ("Click OK", "click(x=0.42, y=0.31)"))
    guarded = GuardedScaleCUAAgent(agent, client, screen=(1920, 1080), judge="block")
    guarded.predict("t", {"screenshot": screen(320, 180)})
    assert guarded.log[0]["proposals"][0]["verdict"]["marker"] is None
    assert "click(x=0.42, y=0.31)" in critiques(backend)[0]  # judged as the agent wrote it


# ---------------------------------------------------------------------------------------------
# Qwen3-VL policy messages


@pytest.mark.parametrize(("space", "side"), [("norm999", 999), ("norm1000", 1000)])
def test_qwen_messages_state_the_sessions_grid_and_the_call_format(space, side):
    ctx = PolicyContext(task="Open settings", step_idx=0, screenshot=None)
    system = qwen_messages(ctx, "android", coord_space=space)[0]["content"][0]["text"]
    assert f"The screen is {side}x{side}" in system
    other = 1999 - side
    assert f"{other}x{other}" not in system
    assert f'"maximum": {side}' in system and f'"maximum": {other}' not in system
    # The call format follows the tool definitions, as in Qwen's own prompts.
    assert system.index("</tools>") < system.index(TOOL_CALL_FORMAT)
    assert re.search(r"<tool_call>\n\{\"name\": <function-name>, \"arguments\": ", system)


def test_qwen_messages_refuse_a_pixel_space():
    ctx = PolicyContext(task="t", step_idx=0, screenshot=None)
    with pytest.raises(ValueError, match="norm1000"):
        qwen_messages(ctx, "ubuntu", coord_space="screen_px")


def test_r3_restore_splices_strings_and_counters_like_lists():
    """R3 Restore in ScaleCUA's AndroidWorld agent: the memory from before the loop plus what
    the accepted fresh-context step added (its ``step_his`` line, one ``turn_number``)."""
    from serve.adapters._common import AgentMemory

    agent = FakeScaleCUAAndroidAgent(FakeAndroidEnv(), None)
    memory = AgentMemory(agent)
    agent.step_his, agent.turn_number = "Step 1: a\n", 1
    base = memory.take()
    agent.step_his, agent.turn_number = "", 0  # R3 reset: an empty memory
    start = memory.take()
    agent.step_his, agent.turn_number = "Step 1: menu\n", 1  # the accepted reroute step
    memory.splice(base, start)
    assert (agent.step_his, agent.turn_number) == ("Step 1: a\nStep 1: menu\n", 2)
