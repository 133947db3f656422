"""AndroidLab (ScaleCUA evaluation): the critic inside ``agent.act(messages) -> str``.

Each step of ``PixellevelTask.run_step`` builds ``[system, user]`` messages (the user message
holds the screenshot as a ``data:`` URL from ``agent.prompt_to_message`` and the text
``Task:\\n{instruction}\\n\\nPrevious operations:\\n{actions}``), calls ``agent.act`` and maps
the response's ``<action>`` call (pixels of the 980x2128-style resized frame) to adb. The
wrapper keeps ``act``; a rejected response is never returned, so nothing of it reaches the
task's own history (``task.actions``, ``record.history``: both are built from what ``act``
returns; the agents themselves are stateless).

One agent object is shared by the thread pool (``-p 8``), one task per worker thread at a
time, so the critic episode is kept per thread and restarts when the task text changes or
the prompt lists no previous operation (a task's first step).

    from serve.adapters import GuardedAndroidLabAgent
    agent = GuardedAndroidLabAgent(get_agent(name, **args), CriticClient(url))
    # pass ``agent`` where the harness puts its agent (task_dict["agent"])
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import first_block
from serve.adapters._common import (
    PromptHook,
    action_payload,
    default_prompt,
    png_size,
    scalecua_intent,
)
from serve.adapters._presets import ANDROIDLAB, RunnerPreset
from serve.client import CriticClient
from serve.guard import CriticGuard, GuardConfig, PolicyContext

log = logging.getLogger(__name__)

ANDROIDLAB_STOP = (
    "<think>\nThe critic guard ended the episode.\n</think>\n"
    "<operation>\nStop the task.\n</operation>\n"
    '<action>\nterminate(status="failure")\n</action>'
)
"""The harness' own stop (mapped to ``finish``); returned only when the guard ends the
episode."""

_TASK = re.compile(r"Task:\s*\n(?P<task>.*?)\n\s*\nPrevious operations:[ \t]*\n?", re.DOTALL)


@dataclass
class _Prompt:
    """The parts of one step's user message the wrapper reads and rewrites."""

    text: str
    task: str
    ops_start: int
    """Offset in ``text`` where the previous operations begin (``len(text)``: none listed)."""
    screenshot: bytes | None

    @property
    def operations(self) -> str:
        return self.text[self.ops_start :]


@dataclass
class _Episode:
    """One task's critic episode on one worker thread."""

    task: str
    guard: CriticGuard
    screen: tuple[int, int]
    frame: tuple[int, int]
    record: dict[str, Any] = field(default_factory=dict)


def _image_bytes(part: dict[str, Any]) -> bytes | None:
    url = (part.get("image_url") or {}).get("url") if isinstance(part, dict) else None
    if not isinstance(url, str):
        return None
    if ";base64," in url:
        try:
            return base64.b64decode(url.split(";base64,", 1)[1])
        except ValueError:
            return None
    path = Path(url.removeprefix("file://"))
    return path.read_bytes() if path.is_file() else None


def _user_index(messages: list[dict[str, Any]]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "user":
            return i
    return None


def read_prompt(messages: list[dict[str, Any]]) -> _Prompt | None:
    """The last user message's text, task, previous operations and screenshot."""
    idx = _user_index(messages)
    if idx is None:
        return None
    content = messages[idx].get("content")
    parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
    texts = [p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    shots = [_image_bytes(p) for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
    text = texts[-1] if texts else ""
    match = _TASK.search(text)
    task = match["task"].strip() if match else text.strip()
    start = match.end() if match else len(text)
    return _Prompt(text, task, start, next((s for s in shots if s), None))


def with_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with the last user message's (last) text part replaced; not in place."""
    idx = _user_index(messages)
    out = list(messages)
    if idx is None:
        return out
    content = out[idx].get("content")
    if not isinstance(content, list):
        out[idx] = {**out[idx], "content": text}
        return out
    parts = list(content)
    last = max((i for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "text"),
               default=None)  # fmt: skip
    if last is None:
        parts.append({"type": "text", "text": text})
    else:
        parts[last] = {**parts[last], "text": text}
    out[idx] = {**out[idx], "content": parts}
    return out


class GuardedAndroidLabAgent:
    """An AndroidLab agent behind the critic: same ``act(messages) -> str``, thread-safe.

    Args:
        agent: The AndroidLab agent (``act``, ``prompt_to_message``, ``system_prompt``).
        client: A ``CriticClient`` (shared by the threads; it is thread-safe).
        preset: Platform, screen and frame settings (``ANDROIDLAB``: android, ``resized_px``
            in the ScaleCUA frame of the screenshot's size).
        config: Guard settings (K, on_exhausted, R3, recovery).
        prompt_hook: ``(user_text, ctx) -> user_text``: how the guard's history and feedback
            reach the agent (default: appended to the step's prompt text).
    """

    def __init__(
        self,
        agent: Any,
        client: CriticClient,
        *,
        preset: RunnerPreset = ANDROIDLAB,
        config: GuardConfig | None = None,
        prompt_hook: PromptHook = default_prompt,
    ) -> None:
        self.agent = agent
        self.client = client
        self.preset = preset
        self.config = config or GuardConfig()
        self.prompt_hook = prompt_hook
        self._lock = threading.Lock()
        self._episodes: dict[int, _Episode] = {}
        self.logs: list[dict[str, Any]] = []
        """One entry per task episode: ``{"task", "thread", "log"}`` (``log``: the guard's)."""

    def __getattr__(self, name: str) -> Any:
        # The harness calls ``prompt_to_message`` and reads ``name`` on the agent.
        if name == "agent":
            raise AttributeError(name)
        return getattr(self.agent, name)

    # -- episodes per worker thread -----------------------------------------------------

    def _episode(self, prompt: _Prompt) -> _Episode:
        tid = threading.get_ident()
        first_step = not prompt.operations.strip()
        with self._lock:
            ep = self._episodes.get(tid)
            if ep is not None and (ep.task != prompt.task or first_step and ep.guard.step_idx):
                ep.guard.close()  # the thread moved on to another task
                ep = None
            if ep is None:
                ep = self._new_episode(prompt, tid)
                self._episodes[tid] = ep
        return ep

    def _new_episode(self, prompt: _Prompt, tid: int) -> _Episode:
        screen = png_size(prompt.screenshot) or self.preset.screen
        frame = self.preset.frame(screen)
        guard = CriticGuard(
            self.client,
            lambda ctx: None,  # replaced per step by a closure over the step's messages
            task=prompt.task,
            platform=self.preset.platform,
            screen=screen,
            coord_space=self.preset.coord_space,
            config=self.config,
            to_action=lambda rsp: self._to_action(rsp, screen, frame),
            session_kwargs={"action_format": "scalecua", "frame": frame},
            describe=describe,
        )
        record = {"task": prompt.task, "thread": tid, "log": guard.log}
        self.logs.append(record)
        return _Episode(prompt.task, guard, screen, frame, record)

    def end_task(self) -> None:
        """Close the calling thread's episode (optional: a new task also starts a new one)."""
        with self._lock:
            ep = self._episodes.pop(threading.get_ident(), None)
        if ep is not None:
            ep.guard.close()

    def close(self) -> None:
        """Close every episode's gateway session."""
        with self._lock:
            eps, self._episodes = list(self._episodes.values()), {}
        for ep in eps:
            ep.guard.close()

    # -- the step -----------------------------------------------------------------------

    def _to_action(self, rsp: Any, screen: tuple[int, int], frame: tuple[int, int]) -> dict:
        block = first_block(rsp, "action") if isinstance(rsp, str) else None
        text = block.strip() if block and block.strip() else rsp
        return action_payload(
            text,
            "scalecua",
            platform=self.preset.platform,
            screen=screen,
            coord_space=self.preset.coord_space,
            frame=frame,
            intent=scalecua_intent(rsp),
        )

    def _text_for(self, prompt: _Prompt, ep: _Episode, ctx: PolicyContext) -> str:
        if ctx.fresh:
            # R3 reset: task and screen only.
            return self.prompt_hook(prompt.text[: prompt.ops_start], ctx)
        if ep.guard.r3_events:
            # After an R3 event the task's own list still holds the loop; list the guard's
            # history (which leaves it out) in the harness' wording instead.
            ops = "".join(f"Step {i}: {h}\n" for i, h in enumerate(ctx.history))
            return self.prompt_hook(prompt.text[: prompt.ops_start] + ops, ctx)
        return self.prompt_hook(prompt.text, ctx)

    def act(self, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> str:
        """The harness' ``act``: the accepted response, or the stop response."""
        prompt = read_prompt(messages)
        if prompt is None:
            log.warning("no user message in the agent's input; not critiqued")
            return self.agent.act(messages, *args, **kwargs)
        ep = self._episode(prompt)
        guard = ep.guard
        guard.observe(prompt.screenshot)

        def policy(ctx: PolicyContext) -> Any:
            text = self._text_for(prompt, ep, ctx)
            return self.agent.act(with_text(messages, text), *args, **kwargs)

        guard.policy = policy
        decision = guard.decide()
        if decision.stop:
            self.end_task()
            return ANDROIDLAB_STOP
        return decision.proposal


def describe(rsp: Any) -> str:
    """The response's ``<operation>`` (the harness' history wording), else its action."""
    op = scalecua_intent(rsp)
    if op:
        return op
    block = first_block(rsp, "action") if isinstance(rsp, str) else None
    return (block or str(rsp)).strip()
