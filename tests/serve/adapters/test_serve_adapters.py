"""Runner adapters on real-looking agent outputs (OSWorld, ScaleCUA, AndroidWorld, Qwen3-VL),
malformed ones included, against the in-process fake gateway."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import numpy as np
import pytest

from serve.adapters import (
    GuardedAndroidWorldAgent,
    GuardedOSWorldAgent,
    GuardedQwenPolicy,
    GuardedScaleCUAAgent,
    action_dict,
    action_payload,
    png_size,
    qwen_intent,
    qwen_messages,
    rgb_png,
)
from serve.guard import GuardConfig, PolicyContext
from tests.serve.client.test_serve_client import FakeGateway, make_client, png

TOOL = '<tool_call>\n{{"name": "computer_use", "arguments": {args}}}\n</tool_call>'


def tool_call(**args: Any) -> str:
    return TOOL.format(args=json.dumps(args))


def critiqued(gw: FakeGateway) -> list[dict[str, Any]]:
    return [b["action"] for b in gw.bodies("/critique")]


def judge_raw(bad: set[str]):
    def judge(action):
        if any(b in action["raw"] for b in bad):
            return {"verdict": "bad", "error_dimension": "Wrong Target", "explanation": "No."}
        return {"verdict": "good", "confidence": 0.9}

    return judge


# ---------------------------------------------------------------------------------------------
# OSWorld


class FakeOSWorldAgent:
    """Keeps its memory in lists like OSWorld's PromptAgent; answers from a script."""

    action_space = "pyautogui"

    def __init__(self, script) -> None:
        self.script = script
        self.thoughts: list[str] = []
        self.actions: list[Any] = []
        self.instructions: list[str] = []
        self.resets = 0

    def reset(self, _logger=None) -> None:
        self.resets += 1
        self.thoughts, self.actions = [], []

    def predict(self, instruction: str, obs: dict[str, Any]):
        self.instructions.append(instruction)
        out = self.script(instruction, obs, self)
        self.thoughts.append(out[0])
        self.actions.append(out[1])
        return out


OSWORLD_RESPONSE = (
    "I need to click the Save button.\n```python\nimport pyautogui\nimport time\n"
    '"""\nThought: the Save button is at the top left.\n"""\n'
    "pyautogui.click(96, 54)  # Save\ntime.sleep(0.5)\n```"
)
OSWORLD_CODE = (
    "import pyautogui\nimport time\n"
    '"""\nThought: the Save button is at the top left.\n"""\n'
    "pyautogui.click(96, 54)  # Save\ntime.sleep(0.5)"
)


def obs_of(tag: str) -> dict[str, Any]:
    return {"screenshot": png(tag), "accessibility_tree": None, "terminal": None}


def test_osworld_real_code_is_critiqued_as_canonical_tool_calls():
    gw = FakeGateway()
    agent = FakeOSWorldAgent(lambda i, o, a: (OSWORLD_RESPONSE, [OSWORLD_CODE]))
    guarded = GuardedOSWorldAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.reset()
    response, actions = guarded.predict("Save the file", obs_of("A"))
    assert (response, actions) == (OSWORLD_RESPONSE, [OSWORLD_CODE])  # the agent's own output
    sent = critiqued(gw)[0]
    assert sent["format"] == "qwen" and sent["coord_space"] == "norm1000"
    calls = [json.loads(b) for b in sent["raw"].split("\n") if b.startswith("{")]
    assert calls == [
        {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [50, 50]}},
        {"name": "computer_use", "arguments": {"action": "wait", "time": 0.5}},
    ]
    assert gw.creates()[0]["action_format"] == "osworld"
    assert guarded.action_space == "pyautogui"  # attributes pass through to the agent
    assert agent.resets == 1


@pytest.mark.parametrize(
    "code",
    [
        "pyautogui.click(x=",  # cut off mid-call
        "computer.click(100, 200)",  # another agent's API
        "pyautogui.locateOnScreen('ok.png')",  # unsupported call
        "I will now click the OK button.",  # prose
    ],
)
def test_osworld_unparseable_code_is_sent_raw_never_dropped(code):
    gw = FakeGateway()
    agent = FakeOSWorldAgent(lambda i, o, a: ("thinking", [code]))
    guarded = GuardedOSWorldAgent(agent, make_client(gw), screen=(1920, 1080))
    _, actions = guarded.predict("Do it", obs_of("A"))
    assert actions == [code]
    assert critiqued(gw) == [{"raw": code, "format": "osworld"}]


def test_osworld_special_strings_and_several_actions():
    gw = FakeGateway()
    outputs = iter([("wait", ["WAIT"]), ("go", ["pyautogui.press('enter')", "DONE"])])
    agent = FakeOSWorldAgent(lambda i, o, a: next(outputs))
    guarded = GuardedOSWorldAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.predict("t", obs_of("A"))
    guarded.predict("t", obs_of("B"))
    raws = [a["raw"] for a in critiqued(gw)]
    assert '"action": "wait", "time": 3' in raws[0]
    assert '"keys": ["enter"]' in raws[1] and '"status": "success"' in raws[1]
    # The executed step went back as the next observe's prev_action.
    assert gw.bodies("/observe")[1]["prev_action"]["raw"] == raws[0]


def test_osworld_rejection_feeds_back_and_leaves_no_trace_in_the_agent():
    gw = FakeGateway()
    gw.judge = judge_raw({"[50, 50]"})

    def script(instruction, obs, agent):
        if "critic judged" in instruction:
            return ("retry", ["pyautogui.click(960, 540)"])
        return ("first", ["pyautogui.click(96, 54)"])

    agent = FakeOSWorldAgent(script)
    guarded = GuardedOSWorldAgent(agent, make_client(gw), screen=(1920, 1080))
    response, actions = guarded.predict("Open it", obs_of("A"))
    assert actions == ["pyautogui.click(960, 540)"]
    assert "Wrong Target" in agent.instructions[1] and agent.instructions[1].startswith("Open it")
    # The feedback quotes the agent's own action, not the critic's tool-call rendering.
    assert "proposed action pyautogui.click(96, 54) as" in agent.instructions[1]
    assert guarded.guard.history == ["pyautogui.click(960, 540)"]
    assert agent.thoughts == ["retry"]  # the rejected proposal was rolled back
    assert [p["ruling"] for p in guarded.log[0]["proposals"]] == ["rejected", "accepted"]


def test_osworld_feedback_hook_instead_of_the_instruction():
    gw = FakeGateway()
    gw.judge = judge_raw({"[50, 50]"})
    turns: list[str] = []

    def script(instruction, obs, agent):
        assert instruction == "Open it"  # untouched: the hook carries the feedback
        return ("r", ["pyautogui.click(960, 540)" if turns else "pyautogui.click(96, 54)"])

    agent = FakeOSWorldAgent(script)
    guarded = GuardedOSWorldAgent(
        agent,
        make_client(gw),
        screen=(1920, 1080),
        feedback_hook=lambda a, text: turns.append(text),
        config=GuardConfig(inject_history=False),
    )
    _, actions = guarded.predict("Open it", obs_of("A"))
    assert actions == ["pyautogui.click(960, 540)"]
    assert len(turns) == 1 and "Wrong Target" in turns[0]


def test_osworld_execute_first_restores_that_proposals_memory():
    gw = FakeGateway()
    gw.judge = judge_raw({"left_click"})
    outputs = iter([("one", ["pyautogui.click(1, 1)"]), ("two", ["pyautogui.click(2, 2)"])])
    agent = FakeOSWorldAgent(lambda i, o, a: next(outputs))
    guarded = GuardedOSWorldAgent(
        agent,
        make_client(gw),
        screen=(1920, 1080),
        config=GuardConfig(on_exhausted="execute_first"),
    )
    _, actions = guarded.predict("t", obs_of("A"))
    assert actions == ["pyautogui.click(1, 1)"] and agent.thoughts == ["one"]


def test_osworld_stop_returns_fail_and_three_tuples_pass_through():
    gw = FakeGateway()
    gw.judge = judge_raw({"left_click"})
    agent = FakeOSWorldAgent(lambda i, o, a: ("r", ["pyautogui.click(1, 1)"], {"usage": 7}))
    guarded = GuardedOSWorldAgent(
        agent, make_client(gw), screen=(1920, 1080), config=GuardConfig(on_exhausted="stop")
    )
    # The stop keeps the agent's shape but nothing of the rejected proposals.
    assert guarded.predict("t", obs_of("A")) == ("", ["FAIL"], {})
    gw.judge = judge_raw(set())
    assert guarded.predict("t", obs_of("B")) == ("r", ["pyautogui.click(1, 1)"], {"usage": 7})


def test_osworld_screen_size_is_read_from_the_screenshot():
    gw = FakeGateway()
    shot = rgb_png(np.zeros((720, 1280, 3), dtype=np.uint8))
    agent = FakeOSWorldAgent(lambda i, o, a: ("r", ["pyautogui.click(640, 360)"]))
    guarded = GuardedOSWorldAgent(agent, make_client(gw))
    guarded.predict("t", {"screenshot": shot})
    assert gw.creates()[0]["screen"] == {"w": 1280, "h": 720}
    assert '"coordinate": [500, 500]' in critiqued(gw)[0]["raw"]


def test_osworld_critic_down_never_blocks_the_harness_loop():
    gw = FakeGateway()
    gw.faults = [("/", "connect")] * 1000
    agent = FakeOSWorldAgent(lambda i, o, a: ("r", ["pyautogui.click(1, 1)"]))
    guarded = GuardedOSWorldAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.reset()
    for step in range(3):  # lib_run_single-style loop
        response, actions = guarded.predict("t", obs_of(str(step)))
        assert actions == ["pyautogui.click(1, 1)"]
    assert len(agent.thoughts) == 3


def test_osworld_r3_restore_splices_the_agents_own_memory():
    gw = FakeGateway(r3_k=2)
    screens = {"A": {"go": "B"}, "B": {"menu": "C"}, "C": {}}
    state = {"screen": "A"}

    def script(instruction, obs, agent):
        if not agent.thoughts:
            # An empty memory: the first step, or an R3 reset (then try the menu).
            return ("fresh", ["go"]) if state["screen"] == "A" else ("fresh", ["menu"])
        return ("loop", ["dead"])

    agent = FakeOSWorldAgent(script)
    # Raw strings that do not parse stay raw, so actions are compared by their text.
    guarded = GuardedOSWorldAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.reset()
    for _ in range(5):
        _, actions = guarded.predict("t", {"screenshot": png(state["screen"])})
        state["screen"] = screens[state["screen"]].get(actions[0], state["screen"])
    # go, dead, dead, (R3) menu -> C, then the restored agent carries on.
    assert [a[0] for a in agent.actions][:2] == ["go", "menu"]
    assert agent.thoughts[:2] == ["fresh", "fresh"]
    assert "loop" not in agent.thoughts[:2]
    assert guarded.guard.r3_events[0]["event"] == "restored"


# ---------------------------------------------------------------------------------------------
# ScaleCUA


SCALECUA_RESPONSE = (
    "<think>The file must be saved.</think>\n<operation>Press Ctrl+S to save</operation>\n"
    '<action>\npyautogui.click(x=500, y=250)\nkey("ctrl+s")\n</action>'
)


SCALECUA_CLEAN = (
    "<think>The file must be saved.</think>\n<operation>Press Ctrl+S to save</operation>\n"
    "<action>\nclick(x=500, y=250)\nhotkey(keys=['ctrl', 's'])\n</action>"
)


def test_scalecua_calls_with_intent_and_repaired_ones_judged_as_written():
    gw = FakeGateway()
    outputs = iter([SCALECUA_CLEAN, SCALECUA_RESPONSE])
    agent = FakeOSWorldAgent(lambda i, o, a: (next(outputs), ["pyautogui.hotkey('ctrl','s')"]))
    guarded = GuardedScaleCUAAgent(
        agent,
        make_client(gw),
        screen=(1920, 1080),
        coord_space="resized_px",
        frame=(1000, 500),
        judge="block",
    )
    guarded.predict("Save", obs_of("A"))
    guarded.predict("Save", obs_of("B"))
    clean, repaired = critiqued(gw)
    assert clean["intent"] == "Press Ctrl+S to save"
    assert '"coordinate": [500, 500]' in clean["raw"] and '"keys": ["ctrl", "s"]' in clean["raw"]
    assert gw.creates()[0]["frame"] == {"w": 1000, "h": 500}
    # ``pyautogui.click(...)`` and ``key("ctrl+s")`` read only after a repair that ScaleCUA's
    # own executor does not make (it matches bare ``name(...)`` calls): judged as written.
    assert repaired == {
        "raw": '\npyautogui.click(x=500, y=250)\nkey("ctrl+s")\n',
        "format": "scalecua",
        "verbatim": True,
        "intent": "Press Ctrl+S to save",
    }


def test_scalecua_mobile_calls_on_android():
    gw = FakeGateway()
    text = "<action>\nswipe(from_coord=[0.5, 0.9], to_coord=[0.5, 0.1])\n</action>"
    agent = FakeOSWorldAgent(lambda i, o, a: (text, []))
    guarded = GuardedScaleCUAAgent(
        agent, make_client(gw), platform="android", screen=(1080, 2400), coord_space="norm01"
    )
    guarded.predict("Scroll", obs_of("A"))
    raw = critiqued(gw)[0]["raw"]
    assert '"name": "mobile_use"' in raw and '"coordinate2": [500, 100]' in raw


def test_scalecua_default_reads_resized_pixels_the_same_way_every_step():
    gw = FakeGateway()
    outputs = iter(
        [
            "<action>\nclick(x=966, y=546)\n</action>",
            "<action>\nclick(x=1200, y=546)\n</action>",
        ]
    )
    agent = FakeOSWorldAgent(lambda i, o, a: (next(outputs), []))
    guarded = GuardedScaleCUAAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.predict("t", obs_of("A"))
    guarded.predict("t", obs_of("B"))
    # 1920x1080 is shown to the agent as 1932x1092 (smart_resize, factor 28): both points are
    # pixels of that frame, never one read as the 0-1000 grid and the other as pixels.
    raws = [a["raw"] for a in critiqued(gw)]
    assert '"coordinate": [500, 500]' in raws[0] and '"coordinate": [621, 500]' in raws[1]
    assert gw.creates()[0]["coord_space"] == "resized_px"
    assert gw.creates()[0]["frame"] == {"w": 1932, "h": 1092}


def test_scalecua_explicit_space_is_kept():
    gw = FakeGateway()
    agent = FakeOSWorldAgent(lambda i, o, a: ("<action>\nclick(x=0.25, y=0.5)\n</action>", []))
    guarded = GuardedScaleCUAAgent(
        agent, make_client(gw), screen=(1920, 1080), coord_space="norm01"
    )
    guarded.predict("t", obs_of("A"))
    assert '"coordinate": [250, 500]' in critiqued(gw)[0]["raw"]
    assert "frame" not in gw.creates()[0]


def test_osworld_and_scalecua_adapters_send_one_wheel_scroll_magnitude():
    gw = FakeGateway()
    osworld = FakeOSWorldAgent(lambda i, o, a: ("", ["pyautogui.scroll(-5)"]))
    scalecua = FakeOSWorldAgent(lambda i, o, a: ("<action>\nscroll(clicks=-5)\n</action>", []))
    GuardedOSWorldAgent(osworld, make_client(gw), screen=(1920, 1080)).predict("t", obs_of("A"))
    GuardedScaleCUAAgent(scalecua, make_client(gw), screen=(1920, 1080)).predict("t", obs_of("A"))
    raws = [a["raw"] for a in critiqued(gw)]
    assert raws[0] == raws[1] and '"pixels": -500' in raws[0]


def test_scalecua_prose_inside_press_is_sent_raw():
    gw = FakeGateway()
    block = 'press(keys="click on the submit button")'
    agent = FakeOSWorldAgent(lambda i, o, a: (f"<action>\n{block}\n</action>", []))
    guarded = GuardedScaleCUAAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.predict("t", obs_of("A"))
    assert critiqued(gw)[0] == {"raw": f"\n{block}\n", "format": "scalecua"}


# ---------------------------------------------------------------------------------------------
# AndroidWorld


@dataclasses.dataclass
class JSONAction:
    """The shape of AndroidWorld's JSONAction (every field serialised, unset ones None)."""

    action_type: str | None = None
    x: int | None = None
    y: int | None = None
    text: str | None = None
    index: int | None = None
    goal_status: str | None = None

    def json_str(self) -> str:
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})


@dataclasses.dataclass
class Result:
    done: bool
    data: dict[str, Any]


class FakeEnv:
    def __init__(self) -> None:
        self.executed: list[JSONAction] = []

    def get_state(self, wait_to_stabilize: bool = False):
        pixels = np.full((240, 108, 3), 30 + 10 * len(self.executed), dtype=np.uint8)
        return type("State", (), {"pixels": pixels})()

    def execute_action(self, action: JSONAction) -> None:
        self.executed.append(action)

    logical_screen_size = (108, 240)


class FakeM3A:
    """Chooses an action, executes it through ``self.env`` inside ``step``, keeps ``history``."""

    def __init__(self, env: FakeEnv, choose) -> None:
        self.env = env
        self.choose = choose
        self.history: list[str] = []
        self.goals: list[str] = []

    def reset(self, go_home: bool = False) -> None:
        self.history = []

    def step(self, goal: str) -> Result:
        self.goals.append(goal)
        action = self.choose(goal, self)
        self.history.append(f"did {action.action_type}")
        if action.action_type == "status":
            return Result(True, {"status": action.goal_status})
        self.env.execute_action(action)
        return Result(False, {})


def test_androidworld_accepted_action_is_executed():
    gw = FakeGateway()
    env = FakeEnv()
    agent = FakeM3A(env, lambda g, a: JSONAction("click", x=54, y=120))
    guarded = GuardedAndroidWorldAgent(agent, make_client(gw))
    result = guarded.step("Open the clock")
    assert result == Result(False, {}) and env.executed == [JSONAction("click", x=54, y=120)]
    sent = critiqued(gw)[0]
    assert '"name": "mobile_use"' in sent["raw"] and '"coordinate": [500, 500]' in sent["raw"]
    assert gw.creates()[0]["screen"] == {"w": 108, "h": 240}  # from the screenshot
    assert agent.env is env  # the proxy is gone after the step


def test_androidworld_rejected_action_is_not_executed_and_the_agent_retries():
    gw = FakeGateway()
    gw.judge = judge_raw({"[102, 100]"})
    env = FakeEnv()

    def choose(goal, agent):
        if "critic judged" in goal:
            return JSONAction("click", x=54, y=120)
        return JSONAction("click", x=11, y=24)

    agent = FakeM3A(env, choose)
    guarded = GuardedAndroidWorldAgent(agent, make_client(gw))
    guarded.step("Open the clock")
    assert env.executed == [JSONAction("click", x=54, y=120)]
    assert agent.history == ["did click"]  # the rejected step was rolled back
    assert len(agent.goals) == 2


def test_androidworld_stop_marks_the_result_done():
    gw = FakeGateway()
    gw.judge = judge_raw({"mobile_use"})
    env = FakeEnv()
    agent = FakeM3A(env, lambda g, a: JSONAction("click", x=1, y=1))
    guarded = GuardedAndroidWorldAgent(
        agent, make_client(gw), config=GuardConfig(on_exhausted="stop")
    )
    result = guarded.step("t")
    assert result.done and env.executed == []


def test_androidworld_index_actions_are_sent_raw_and_status_needs_no_critique():
    gw = FakeGateway()
    env = FakeEnv()
    actions = iter([JSONAction("click", index=4), JSONAction("status", goal_status="complete")])
    agent = FakeM3A(env, lambda g, a: next(actions))
    guarded = GuardedAndroidWorldAgent(agent, make_client(gw))
    guarded.step("t")
    assert critiqued(gw) == [
        {"raw": '{"action_type": "click", "index": 4}', "format": "androidworld"}
    ]
    assert guarded.step("t").done
    assert len(critiqued(gw)) == 1  # the status report executes nothing on the device


def test_rgb_png_is_a_valid_png():
    from PIL import Image

    pixels = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    data = rgb_png(pixels)
    assert png_size(data) == (5, 4)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), pixels)
    assert png_size(b"GIF89a....................") is None


def test_action_dict_accepts_the_shapes_agents_use():
    assert action_dict(JSONAction("click", x=1, y=2)) == {"action_type": "click", "x": 1, "y": 2}
    assert action_dict({"action_type": "wait"}) == {"action_type": "wait"}
    assert action_dict('{"action_type": "wait"}') == '{"action_type": "wait"}'


# ---------------------------------------------------------------------------------------------
# Qwen3-VL


@pytest.mark.parametrize(
    "response",
    [
        "Thought: the field is on the left.\nAction: click the name field\n"
        + tool_call(action="left_click", coordinate=[250, 400]),
        '<tool_call>\n{{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [250, 400]}}\n</tool_call>',
        'Thought: x\n<tool_call>\n</tool_call>\n{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [250, 400]}}',
    ],
)
def test_qwen_slips_are_repaired(response):
    gw = FakeGateway()
    policy = GuardedQwenPolicy(
        lambda ctx: response, make_client(gw), task="t", platform="ubuntu", screen=(1920, 1080)
    )
    d = policy.step(png("A"))
    assert d.proposal == response
    sent = critiqued(gw)[0]
    # The caller executes ``policy.actions(d)``, the repaired reading: that is what is judged.
    assert sent["format"] == "qwen" and sent["coord_space"] == "norm1000"
    assert "verbatim" not in sent and sent["raw"].startswith("<tool_call>\n{")
    assert '"coordinate": [250, 400]' in sent["raw"]
    assert policy.actions(d)[0].coordinate == (250, 400)


def test_qwen_unparseable_is_sent_raw_and_intent_is_read():
    gw = FakeGateway()
    text = "Action: click the blue button\n<tool_call>\n{not json}\n</tool_call>"
    policy = GuardedQwenPolicy(
        lambda ctx: text, make_client(gw), task="t", platform="ubuntu", screen=(1920, 1080)
    )
    policy.step(png("A"))
    assert critiqued(gw)[0] == {"raw": text, "format": "qwen", "intent": "click the blue button"}
    assert qwen_intent(tool_call(action="wait", time=1)) is None


def test_qwen_pixel_prompted_policy_in_screen_px():
    payload = action_payload(
        tool_call(action="left_click", coordinate=[1440, 540]),
        "qwen",
        platform="ubuntu",
        screen=(1920, 1080),
        coord_space="screen_px",
    )
    assert '"coordinate": [750, 500]' in payload["raw"]


def test_qwen_messages_carry_tools_screen_history_and_feedback():
    ctx = PolicyContext(
        task="Open the menu",
        step_idx=2,
        screenshot=png("A"),
        history_text="Progress so far: opened the app",
        history=("click app",),
        feedback=("A critic judged your proposed action x as Wrong Target: no.",),
    )
    system, user = qwen_messages(ctx, "android")
    assert '"name": "mobile_use"' in system["content"][0]["text"]
    assert user["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    text = user["content"][1]["text"]
    assert "Step 1: click app" in text and "Progress so far" in text and "Wrong Target" in text
    fresh = dataclasses.replace(ctx, history=(), history_text="", feedback=(), mode="reroute")
    assert qwen_messages(fresh, "ubuntu")[1]["content"][1]["text"] == "Open the menu"


# ---------------------------------------------------------------------------------------------
# R3 failure with on_failure: continue (scripted critic)


class ScriptedSession:
    """A session whose observe fires R3 at ``trigger`` and whose critiques follow a script."""

    def __init__(self, verdicts: list[str], trigger: int = 2) -> None:
        self.verdicts = verdicts
        self.trigger = trigger
        self.critiqued: list[Any] = []

    def observe(self, i, png_, prev):
        from serve.client import History, Observation

        rec = {"r3_trigger": True, "same_key_no_effect_run": 2} if i == self.trigger else {}
        return Observation(
            i, "ok", None, History(), f"sha256:{i}", change={"no_effect": i > 0}, recurrence=rec
        )

    def critique(self, i, action=None, candidates=None):
        from serve.client import Verdict

        self.critiqued.append(action)
        v = self.verdicts.pop(0)
        return Verdict(v, explanation="no" if v == "bad" else "")

    def reseed(self, echo):
        return False

    def close(self):
        return True


class ScriptedClient:
    def __init__(self, session: ScriptedSession) -> None:
        self.session = session

    def start(self, *a, **k):
        return self.session


def test_osworld_failed_reroute_continue_keeps_the_agents_memory_equal_to_the_history():
    from serve.guard import R3Config

    count = [0]

    def script(instruction, obs, agent):
        count[0] += 1
        return ("resp", [f"pyautogui.click({count[0]}, {count[0]})"])

    agent = FakeOSWorldAgent(script)
    session = ScriptedSession(["good", "good", "bad", "bad", "good", "good"])
    cfg = GuardConfig(max_reproposals=1, r3=R3Config(reroute_attempts=2, on_failure="continue"))
    guarded = GuardedOSWorldAgent(agent, ScriptedClient(session), config=cfg)
    for step in range(4):
        guarded.predict("t", {"screenshot": png(f"s{step}")})
        # The agent's own memory holds exactly the steps the guard's history holds.
        assert ["\n".join(a) for a in agent.actions] == guarded.guard.history
    assert guarded.guard.events["r3_failed"] == 1
    assert guarded.guard.history == ["pyautogui.click(5, 5)", "pyautogui.click(6, 6)"]


class CountingM3A(FakeM3A):
    """Clicks at a new x each call; its history names the click."""

    def __init__(self, env: FakeEnv) -> None:
        super().__init__(env, None)
        self.calls = 0

    def step(self, goal: str) -> Result:
        self.goals.append(goal)
        self.calls += 1
        action = JSONAction("click", x=self.calls, y=1)
        self.history.append(f"did {self.calls}")
        self.env.execute_action(action)
        return Result(False, {})


def test_androidworld_failed_reroute_continue_memory_and_the_proposal_bound():
    from serve.guard import R3Config

    env = FakeEnv()
    agent = CountingM3A(env)
    # Steps 0, 1 accepted; step 2: three bad reroutes (N=3), then K + 1 = 3 normal proposals.
    script = ["good", "good", "bad", "bad", "bad", "bad", "bad", "good"]
    session = ScriptedSession(script)
    r3 = R3Config(reroute_attempts=3, on_failure="continue")
    cfg = GuardConfig(max_reproposals=2, escalate_after=10, r3=r3)
    guarded = GuardedAndroidWorldAgent(agent, ScriptedClient(session), config=cfg)
    for _ in range(3):
        guarded.step("t")
    assert agent.calls == 8 and [a.x for a in env.executed] == [1, 2, 8]
    assert guarded.guard.events["r3_failed"] == 1
    assert agent.history == ["did 8"]  # the loop gone, the step executed after it kept
    assert len(guarded.guard.history) == 1


class StatusM3A(FakeM3A):
    """Like M3A: a status report returns without execute_action, its step data (history entry
    and result data) holding ``action_output_json``."""

    def step(self, goal: str) -> Result:
        self.goals.append(goal)
        action = self.choose(goal, self)
        data = {"action_output_json": action, "summary": f"did {action.action_type}"}
        self.history.append(data)
        if action.action_type == "status":
            return Result(True, data)
        self.env.execute_action(action)
        return Result(False, data)


@pytest.mark.parametrize(
    ("goal_status", "status"), [("complete", "success"), ("infeasible", "failure")]
)
def test_androidworld_status_report_is_critiqued_as_terminate(goal_status, status):
    gw = FakeGateway()
    env = FakeEnv()
    agent = StatusM3A(env, lambda g, a: JSONAction("status", goal_status=goal_status))
    guarded = GuardedAndroidWorldAgent(agent, make_client(gw))
    result = guarded.step("t")
    assert result.done and env.executed == []
    raw = critiqued(gw)[0]["raw"]
    assert '"action": "terminate"' in raw and f'"status": "{status}"' in raw
    assert guarded.log[0]["outcome"] == "accepted"


def test_androidworld_rejected_status_report_is_rolled_back_and_the_step_rerun():
    gw = FakeGateway()
    gw.judge = judge_raw({"terminate"})
    env = FakeEnv()

    def choose(goal, agent):
        if "critic judged" in goal:
            return JSONAction("click", x=54, y=120)
        return JSONAction("status", goal_status="complete")

    agent = StatusM3A(env, choose)
    guarded = GuardedAndroidWorldAgent(agent, make_client(gw))
    result = guarded.step("Open the clock")
    assert not result.done and env.executed == [JSONAction("click", x=54, y=120)]
    assert [h["summary"] for h in agent.history] == ["did click"]  # the status rolled back
    assert len(critiqued(gw)) == 2 and len(agent.goals) == 2


def test_scalecua_returned_code_is_what_is_judged():
    # ScaleCUA's OSWorld agent returns the pyautogui code it converted from its block (screen
    # pixels), and the VM runs that code; on its own parse error it returns ``DONE``.
    gw = FakeGateway()
    outputs = iter(
        [
            ("<action>\nclick(x=966, y=546)\n</action>", ["pyautogui.click(x=960.0, y=540.0)"]),
            ("<action>\nclick(x=\n</action>", ["DONE"]),
        ]
    )
    agent = FakeOSWorldAgent(lambda i, o, a: next(outputs))
    guarded = GuardedScaleCUAAgent(agent, make_client(gw), screen=(1920, 1080))
    guarded.predict("t", obs_of("A"))
    guarded.predict("t", obs_of("B"))
    clicked, done = critiqued(gw)
    assert '"coordinate": [500, 500]' in clicked["raw"]
    assert '"action": "terminate", "status": "success"' in done["raw"]
    with pytest.raises(ValueError, match="judge"):
        GuardedScaleCUAAgent(agent, make_client(gw), judge="both")
