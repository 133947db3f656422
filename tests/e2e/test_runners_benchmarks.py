"""The critic inside WebArenaLiteV2, AndroidLab and WindowsAgentArena loops.

Each fake is shaped like the harness it stands for (the loop's call signature and keyword
arguments, the return arity, the executor, the agent's memory attributes, the result files as
the harness writes them) and runs against a real gateway on 127.0.0.1 with a scripted
backend that answers Bad for the first proposal's grid point.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from serve.adapters import (
    ANDROIDLAB_STOP,
    GuardedAndroidLabAgent,
    GuardedWAAAgent,
    GuardedWebArenaLiteAgent,
)
from serve.adapters.webarena_lite import planner_feedback
from serve.app import create_app
from serve.client import CriticClient
from serve.guard import GuardConfig
from tests.fakes.gateway import LiveServer, ScriptedBackend, screen, serve_config

ROOT = Path(__file__).resolve().parents[2]
BAD_POINT = "[250, 250]"
"""Every first proposal below lands on grid (250, 250); the backend answers Bad there."""


@pytest.fixture
def gateway(tmp_path):
    backend = ScriptedBackend(bad_if=BAD_POINT)
    app = create_app(serve_config(tmp_path / "state"), backend)
    with LiveServer(app) as srv, CriticClient(srv.url) as client:
        yield client, backend


def critiques(backend: ScriptedBackend) -> int:
    return [kind for kind, _ in backend.calls].count("critique")


def executed_marker(log: list[dict[str, Any]], step: int) -> tuple[float, float]:
    """Screen pixel of the marker the gateway drew for the proposal executed at ``step``."""
    prop = [p for p in log[step]["proposals"] if p["ruling"] != "rejected"][-1]
    marker = prop["verdict"]["marker"]
    return marker["x_px"], marker["y_px"]


def sections(text: str) -> dict[str, str]:
    found = re.finditer(r"<(think|operation|action)>(.*?)</\1>", text, re.DOTALL)
    return {m.group(1): m.group(2).strip() for m in found}


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2: ``info, code = agent.predict(instruction=..., observation=obs)``

WEB_FRAME = (1288, 728)  # smart_resize(1280x720, max 2,007,040 px)


class FakeNativeAgent:
    """Like the ScaleCUA native agent: keyword ``predict``, ``previous_operations_list``,
    ``<action>`` in frame pixels turned into screen-pixel ``code``."""

    def __init__(self, script) -> None:
        self.script = script
        self.prompts: list[str] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": "sys"}]
        self.previous_operations_list: list[str] = []

    def predict(self, *, instruction: str, observation: dict[str, Any]):
        self.prompts.append(instruction)
        operation, action = self.script(instruction, self)
        self.previous_operations_list.append(operation)
        m = re.match(r"click\(x=(\d+), y=(\d+)\)", action)
        if m:
            x, y = int(m[1]) / WEB_FRAME[0] * 1280, int(m[2]) / WEB_FRAME[1] * 720
            code = [
                {"name": "click", "parameters": {"x": x, "y": y, "clicks": 1, "button": "left"}}
            ]
        else:
            code = [{"name": "terminate", "parameters": {"status": "success", "info": ""}}]
        info = {"thought": "t", "operation": operation, "actions": action}
        return info, code


class FakeWebEnv:
    def __init__(self) -> None:
        self.executed: list[list[dict[str, Any]]] = []

    def get_obs(self) -> dict[str, Any]:
        return {"screenshot": screen(1280, 720, seed=len(self.executed))}

    def step(self, code) -> None:
        self.executed.append(code)


def run_webarena(agent, env, root: Path, task_id: str, query: str, max_steps: int = 4) -> Path:
    """``agent_run.run_agent``'s loop and files."""
    folder = root / task_id
    (folder / "trajectory").mkdir(parents=True)
    collected: dict[str, list[Any]] = {}
    for idx in range(max_steps):
        obs = env.get_obs()
        (folder / "trajectory" / f"{idx}.png").write_bytes(obs["screenshot"])
        info, code = agent.predict(instruction=query, observation=obs)
        for key, value in info.items():
            collected.setdefault(key, []).append(value)
        if "x" in code[0]["parameters"] and "y" in code[0]["parameters"]:
            pass  # the harness draws the point on the saved screenshot here
        env.step(code)
        if code[0]["name"] == "terminate":
            break
    result = {"task_id": task_id, "task": query, **collected, "steps": idx + 1}
    (folder / "result.json").write_text(json.dumps(result))
    with (root / "results.jsonl").open("a") as f:
        f.write(json.dumps({"task_id": task_id, "metric": 0.0}) + "\n")
    return folder


def web_script(instruction: str, agent: FakeNativeAgent) -> tuple[str, str]:
    if len(agent.previous_operations_list) >= 1 and "Click" in agent.previous_operations_list[0]:
        return "Finish the task", "terminate(status='success')"
    if "critic judged" in instruction:
        return "Click the Submit button", "click(x=644, y=364)"  # -> (640, 360): grid 500
    return "Click the header", "click(x=322, y=182)"  # -> (320, 180): grid 250


def test_webarena_bad_reproposal_executes_what_was_judged(gateway, tmp_path):
    client, backend = gateway
    agent, env = FakeNativeAgent(web_script), FakeWebEnv()
    wrapped = GuardedWebArenaLiteAgent(agent, client)
    wrapped.reset()
    folder = run_webarena(wrapped, env, tmp_path / "results" / "exp", "task1", "Submit the form")
    # Step 0: the header click rejected, the agent re-asked with the critic's words.
    assert "critic judged" in agent.prompts[1] and "critic judged" not in agent.prompts[0]
    click = env.executed[0][0]
    assert click["name"] == "click" and (click["parameters"]["x"], click["parameters"]["y"]) == (
        640.0,
        360.0,
    )
    assert executed_marker(wrapped.log, 0) == (640, 360)  # what the critic saw is what ran
    assert [p["ruling"] for p in wrapped.log[0]["proposals"]] == ["rejected", "accepted"]
    assert env.executed[1][0]["name"] == "terminate"
    # The rejected operation left no trace in the agent's history.
    assert agent.previous_operations_list == ["Click the Submit button", "Finish the task"]
    result = json.loads((folder / "result.json").read_text())
    assert result["operation"] == agent.previous_operations_list and result["steps"] == 2
    assert sorted(p.name for p in (folder / "trajectory").iterdir()) == ["0.png", "1.png"]
    assert critiques(backend) == 3


def test_webarena_stop_only_when_configured_and_the_loop_survives(gateway, tmp_path):
    client, _ = gateway
    always_bad = lambda instruction, agent: ("Click the header", "click(x=322, y=182)")  # noqa: E731
    # Default: a give-up fails open; the policy's proposal runs.
    agent, env = FakeNativeAgent(always_bad), FakeWebEnv()
    wrapped = GuardedWebArenaLiteAgent(agent, client)
    wrapped.reset()
    run_webarena(wrapped, env, tmp_path / "a", "t", "Submit", max_steps=1)
    assert env.executed[0][0]["name"] == "click" and wrapped.log[0]["outcome"] != "stopped"
    # on_exhausted=stop: the harness' own terminate comes back and the loop ends on it.
    agent, env = FakeNativeAgent(always_bad), FakeWebEnv()
    wrapped = GuardedWebArenaLiteAgent(agent, client, config=GuardConfig(on_exhausted="stop"))
    wrapped.reset()
    folder = run_webarena(wrapped, env, tmp_path / "b", "t", "Submit")
    assert env.executed == [
        [{"name": "terminate", "parameters": {"status": "failure", "info": ""}}]
    ]
    assert json.loads((folder / "result.json").read_text())["steps"] == 1
    assert agent.previous_operations_list == []  # both rejected proposals were rolled back


class FakePlanner:
    """The workflow's planner: ``messages`` (OpenAI-style content lists) and ``add_message``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.messages = [
            {"role": "system", "content": [{"type": "text", "text": "Task: {task_instruction}"}]}
        ]

    def add_message(self, text_content: str, image_content=None, role="user", put_text_last=False):
        self.messages.append({"role": role, "content": [{"type": "text", "text": text_content}]})


class FakeAgenticWorkflow:
    """``OpenCUAAgenticWorkflow.predict``: the instruction goes into the planner's system
    prompt only while ``step_count == 0``; each step adds the fixed user prompt to
    ``planner.messages``, asks the planner (which sees only those messages) and counts
    ``step_count``."""

    def __init__(self) -> None:
        self.planner = FakePlanner()
        self.seen: list[str] = []
        self.reset()

    def reset(self) -> None:
        self.step_count = 0
        self.turn_count = 0
        self.planner.reset()

    def predict(self, instruction: str, observation: dict[str, Any]):
        if self.step_count == 0:
            system = self.planner.messages[0]["content"][0]
            system["text"] = system["text"].format(task_instruction=instruction)
        self.planner.add_message("Give the next step.", observation["screenshot"], "user", True)
        conversation = "\n".join(m["content"][0]["text"] for m in self.planner.messages)
        self.seen.append(conversation)
        # The planner's answer, from what it was shown: the critic's words move the click.
        x, y = (640.0, 360.0) if "critic judged" in conversation else (320.0, 180.0)
        self.step_count += 1
        code = [{"name": "click", "parameters": {"x": x, "y": y, "clicks": 1, "button": "left"}}]
        return {"thought": "", "operation": f"Click at {x}", "actions": code}, code


def test_webarena_agentic_workflow_gets_feedback_and_keeps_no_rejected_turn(gateway, tmp_path):
    client, _ = gateway
    agent, env = FakeAgenticWorkflow(), FakeWebEnv()
    wrapped = GuardedWebArenaLiteAgent(
        agent, client, feedback_hook=planner_feedback, inject_history=True
    )
    wrapped.reset()
    run_webarena(wrapped, env, tmp_path / "r", "t", "Submit the form", max_steps=2)
    # Step 0: the first click rejected; the re-proposal saw the critic's words.
    assert "critic judged" not in agent.seen[0] and "critic judged" in agent.seen[1]
    assert [c[0]["parameters"]["x"] for c in env.executed] == [640.0, 640.0]
    assert agent.step_count == 2  # one per executed step, not per proposal
    turns = [m["content"][0]["text"] for m in agent.planner.messages]
    # system; step 0: the guard's turn (feedback), its prompt; step 1: the guard's turn
    # (history), its prompt. The rejected run's prompt turn is gone.
    assert turns[0] == "Task: Submit the form" and turns.count("Give the next step.") == 2
    assert len(turns) == 5 and turns[2] == turns[4] == "Give the next step."
    assert "critic judged" in turns[1] and sum("critic judged" in t for t in turns) == 1


# ---------------------------------------------------------------------------------------------
# AndroidLab: ``rsp = agent.act([system, user])`` from a thread pool sharing one agent

ANDROID_SCREEN, ANDROID_FRAME = (1440, 3120), (980, 2128)
_ANDROID_PNG = screen(*ANDROID_SCREEN)


class FakeAndroidLabAgent:
    """Stateless like AndroidLab's agents: ``prompt_to_message`` + ``act``."""

    name = "FakeAgent"

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self.barrier = barrier
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def prompt_to_message(self, prompt: str, images: list[str]) -> dict[str, Any]:
        content = []
        for path in images:
            data = base64.b64encode(Path(path).read_bytes()).decode()
            content.append(
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
            )
        content.append({"type": "text", "text": prompt})
        return {"role": "user", "content": content}

    def act(self, messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"][-1]["text"]
        with self.lock:
            self.calls.append(text)
        ops = text.split("Previous operations:\n", 1)[1]
        if "Step 0" in ops:
            return '<operation>Finish</operation><action>terminate(status="success")</action>'
        if self.barrier is not None and "critic judged" not in text:
            self.barrier.wait(timeout=30)  # both tasks are mid-step at once
        if "critic judged" in text:
            return (
                "<think>t</think><operation>Tap OK</operation><action>click(x=490, y=1064)</action>"
            )
        return "<think>t</think><operation>Tap logo</operation><action>click(x=245, y=532)</action>"


class FakePixelTask:
    """``PixellevelTask.run_step`` with a recording executor and the trace files."""

    def __init__(self, agent, instruction: str, task_dir: Path) -> None:
        self.agent, self.instruction, self.dir = agent, instruction, task_dir
        self.actions = ""
        self.history: list[dict[str, Any]] = []
        self.taps: list[tuple[float, float]] = []
        self.turn = 0
        self.is_finish = False
        for sub in ("traces", "Screen"):
            (task_dir / sub).mkdir(parents=True)

    def run_step(self) -> None:
        shot = self.dir / "Screen" / f"{self.turn}_before.png"
        shot.write_bytes(_ANDROID_PNG)
        prompt = (
            "Please generate the next move according to the UI screenshot, the task and "
            f"previous operations.\n\nTask:\n{self.instruction}\n\nPrevious operations:\n"
            f"{self.actions}"
        )
        system = {"role": "system", "content": "system prompt"}
        rsp = self.agent.act([system, self.agent.prompt_to_message(prompt, [str(shot)])])
        sec = sections(rsp)
        self.actions += f"Step {self.turn}: {sec.get('operation')}\n"
        m = re.match(r"click\(x=([\d.]+), y=([\d.]+)\)", sec.get("action", ""))
        if m:  # Tap: frame pixels rescaled by the device size
            tap = (float(m[1]) * 1440 / ANDROID_FRAME[0], float(m[2]) * 3120 / ANDROID_FRAME[1])
            self.taps.append(tap)
            parsed = {"action": "Tap", "kwargs": {"element": [float(m[1]), float(m[2])]}}
        elif sec.get("action", "").startswith("terminate("):
            self.is_finish, parsed = True, {"action": "finish", "kwargs": {}}
        else:
            parsed = {"action": "unknown", "kwargs": {}}
        self.history.append({"role": "assistant", "content": rsp})
        line = {
            "index": self.turn,
            "image": str(shot),
            "parsed_action": parsed,
            "current_response": rsp,
        }
        with (self.dir / "traces" / "trace.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.turn += 1

    def run(self, max_rounds: int = 4) -> FakePixelTask:
        for _ in range(max_rounds):
            self.run_step()
            if self.is_finish:
                break
        return self


def test_androidlab_thread_pool_keeps_tasks_apart(gateway, tmp_path):
    client, backend = gateway
    agent = FakeAndroidLabAgent(threading.Barrier(2))
    wrapped = GuardedAndroidLabAgent(agent, client)
    names = ["Open the clock", "Open the settings"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        tasks = [
            FakePixelTask(wrapped, n, tmp_path / "logs" / f"t{i}") for i, n in enumerate(names)
        ]
        done = [f.result(timeout=60) for f in [pool.submit(t.run) for t in tasks]]
    assert sorted(e["task"] for e in wrapped.logs) == sorted(names)
    assert len({e["thread"] for e in wrapped.logs}) == 2
    episodes = sorted(wrapped.logs, key=lambda e: names.index(e["task"]))
    for task, episode in zip(done, episodes, strict=True):
        # Each task: the logo tap rejected, the OK tap run, then finish; nothing rejected in
        # the task's own history.
        assert task.actions == "Step 0: Tap OK\nStep 1: Finish\n"
        assert task.taps == [(720.0, 1560.0)] and task.is_finish
        log = episode["log"]
        assert [p["ruling"] for p in log[0]["proposals"]] == ["rejected", "accepted"]
        assert executed_marker(log, 0) == (720, 1560)  # the device pixel the executor used
        assert len(log) == 2  # its own two steps, not the other task's
        lines = (task.dir / "traces" / "trace.jsonl").read_text().splitlines()
        assert [json.loads(x)["parsed_action"]["action"] for x in lines] == ["Tap", "finish"]
    # Each episode's re-proposal carried only its own task's feedback.
    for call in agent.calls:
        if "critic judged" in call:
            assert call.count("Task:\n") == 1
    assert critiques(backend) == 6


def test_androidlab_stop_maps_to_finish(gateway, tmp_path):
    client, _ = gateway

    class AlwaysBad(FakeAndroidLabAgent):
        def act(self, messages):
            return "<operation>Tap logo</operation><action>click(x=245, y=532)</action>"

    wrapped = GuardedAndroidLabAgent(AlwaysBad(), client, config=GuardConfig(on_exhausted="stop"))
    task = FakePixelTask(wrapped, "Open the clock", tmp_path / "t").run()
    assert task.is_finish and task.taps == [] and task.turn == 1
    assert sections(ANDROIDLAB_STOP)["action"] == 'terminate(status="failure")'
    # A new task on the same thread opens a new episode.
    FakePixelTask(wrapped, "Open the clock", tmp_path / "u").run(max_rounds=1)
    assert len(wrapped.logs) == 2


class QwenShapedAgent(FakeAndroidLabAgent):
    """``agent/mllm/qwen_model.py``'s ``QwenAgent``: untyped content parts, the text first and
    the screenshot as the ``file://`` path the harness wrote."""

    def __init__(self, action: str = "click(x=490, y=1064)") -> None:
        super().__init__()
        self.action = action

    def prompt_to_message(self, prompt: str, images: list[str]) -> dict[str, Any]:
        return {
            "role": "user",
            "content": [{"text": prompt}, *({"image": f"file://{p}"} for p in images)],
        }

    def act(self, messages: list[dict[str, Any]]) -> str:
        self.calls.append(next(p["text"] for p in messages[-1]["content"] if "text" in p))
        return f"<operation>Tap</operation><action>{self.action}</action>"


class OpenAIShapedAgent(QwenShapedAgent):
    """The InternVL-style agents: typed parts, the screenshot as a ``data:`` URL."""

    prompt_to_message = FakeAndroidLabAgent.prompt_to_message

    def act(self, messages: list[dict[str, Any]]) -> str:
        self.calls.append(messages[-1]["content"][-1]["text"])
        return f"<operation>Tap</operation><action>{self.action}</action>"


@pytest.mark.parametrize("agent_cls", [QwenShapedAgent, OpenAIShapedAgent])
def test_androidlab_reads_both_message_shapes_as_one_episode(gateway, tmp_path, agent_cls):
    client, _ = gateway
    wrapped = GuardedAndroidLabAgent(agent_cls(), client)
    FakePixelTask(wrapped, "Set an alarm for 7am", tmp_path / "t").run(max_rounds=3)
    assert [e["task"] for e in wrapped.logs] == ["Set an alarm for 7am"]  # one episode
    log = wrapped.logs[0]["log"]
    assert len(log) == 3 and all(step["observe"]["image_ref"] for step in log)
    wrapped.close()


@pytest.mark.parametrize(
    "action",
    [
        'click(x=490, y=1064)\nwrite(message="7am")',  # two calls: one anchored pattern each
        "long_press(x=490, y=1064)",  # the pattern requires duration
        "click(x=490, y=1064, clicks=1)",  # pasted into the command as the y value
    ],
)
def test_androidlab_actions_the_executor_cannot_run_are_judged_verbatim(gateway, tmp_path, action):
    client, _ = gateway
    wrapped = GuardedAndroidLabAgent(OpenAIShapedAgent(action), client)
    FakePixelTask(wrapped, "Set an alarm", tmp_path / "t").run(max_rounds=1)
    sent = wrapped.logs[0]["log"][0]["proposals"][0]["action"]
    # Under the critic's own tool-call format, which finds no call in it: shown as written.
    assert sent == {"raw": action, "format": "qwen", "verbatim": True, "intent": "Tap"}


def test_androidlab_runnable_action_is_judged_as_a_tool_call(gateway, tmp_path):
    client, _ = gateway
    wrapped = GuardedAndroidLabAgent(
        OpenAIShapedAgent("long_press(x=490, y=1064, duration=2)"), client
    )
    FakePixelTask(wrapped, "Set an alarm", tmp_path / "t").run(max_rounds=1)
    sent = wrapped.logs[0]["log"][0]["proposals"][0]["action"]
    assert sent["format"] == "qwen" and '"long_press"' in sent["raw"]


def test_androidlab_wrapper_forwards_writes_and_closes_sessions_outside_its_lock(gateway, tmp_path):
    client, _ = gateway
    agent = OpenAIShapedAgent()
    with GuardedAndroidLabAgent(agent, client) as wrapped:
        wrapped.temperature = 0.0  # a harness setting reaches the agent, as every wrapper's
        assert agent.temperature == 0.0 and "temperature" not in vars(wrapped)
        FakePixelTask(wrapped, "Open the clock", tmp_path / "t").run(max_rounds=1)
        first = wrapped.guard
        closed_unlocked = []
        real_close = first.close
        first.close = lambda: (closed_unlocked.append(not wrapped._lock.locked()), real_close())
        # The thread's next task closes the previous episode, without holding the shared lock.
        FakePixelTask(wrapped, "Open the settings", tmp_path / "u").run(max_rounds=1)
        assert closed_unlocked == [True] and first.session is None
        second = wrapped.guard
        assert second is not first and second.session is not None
    assert second.session is None  # the with block closed the thread's last episode


# ---------------------------------------------------------------------------------------------
# WindowsAgentArena: ``response, actions, logs, update = agent.predict(instruction, obs)``

WIN_FRAME = (1288, 812)


class FakeWAAScaleCUAAgent:
    """Like the WAA ScaleCUA agent: ``history`` of operations, frame pixels -> pyautogui."""

    def __init__(self, always_bad: bool = False) -> None:
        self.always_bad = always_bad
        self.history: list[str] = []

    def reset(self, _logger=None) -> None:
        self.history = []

    def predict(self, instruction: str, obs: dict[str, Any]):
        if self.history and not self.always_bad:
            op, actions = "Done", ["DONE"]
        elif "critic judged" in instruction and not self.always_bad:
            op, (x, y) = "Click Save", (644, 406)
        else:
            op, (x, y) = "Click the title bar", (322, 203)
        if op != "Done":
            sx, sy = x / WIN_FRAME[0] * 1280, y / WIN_FRAME[1] * 800
            actions = [f'pyautogui.click(x={sx:.4f}, y={sy:.4f}, clicks=1, button="left")']
        response = f"<operation>{op}</operation><action>...</action>"
        self.history.append(op)
        return response, actions, {"agent_raw_response": response}, None


def run_waa(agent, result_dir: Path, instruction: str, max_steps: int = 4) -> list[str]:
    """``lib_run_single.run_single_example``'s loop with the recorder's ``traj.jsonl``."""
    executed: list[str] = []
    agent.reset()
    shot = screen(1280, 800)
    result_dir.mkdir(parents=True)
    traj = result_dir / "traj.jsonl"
    (result_dir / "screenshot-step_reset_0.png").write_bytes(shot)
    with traj.open("a") as f:
        f.write(
            json.dumps({"step_num": 0, "action": None, "screenshot": "screenshot-step_reset_0.png"})
            + "\n"
        )
    done, step = False, 0
    while not done and step < max_steps:
        obs = {"screenshot": screen(1280, 800, seed=step), "accessibility_tree": None}
        response, actions, logs, update = agent.predict(instruction, obs)
        for action in actions:
            executed.append(action)
            done = action in ("DONE", "FAIL")
            name = f"screenshot-step_{step}_0.png"
            (result_dir / name).write_bytes(obs["screenshot"])
            line = {"step_num": step + 1, "action": action, "screenshot": name, **logs}
            with traj.open("a") as f:
                f.write(json.dumps(line) + "\n")
            if done:
                break
        step += 1
    (result_dir / "result.txt").write_text("0.0\n")
    return executed


def test_waa_bad_reproposal_and_four_tuple(gateway, tmp_path):
    client, backend = gateway
    agent = FakeWAAScaleCUAAgent()
    wrapped = GuardedWAAAgent(agent, client)
    executed = run_waa(wrapped, tmp_path / "res", "Save the file")
    assert executed == ['pyautogui.click(x=640.0000, y=400.0000, clicks=1, button="left")', "DONE"]
    assert executed_marker(wrapped.log, 0) == (640, 400)
    assert agent.history == ["Click Save", "Done"]  # the rejected operation rolled back
    assert wrapped.guard is not None and wrapped.guard.screen == (1280, 800)
    lines = [json.loads(x) for x in (tmp_path / "res" / "traj.jsonl").read_text().splitlines()]
    assert lines[0]["action"] is None and [x["action"] for x in lines[1:]] == executed
    assert critiques(backend) == 3


def test_waa_stop_returns_fail_in_four_values(gateway, tmp_path):
    client, _ = gateway
    wrapped = GuardedWAAAgent(FakeWAAScaleCUAAgent(always_bad=True), client)
    executed = run_waa(wrapped, tmp_path / "a", "Save", max_steps=1)
    assert executed[0].startswith("pyautogui.click(")  # default: fail open, never a FAIL
    wrapped = GuardedWAAAgent(
        FakeWAAScaleCUAAgent(always_bad=True), client, config=GuardConfig(on_exhausted="stop")
    )
    assert run_waa(wrapped, tmp_path / "b", "Save") == ["FAIL"]


# ---------------------------------------------------------------------------------------------
# The example scripts run (so they cannot rot)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["webarena_lite", "androidlab", "waa", "osworld", "androidworld"])
def test_example_runner_scripts_run(name):
    script = ROOT / "examples" / "runners" / f"{name}.py"
    run = subprocess.run(
        [sys.executable, str(script), "--selftest"], capture_output=True, text=True, timeout=120,
        cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["rejected"] >= 1 and summary["executed"]
