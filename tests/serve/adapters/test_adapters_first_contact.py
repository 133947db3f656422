"""Runner adapters inside loops shaped like the upstream harnesses, second round.

Each fake follows the upstream loop it stands for, with that harness' own executor rules, and
runs through ``serve.adapters`` against a real gateway on 127.0.0.1 with a scripted critic:

* AndroidLab (``PixellevelTask.run_step``): the response's sections are read as the harness
  reads them (the last ``<action>`` wins), mapped to a ``do(...)`` command by whole-text call
  patterns and run with ``exec`` by a pixel-level executor that raises on what the real one
  cannot run. The critic must see that text as text (no tool call, no marker), and text the
  executor does run as the call it is.
* ``QwenAgent`` overwrites the first text part of the user message with the system prompt
  before sending: the critic's feedback must still reach the model.
* History injection (the gateway's progress summary in every prompt) is a per-adapter
  setting: off, the agent's prompt is the harness' own while every verdict is Good; on, the
  summary is added.
* A stop leaves nothing of the rejected proposals in the agent's memory or in the value the
  harness records (OSWorld, WindowsAgentArena), as WebArenaLiteV2's adapter already did.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serve.adapters import (
    GuardedAndroidLabAgent,
    GuardedOSWorldAgent,
    GuardedWAAAgent,
    GuardedWebArenaLiteAgent,
    runs_on_androidlab,
)
from serve.app import create_app
from serve.client import CriticClient
from serve.guard import GuardConfig
from tests.fakes.gateway import LiveServer, ScriptedBackend, screen, serve_config

SUMMARY_TEXT = "The settings page is open."
"""What the scripted critic's progress summary says (``tests.fakes.gateway.SUMMARY``)."""


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[tuple[ScriptedBackend, str]]:
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


def critiqued_steps(backend: ScriptedBackend) -> list[str]:
    """The proposed step of every critique prompt, in order."""
    out = []
    for kind, messages in backend.calls:
        if kind == "critique":
            text = messages[-1].text()
            out.append(text[text.index("Current Proposed Step:") :])
    return out


# ---------------------------------------------------------------------------------------------
# AndroidLab: ``PixellevelTask.run_step`` with its mapper and pixel-level executor

ANDROID_SCREEN, ANDROID_FRAME = (1440, 3120), (980, 2128)
SYSTEM_PROMPT = "You are an autonomous GUI agent operating on the **Android** platform."


def read_sections(text: str) -> dict[str, str]:
    """The harness' section reader: every tag's last block wins."""
    found = re.finditer(r"<(think|operation|action)>(.*?)</\1>", text, re.DOTALL)
    return {m.group(1): m.group(2).strip() for m in found}


_Q = r"""(["'])"""
_CALL_MAP: list[tuple[str, Callable[[re.Match[str]], str]]] = [
    (r"^click\(\s*x=([^,]+),\s*y=([^)]+)\)$", lambda m: f'do(action="Tap", element=[{m[1].strip()}, {m[2].strip()}])'),  # noqa: E501
    (
        r"^long_press\(\s*x=([^,]+),\s*y=([^,]+),\s*duration=([^)]+)\)$",
        lambda m: f'do(action="Long Press", element=[{m[1].strip()}, {m[2].strip()}], duration={m[3].strip()})',  # noqa: E501
    ),
    (
        r"^swipe\(\s*from_coord=\s*([\(\[])\s*([^,]+)\s*,\s*([^,\)\]]+)\s*[\)\]]\s*,\s*"
        r"to_coord=\s*([\(\[])\s*([^,]+)\s*,\s*([^,\)\]]+)\s*[\)\]](?:\s*,\s*[^=]+=[^,)]*)*\s*\)$",
        lambda m: f'do(action="Swipe Precise", start=[{m[2].strip()}, {m[3].strip()}], end=[{m[5].strip()}, {m[6].strip()}])',  # noqa: E501
    ),
    (rf"^swipe\(\s*direction={_Q}(.+?)\1\s*,\s*amount=([^)]+)\)$", lambda m: f'do(action="Swipe", direction="{m[2]}", dist={m[3].strip()})'),  # noqa: E501
    (rf"^write\(\s*message={_Q}(.+?)\1\)$", lambda m: f'do(action="Type", text="{m[2]}")'),
    (rf"^open_app\(\s*app_name={_Q}(.+?)\1\)$", lambda m: f'do(action="Launch", app="{m[2]}")'),
    (r"^navigate_home\(\)$", lambda m: 'do(action="Home")'),
    (r"^navigate_back\(\)$", lambda m: 'do(action="Back")'),
    (r"^enter\(\)$", lambda m: 'do(action="Enter")'),
    (r"^wait\(\s*seconds=([^)]+)\)$", lambda m: f'do(action="Wait", seconds={m[1].strip()})'),
    (r"^call_user\(\)$", lambda m: 'do(action="Call_API")'),
    (rf"^response\(\s*answer={_Q}(.+?)\1\)$", lambda m: f'do(message="{m[2]}")'),
    (
        r"""^terminate\(\s*status=(["'])(?:.*?)\1\s*,\s*info=(["'])(.+?)\2\)$""",
        lambda m: f'do(action="finish", message="{m[3]}")',
    ),
    (rf"^terminate\(\s*status={_Q}(.+?)\1\s*\)$", lambda m: 'do(action="finish")'),
]  # fmt: skip
"""AndroidLab's call patterns, in its order, each with the command it pastes the match into."""


def map_call(call: str | None) -> str:
    """The harness' mapper: the first whole-text pattern's command, else "Unrecognized"."""
    call = call.strip()  # type: ignore[union-attr]  # no <action>: the harness raises here too
    for pattern, command in _CALL_MAP:
        m = re.match(pattern, call)
        if m:
            return command(m)
    return f'do(message="Unrecognized call: {call}")'


class PixelExecutor:
    """The pixel-level executor: ``exec`` of the command with ``do`` in scope, taps rescaled
    from the frame by the device size; raises where the real one raises."""

    ACTIONS = ("Tap", "Type", "Swipe", "Enter", "Home", "Back", "Long Press", "Wait", "Launch")
    ACTIONS += ("Call_API", "Swipe Precise", "finish")

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []
        self.finished = False

    def __call__(self, command: str) -> None:
        code = re.sub(r"(?<!\.)(?<![\d])\b0+(\d+)", r"\1", command.strip())
        exec(code, {}, {"do": self.do})  # noqa: S102 - what the harness does with the command

    def _px(self, point: list[float]) -> tuple[float, float]:
        if not (isinstance(point, list) and len(point) == 2):
            raise ValueError("Invalid element format")
        x, y = point
        return x * ANDROID_SCREEN[0] / ANDROID_FRAME[0], y * ANDROID_SCREEN[1] / ANDROID_FRAME[1]

    def do(self, action: str | None = None, element: Any = None, **kwargs: Any) -> None:
        assert action in self.ACTIONS, "Unsupported Action"
        if action in ("Tap", "Long Press"):
            self.ran.append((action, self._px(element)))
        elif action == "Swipe Precise":
            self.ran.append((action, (self._px(kwargs["start"]), self._px(kwargs["end"]))))
        elif action == "Swipe":
            dist = kwargs.get("dist", "medium")
            if not isinstance(dist, (str, int)):
                raise UnboundLocalError("unit_dist")  # the controller sizes only ints and words
            self.ran.append((action, (kwargs["direction"], dist)))
        elif action == "Type":
            self.ran.append((action, kwargs["text"]))
        elif action == "Launch":
            self.ran.append((action, kwargs["app"]))
        elif action == "Call_API":
            raise AttributeError("'PixelLevelExecutor' object has no attribute 'call_api'")
        elif action == "finish":
            self.finished = True
        else:
            self.ran.append((action, None))


def executor_runs(action: str) -> bool:
    try:
        PixelExecutor()(map_call(action))
    except Exception:  # noqa: BLE001 - any failure ends the task upstream
        return False
    return True


class PixelTask:
    """``PixellevelTask``: one ``act`` per step, the response's last ``<action>`` mapped and
    executed; an exception ends the task (``error``)."""

    def __init__(self, agent: Any, instruction: str, folder: Path) -> None:
        self.agent, self.instruction, self.folder = agent, instruction, folder
        self.actions = ""
        self.turn = 0
        self.executor = PixelExecutor()
        self.messages: list[list[dict[str, Any]]] = []
        self.error: Exception | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def run_step(self) -> None:
        shot = self.folder / f"{self.turn}_before.png"
        shot.write_bytes(screen(*ANDROID_SCREEN, seed=self.turn))  # each tap changes it
        prompt = (
            "Please generate the next move according to the UI screenshot, the task and "
            f"previous operations.\n\nTask:\n{self.instruction}\n\nPrevious operations:\n"
            f"{self.actions}"
        )
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            self.agent.prompt_to_message(prompt, [str(shot)]),
        ]
        self.messages.append(json.loads(json.dumps(messages)))  # as built, before the agent
        rsp = self.agent.act(messages)
        sections = read_sections(rsp)
        self.actions += f"Step {self.turn}: {sections.get('operation')}\n"
        self.executor(map_call(sections.get("action")))
        self.turn += 1

    def run(self, max_rounds: int = 3) -> PixelTask:
        try:
            for _ in range(max_rounds):
                self.run_step()
                if self.executor.finished:
                    break
        except Exception as exc:  # noqa: BLE001 - the harness logs it and the task ends
            self.error = exc
        return self


def texts_of(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content if isinstance(p, dict) and "text" in p]


class InternVLShapedAgent:
    """The OpenAI-style agents: typed parts, the screenshot as a ``data:`` URL; the model reads
    every text part it is sent."""

    def __init__(self, decide: Callable[[str], str]) -> None:
        self.decide = decide
        self.seen: list[str] = []
        self.sent: list[list[dict[str, Any]]] = []

    def prompt_to_message(self, prompt: str, images: list[str]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for path in images:
            data = base64.b64encode(Path(path).read_bytes()).decode()
            content.append(
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
            )
        content.append({"type": "text", "text": prompt})
        return {"role": "user", "content": content}

    def act(self, messages: list[dict[str, Any]]) -> str:
        self.sent.append(messages)
        text = "\n".join(t for m in messages if m["role"] == "user" for t in texts_of(m))
        self.seen.append(text)
        return self.decide(text)


class QwenShapedAgent(InternVLShapedAgent):
    """``QwenAgent``: untyped parts (text first, the screenshot as a ``file://`` path), and
    ``format_message`` puts the system prompt into the first text part and sends only the
    user message."""

    def prompt_to_message(self, prompt: str, images: list[str]) -> dict[str, Any]:
        return {
            "role": "user",
            "content": [{"text": prompt}, *({"image": f"file://{p}"} for p in images)],
        }

    def format_message(self, message: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if message[0]["role"] == "system":
            message[-1]["content"][0]["text"] = message[0]["content"]
        return [message[-1]]

    def act(self, messages: list[dict[str, Any]]) -> str:
        return super().act(self.format_message(messages))


def answer(action: str, operation: str = "Tap") -> str:
    return (
        f"<think>t</think>\n<operation>\n{operation}\n</operation>\n<action>\n{action}\n</action>"
    )


UNRUNNABLE = [
    "click(x=10, y=20, clicks=1)",  # pasted into the command as the y value: a syntax error
    "long_press(x=300, y=500)",  # the pattern needs duration: "Unrecognized call"
    'click(x=490, y=1064)\nwrite(message="7am")',  # two calls: no pattern matches
]


@pytest.mark.parametrize("action", UNRUNNABLE)
def test_androidlab_unrunnable_action_reaches_the_critic_as_text(gateway, tmp_path, action):
    backend, client = gateway
    wrapped = GuardedAndroidLabAgent(InternVLShapedAgent(lambda text: answer(action)), client)
    task = PixelTask(wrapped, "Set an alarm", tmp_path / "t").run(max_rounds=1)
    wrapped.close()
    assert task.error is not None and task.executor.ran == []  # the harness cannot run it
    (step,) = critiqued_steps(backend)
    assert "<tool_call>" not in step and action in step  # the text itself, not a call
    proposal = wrapped.logs[0]["log"][0]["proposals"][0]
    assert proposal["verdict"].get("marker") is None  # nowhere to point on the screen


def test_androidlab_runnable_text_with_escaped_quotes_is_judged_as_the_call(gateway, tmp_path):
    backend, client = gateway
    action = 'write(message="say \\"hi\\"")'
    wrapped = GuardedAndroidLabAgent(InternVLShapedAgent(lambda text: answer(action)), client)
    task = PixelTask(wrapped, "Send a greeting", tmp_path / "t").run(max_rounds=1)
    wrapped.close()
    assert task.error is None and task.executor.ran == [("Type", 'say "hi"')]
    sent = wrapped.logs[0]["log"][0]["proposals"][0]["action"]
    assert sent["format"] == "qwen" and not sent.get("verbatim")
    (step,) = critiqued_steps(backend)
    assert '"action": "type"' in step and 'say \\"hi\\"' in step


@pytest.mark.parametrize(
    "action",
    [
        *UNRUNNABLE,
        'write(message="say \\"hi\\"")',
        "write(message='say \"hi\"')",
        "click(x=490, y=1064)",
        "click(x=abc, y=1064)",
        "click(x=049, y=1064)",
        "long_press(x=490, y=1064, duration=2)",
        "swipe(from_coord=[490, 1600], to_coord=(490, 400))",
        'swipe(direction="up", amount=0.5)',
        'swipe(direction="up", amount=300)',
        'open_app(app_name="Clock")',
        "wait(seconds=3)",
        'response(answer="7am")',
        "call_user()",
        "navigate_back()",
        "enter()",
        'terminate(status="success")',
        'terminate(status="failure", info="no alarm app")',
        'write(message="two\nlines")',
    ],
)
def test_androidlab_runnable_check_agrees_with_the_harness(action):
    assert runs_on_androidlab(action) == executor_runs(action)


def test_androidlab_qwen_agent_gets_the_feedback_past_its_system_prompt(gateway, tmp_path):
    """``QwenAgent`` replaces the prompt's text part with the system prompt: feedback written
    there never reached the model, the re-proposal was the same and the rejected tap ran."""
    backend, client = gateway
    backend.bad_if = "[250, 250]"

    def decide(text: str) -> str:
        if "critic judged" in text:
            return answer("click(x=490, y=1064)", "Tap OK")  # frame centre: grid (500, 500)
        return answer("click(x=245, y=532)", "Tap logo")  # grid (250, 250): Bad

    agent = QwenShapedAgent(decide)
    wrapped = GuardedAndroidLabAgent(agent, client)
    task = PixelTask(wrapped, "Open the clock", tmp_path / "t").run(max_rounds=1)
    wrapped.close()
    rulings = [p["ruling"] for p in wrapped.logs[0]["log"][0]["proposals"]]
    assert rulings == ["rejected", "accepted"]
    assert task.executor.ran == [("Tap", (720.0, 1560.0))]  # the re-proposal ran
    assert "critic judged" not in agent.seen[0] and "critic judged" in agent.seen[1]
    assert task.actions == "Step 0: Tap OK\n"  # the task's history: only what ran


# ---------------------------------------------------------------------------------------------
# History injection: a visible per-adapter setting, off by default


class OSWorldAgent:
    """OSWorld's ``PromptAgent`` memory (``thoughts``, ``actions``), ``predict(instruction,
    obs) -> (response, actions)``."""

    def __init__(self, act: Callable[[str], str] = lambda text: "pyautogui.click(320, 180)"):
        self.act = act
        self.prompts: list[str] = []
        self.reset()

    def reset(self, _logger: Any = None) -> None:
        self.thoughts: list[str] = []
        self.actions: list[list[str]] = []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        self.prompts.append(instruction)
        code = self.act(instruction)
        self.thoughts.append(f"I will run {code}")
        self.actions.append([code])
        return self.thoughts[-1], [code]


def run_osworld(agent: Any, instruction: str, steps: int) -> list[str]:
    """``lib_run_single.run_single_example``: predict, run each action, stop on DONE/FAIL."""
    agent.reset()
    executed = []
    for step in range(steps):
        obs = {"screenshot": screen(640, 360, seed=step), "accessibility_tree": None}
        _, actions = agent.predict(instruction, obs)
        executed.extend(actions)
        if actions and actions[-1] in ("DONE", "FAIL"):
            break
    return executed


class WAAAgent:
    """A WAA agent like ScaleCUA's: ``history`` of operations, a 4-tuple whose ``logs`` the
    recorder writes into ``traj.jsonl`` (``user_question``, ``plan_result``)."""

    def __init__(self, bad: bool = False) -> None:
        self.bad = bad
        self.prompts: list[str] = []
        self.history: list[str] = []

    def reset(self, _logger: Any = None) -> None:
        self.history = []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[Any, ...]:
        self.prompts.append(instruction)
        operation = f"Click the title bar ({len(self.history)})"
        response = f"<operation>{operation}</operation><action>click(x=322, y=203)</action>"
        self.history.append(operation)
        actions = ['pyautogui.click(x=320.0000, y=200.0000, clicks=1, button="left")']
        return response, actions, {"user_question": instruction, "plan_result": response}, None


def run_waa(agent: Any, instruction: str, folder: Path, steps: int) -> list[dict[str, Any]]:
    """``lib_run_single.run_single_example`` with the recorder's ``traj.jsonl``."""
    agent.reset()
    folder.mkdir(parents=True)
    traj = folder / "traj.jsonl"
    done = False
    for step in range(steps):
        obs = {"screenshot": screen(1280, 800, seed=step), "accessibility_tree": None}
        _, actions, logs, update = agent.predict(instruction, obs)
        for action in actions:
            done = action in ("DONE", "FAIL")
            with traj.open("a") as f:
                f.write(json.dumps({"step_num": step + 1, "action": action, **logs}) + "\n")
            if done:
                break
        if done:
            break
    return [json.loads(line) for line in traj.read_text().splitlines()]


class WebAgent:
    """ScaleCUA's native WebArenaLiteV2 agent: keyword ``predict``,
    ``previous_operations_list``, ``code`` in screen pixels."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.reset()

    def reset(self) -> None:
        self.previous_operations_list: list[str] = []

    def predict(self, *, instruction: str, observation: dict[str, Any]) -> tuple[Any, Any]:
        self.prompts.append(instruction)
        self.previous_operations_list.append("Click the header")
        code = [{"name": "click", "parameters": {"x": 320.0, "y": 180.0, "clicks": 1}}]
        return {"thought": "", "operation": "Click the header", "actions": "click()"}, code


def prompts_osworld(client: CriticClient, tmp_path: Path, **kw: Any) -> tuple[str, list[str]]:
    agent = OSWorldAgent()
    run_osworld(GuardedOSWorldAgent(agent, client, **kw), "Open the settings", 3)
    return "Open the settings", agent.prompts


def prompts_waa(client: CriticClient, tmp_path: Path, **kw: Any) -> tuple[str, list[str]]:
    agent = WAAAgent()
    lines = run_waa(GuardedWAAAgent(agent, client, **kw), "Save the file", tmp_path / "r", 3)
    # What the recorder wrote is what the agent was asked.
    assert [x["user_question"] for x in lines] == agent.prompts
    return "Save the file", agent.prompts


def prompts_webarena(client: CriticClient, tmp_path: Path, **kw: Any) -> tuple[str, list[str]]:
    agent = WebAgent()
    wrapped = GuardedWebArenaLiteAgent(agent, client, **kw)
    wrapped.reset()
    for step in range(3):
        wrapped.predict(instruction="Submit", observation={"screenshot": screen(1280, 720, step)})
    return "Submit", agent.prompts


def prompts_androidlab(client: CriticClient, tmp_path: Path, **kw: Any) -> tuple[str, list[str]]:
    # A new point each step (the same tap twice on a changed screen would trigger R3).
    agent = InternVLShapedAgent(
        lambda text: answer(f"click(x={100 + 200 * text.count('Step ')}, y=500)")
    )
    wrapped = GuardedAndroidLabAgent(agent, client, **kw)
    task = PixelTask(wrapped, "Open the clock", tmp_path / "t").run(max_rounds=3)
    wrapped.close()
    built = ["\n".join(texts_of(m[-1])) for m in task.messages]
    if not kw.get("inject_history"):
        # Off: the very messages the harness built reach the agent.
        assert [json.loads(json.dumps(m)) for m in agent.sent] == task.messages
    return "\n---\n".join(built), ["\n---\n".join(agent.seen)]


RUNNERS = {
    "osworld": prompts_osworld,
    "waa": prompts_waa,
    "webarena_lite": prompts_webarena,
    "androidlab": prompts_androidlab,
}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_history_injection_is_off_by_default_the_prompt_is_the_harness_own(
    gateway, tmp_path, runner
):
    _, client = gateway
    own, prompts = RUNNERS[runner](client, tmp_path)
    assert prompts and all(p == own for p in prompts)  # every verdict Good: nothing added


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_history_injection_on_adds_the_progress_summary(gateway, tmp_path, runner):
    _, client = gateway
    own, prompts = RUNNERS[runner](client, tmp_path, inject_history=True)
    assert any(SUMMARY_TEXT in p for p in prompts)
    assert all(p.startswith(own.split("\n---\n")[0]) for p in prompts)


def test_inject_history_setting_must_be_a_bool(gateway):
    _, client = gateway
    with pytest.raises(ValueError, match="inject_history"):
        GuardedOSWorldAgent(OSWorldAgent(), client, inject_history="yes")  # type: ignore[arg-type]


def test_a_config_that_asks_for_injection_is_not_overruled_silently(gateway, caplog):
    _, client = gateway
    config = GuardConfig(inject_history=True)
    with caplog.at_level("WARNING", logger="serve.adapters._common"):
        wrapped = GuardedOSWorldAgent(OSWorldAgent(), client, config=config)
    assert wrapped.config.inject_history is False
    assert "pass inject_history=True to the adapter" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="serve.adapters._common"):
        GuardedOSWorldAgent(OSWorldAgent(), client, config=config, inject_history=True)
    assert "overrides" not in caplog.text


# ---------------------------------------------------------------------------------------------
# A stop rolls the rejected proposals back (OSWorld and WAA, as WebArenaLiteV2)


def test_osworld_stop_leaves_no_rejected_proposal_in_the_agents_memory(gateway):
    backend, client = gateway
    backend.verdict = "bad"
    agent = OSWorldAgent()
    wrapped = GuardedOSWorldAgent(agent, client, config=GuardConfig(on_exhausted="stop"))
    executed = run_osworld(wrapped, "Open the settings", 3)
    assert executed == ["FAIL"] and len(agent.prompts) == 2  # both proposals rejected
    assert agent.thoughts == [] and agent.actions == []


def test_waa_stop_records_nothing_of_the_rejected_proposal(gateway, tmp_path):
    backend, client = gateway
    backend.bad_if = "title bar (1)"  # step 0 runs; every proposal of step 1 is rejected
    agent = WAAAgent()
    wrapped = GuardedWAAAgent(agent, client, config=GuardConfig(on_exhausted="stop"))
    lines = run_waa(wrapped, "Save the file", tmp_path / "r", 3)
    assert [x["action"] for x in lines][1:] == ["FAIL"] and len(agent.prompts) == 3
    assert agent.history == ["Click the title bar (0)"]  # only the step that ran
    fail = lines[-1]
    assert "plan_result" not in fail and "user_question" not in fail
    assert "title bar (1)" not in json.dumps(fail)  # no trace of the rejected proposal
