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
the prompt lists no previous operation (a task's first step). The harness never says a task
ended: a thread's last episode stays open until ``close()`` (or the end of a ``with`` block,
or interpreter exit, whichever comes first).

User messages are read in both shapes the harness' agents build: OpenAI-style parts
(``{"type": "text"}``, ``{"type": "image_url", "image_url": {"url": "data:..."}}``) and
``QwenAgent``'s (``{"text": ...}``, ``{"image": "file://..."}``; the image read from the file
the harness wrote).

The critic judges what the executor can run. The harness maps the response's ``<action>`` text
to its ``do(...)`` command by matching the WHOLE text against one anchored pattern per call
(``click(x=.., y=..)``, ``long_press(x=.., y=.., duration=..)``, ...) and pasting the matched
values into the command; anything else becomes an "Unrecognized call" message and the task
fails. ``runs_on_androidlab`` mirrors those rules; a response they refuse (two calls, a
missing ``duration``, an extra argument the pattern would paste into the command) is sent as
its text, ``verbatim``, so the critic judges it as the unrunnable text it is.

    from serve.adapters import GuardedAndroidLabAgent
    agent = GuardedAndroidLabAgent(get_agent(name, **args), CriticClient(url))
    # pass ``agent`` where the harness puts its agent (task_dict["agent"])
"""

from __future__ import annotations

import atexit
import base64
import logging
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.actions import first_block
from serve.adapters._common import (
    VERBATIM,
    GuardedAgent,
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


def _is_text(part: Any) -> bool:
    """A text part: OpenAI's ``{"type": "text"}`` or QwenAgent's untyped ``{"text": ...}``."""
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return kind == "text" or (kind is None and isinstance(part.get("text"), str))


def _image_ref(part: Any) -> str | None:
    """The image a part holds: an OpenAI ``image_url`` or QwenAgent's ``{"image": ...}``."""
    if not isinstance(part, dict):
        return None
    if part.get("type") == "image_url" or "image_url" in part:
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return url if isinstance(url, str) else None
    image = part.get("image")
    if part.get("type") in (None, "image") and isinstance(image, str):
        return image
    return None


def _image_bytes(ref: str | None) -> bytes | None:
    """A data URL decoded, or the file a ``file://`` URL or plain path names."""
    if not isinstance(ref, str):
        return None
    if ";base64," in ref:
        try:
            return base64.b64decode(ref.split(";base64,", 1)[1])
        except ValueError:
            return None
    path = Path(ref.removeprefix("file://"))
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError as exc:
        log.warning("cannot read the step's screenshot %s: %s", path, exc)
        return None


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
    texts = [p["text"] for p in parts if _is_text(p)]
    shots = (_image_bytes(_image_ref(p)) for p in parts if _image_ref(p) is not None)
    text = texts[-1] if texts else ""
    match = _TASK.search(text)
    task = match["task"].strip() if match else text.strip()
    start = match.end() if match else len(text)
    return _Prompt(text, task, start, next((shot for shot in shots if shot), None))


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
    last = max((i for i, p in enumerate(parts) if _is_text(p)), default=None)
    if last is None:
        parts.append({"type": "text", "text": text})
    else:
        parts[last] = {**parts[last], "text": text}
    out[idx] = {**out[idx], "content": parts}
    return out


class GuardedAndroidLabAgent(GuardedAgent):
    """An AndroidLab agent behind the critic: same ``act(messages) -> str``, thread-safe.

    Attribute reads and writes pass through to the wrapped agent like every wrapper's. Use it
    as a context manager (or call ``close()``) to end the open episodes; they are also closed
    at interpreter exit.

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
        # The harness never calls close(); the last episode of each thread ends at exit. A
        # weak reference: registering must not keep a dropped wrapper alive.
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def guard(self) -> CriticGuard | None:  # type: ignore[override]
        """The calling thread's episode guard (``None`` before its first step)."""
        with self._lock:
            ep = self._episodes.get(threading.get_ident())
        return ep.guard if ep is not None else None

    def __enter__(self) -> GuardedAndroidLabAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        """End the calling thread's episode and reset the wrapped agent (if it resets)."""
        self.end_task()
        return self.agent.reset(*args, **kwargs) if hasattr(self.agent, "reset") else None

    # -- episodes per worker thread -----------------------------------------------------

    def _episode(self, prompt: _Prompt) -> _Episode:
        tid = threading.get_ident()
        first_step = not prompt.operations.strip()
        ended = None
        with self._lock:
            ep = self._episodes.get(tid)
            if ep is not None and (ep.task != prompt.task or first_step and ep.guard.step_idx):
                ended, ep = ep, None  # the thread moved on to another task
            if ep is None:
                ep = self._new_episode(prompt, tid)
                self._episodes[tid] = ep
        if ended is not None:
            ended.guard.close()  # network I/O: outside the lock the other threads share
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
        if isinstance(text, str) and not runs_on_androidlab(text):
            log.info("AndroidLab's executor cannot run this action: judged as written")
            payload: dict[str, Any] = {"raw": text, "format": "scalecua", VERBATIM: True}
            intent = scalecua_intent(rsp)
            return {**payload, "intent": intent} if intent else payload
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


def _close_at_exit(ref: weakref.ref) -> None:
    wrapper = ref()
    if wrapper is not None:
        try:
            wrapper.close()
        except Exception as exc:  # noqa: BLE001 - the gateway may be gone at exit
            log.debug("closing AndroidLab episodes at exit failed: %s", exc)


def describe(rsp: Any) -> str:
    """The response's ``<operation>`` (the harness' history wording), else its action."""
    op = scalecua_intent(rsp)
    if op:
        return op
    block = first_block(rsp, "action") if isinstance(rsp, str) else None
    return (block or str(rsp)).strip()


# ---------------------------------------------------------------------------------------------
# What AndroidLab's executor runs

_NUM = r"\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)\s*"
_PAIR = rf"[\(\[]{_NUM},{_NUM}[\)\]]\s*"
_TEXT = r"""(?P<q>["'])[^"\n]+?(?P=q)"""  # re-quoted with double quotes in the command
_RUNNABLE = tuple(
    re.compile(p)
    for p in (
        rf"click\(\s*x={_NUM},\s*y={_NUM}\)",
        rf"long_press\(\s*x={_NUM},\s*y={_NUM},\s*duration={_NUM}\)",
        rf"swipe\(\s*from_coord=\s*{_PAIR},\s*to_coord=\s*{_PAIR}(?:,\s*[^=,]+=[^,)]*)*\)",
        rf"swipe\(\s*direction={_TEXT}\s*,\s*amount={_NUM}\)",
        rf"write\(\s*message={_TEXT}\)",
        rf"open_app\(\s*app_name={_TEXT}\)",
        rf"wait\(\s*seconds={_NUM}\)",
        rf"response\(\s*answer={_TEXT}\)",
        r"""terminate\(\s*status=(["'])[^\n]+?\1\s*(?:,\s*info=(["'])[^"\n]+?\2)?\s*\)""",
        r"(?:navigate_home|navigate_back|enter|call_user)\(\)",
    )
)


def runs_on_androidlab(action: str) -> bool:
    """Whether AndroidLab's harness turns this ``<action>`` text into a command that runs.

    The harness matches the whole (stripped) text against one anchored pattern per call and
    pastes the matched values into a ``do(...)`` command. So: exactly one call; every argument
    its pattern names, in that order, and no other (``click(x=.., y=.., clicks=1)`` would paste
    ``1064, clicks=1`` in as the y value); numbers where the command needs numbers; text
    arguments on one line without a double quote (the command re-quotes them with double
    quotes). Anything else becomes "Unrecognized call" and ends the task.
    """
    text = action.strip()
    return any(p.fullmatch(text) for p in _RUNNABLE)
