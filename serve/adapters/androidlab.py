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
fails; so does a command ``exec`` or the executor's ``do`` cannot run. ``runs_on_androidlab``
follows those rules; a response they refuse (two calls, a missing ``duration``, an extra
argument the pattern pastes into the command) reaches the critic as its text, with no call read
into it and no marker (``unrunnable_payload``), so the critic judges the unrunnable text it is.

With ``QwenAgent``'s untyped parts the guard's text goes into a part of its own: that agent
overwrites the first text part with the system prompt before sending (``with_text``).

    from serve.adapters import GuardedAndroidLabAgent
    agent = GuardedAndroidLabAgent(get_agent(name, **args), CriticClient(url))
    # pass ``agent`` where the harness puts its agent (task_dict["agent"])
"""

from __future__ import annotations

import ast
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
    INJECT_HISTORY,
    VERBATIM,
    GuardedAgent,
    PromptHook,
    action_payload,
    default_prompt,
    png_size,
    runner_config,
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
    """``messages`` with the guard's version of the step's prompt text; not in place.

    * OpenAI-style typed parts (the InternVL-style agents send them as they are): the last text
      part is replaced.
    * ``QwenAgent``'s untyped parts: its ``format_message`` overwrites the FIRST text part with
      the system prompt before sending, so text put there never reaches the model. The first
      part is left to that overwrite and the text is added as a part of its own, after the
      screenshot (the model then gets the system prompt, the screenshot and this text).
    * Plain string content is replaced.

    Every part is copied, so an agent that edits its messages in place (``QwenAgent`` does)
    never edits the harness' own or another proposal's.
    """
    idx = _user_index(messages)
    out = list(messages)
    if idx is None:
        return out
    content = out[idx].get("content")
    if not isinstance(content, list):
        out[idx] = {**out[idx], "content": text}
        return out
    parts = [dict(p) if isinstance(p, dict) else p for p in content]
    texts = [i for i, p in enumerate(parts) if _is_text(p)]
    if not texts:
        parts.append({"type": "text", "text": text})
    elif parts[texts[-1]].get("type") is None:
        parts.append({"text": text})
    else:
        parts[texts[-1]]["text"] = text
    out[idx] = {**out[idx], "content": parts}
    return out


_SECTION = re.compile(r"<(think|operation|action)>(.*?)</\1>", re.DOTALL)


def harness_action(rsp: str) -> str | None:
    """The ``<action>`` text AndroidLab's harness reads of a response (``None``: none).

    As the harness reads its sections: lower-case tags, the LAST ``<action>`` block wins (its
    sections dict keeps the last match), stripped; a section tag inside another's block is part
    of that block.
    """
    found = {m.group(1): m.group(2).strip() for m in _SECTION.finditer(rsp)}
    return found.get("action")


def unrunnable_payload(text: str, intent: str | None) -> dict[str, Any]:
    """The API action for ``<action>`` text AndroidLab's executor cannot run: the text itself,
    with no call read into it and no marker.

    ``verbatim`` alone is not enough: the gateway's ScaleCUA reader is not AndroidLab's
    executor and reads a call in most of this text (``clicks=1``, a ``long_press`` with its
    default duration, two calls), which the critic would then judge as clean tool calls with a
    marker. So the text goes under the critic's own tool-call format, which it is not written
    in: the gateway finds no ``<tool_call>`` block and shows the critic the text as written
    (text that holds such a block goes under ``scalecua``, whose reader cannot read it).
    """
    fmt = "scalecua" if "<tool_call" in text.lower() else "qwen"
    payload: dict[str, Any] = {"raw": text, "format": fmt, VERBATIM: True}
    if intent:
        payload["intent"] = intent
    return payload


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
        inject_history: Add the gateway's progress summary to the prompt text of every step
            (HiViG's history injection; sets ``config.inject_history``). Off by default: the
            messages are the harness' own unless the critic rejected a proposal of the step.
    """

    def __init__(
        self,
        agent: Any,
        client: CriticClient,
        *,
        preset: RunnerPreset = ANDROIDLAB,
        config: GuardConfig | None = None,
        prompt_hook: PromptHook = default_prompt,
        inject_history: bool = INJECT_HISTORY,
    ) -> None:
        self.agent = agent
        self.client = client
        self.preset = preset
        self.config = runner_config(config, inject_history)
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
        text = harness_action(rsp) if isinstance(rsp, str) else None
        text = text if text else rsp
        if isinstance(text, str) and not runs_on_androidlab(text):
            log.info("AndroidLab's executor cannot run this action: judged as written")
            return unrunnable_payload(text, scalecua_intent(rsp))
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
            if text == prompt.text:
                return self.agent.act(messages, *args, **kwargs)  # as the harness built them
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
#
# The harness maps the stripped ``<action>`` text to a ``do(...)`` command by matching the WHOLE
# text against one pattern per call, in a fixed order (the first match wins), and pastes the
# matched text into the command as it is; anything else becomes ``do(message="Unrecognized
# call: ...")``. The executor then runs the command with ``exec`` (after dropping leading zeros
# of numbers) and its ``do`` asserts a known ``action``. The patterns below state the same
# rules, in the same order.

_Q = r"""(["'])"""  # an opening quote; the same quote must close the value
_CALLS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), command)
    for pattern, command in (
        (r"click\(\s*x=([^,]+),\s*y=([^)]+)\)", 'do(action="Tap", element=[{0}, {1}])'),
        (
            r"long_press\(\s*x=([^,]+),\s*y=([^,]+),\s*duration=([^)]+)\)",
            'do(action="Long Press", element=[{0}, {1}], duration={2})',
        ),
        (
            r"swipe\(\s*from_coord=\s*[(\[]\s*([^,]+)\s*,\s*([^,)\]]+)\s*[)\]]\s*,\s*"
            r"to_coord=\s*[(\[]\s*([^,]+)\s*,\s*([^,)\]]+)\s*[)\]](?:\s*,\s*[^=]+=[^,)]*)*\s*\)",
            'do(action="Swipe Precise", start=[{0}, {1}], end=[{2}, {3}])',
        ),
        (
            rf"swipe\(\s*direction={_Q}(.+?)\1\s*,\s*amount=([^)]+)\)",
            'do(action="Swipe", direction="{1}", dist={2})',
        ),
        (rf"write\(\s*message={_Q}(.+?)\1\)", 'do(action="Type", text="{1}")'),
        (rf"open_app\(\s*app_name={_Q}(.+?)\1\)", 'do(action="Launch", app="{1}")'),
        (r"navigate_home\(\)", 'do(action="Home")'),
        (r"navigate_back\(\)", 'do(action="Back")'),
        (r"enter\(\)", 'do(action="Enter")'),
        (r"wait\(\s*seconds=([^)]+)\)", 'do(action="Wait", seconds={0})'),
        (r"call_user\(\)", 'do(action="Call_API")'),
        (rf"response\(\s*answer={_Q}(.+?)\1\)", 'do(message="{1}")'),
        (
            rf"terminate\(\s*status={_Q}(?:.*?)\1\s*,\s*info=([\"'])(.+?)\2\)",
            'do(action="finish", message="{2}")',
        ),
        (rf"terminate\(\s*status={_Q}(.+?)\1\s*\)", 'do(action="finish")'),
    )
)
"""``(pattern, command)`` per call, in the harness' order. A quoted value (``.``) stops at a line
break; ``[^,]+`` and ``[^)]+`` spans do not, as in the harness."""

_FENCE = re.compile(r"```.*?([\s\S]+?)```")
_LEADING_ZEROS = re.compile(r"(?<![\d.])\b0+(\d+)")
_POINTS = {"Tap": ("element",), "Long Press": ("element",), "Swipe Precise": ("start", "end")}
_DIRECTIONS = ("up", "down", "left", "right")


def androidlab_command(action: str) -> str | None:
    """The ``do(...)`` command AndroidLab's harness makes of an ``<action>`` text, or ``None``
    when no call pattern matches the whole text (the harness' "Unrecognized call")."""
    text = action.strip()
    for pattern, command in _CALLS:
        match = pattern.fullmatch(text)
        if match is not None:
            return command.format(*(g.strip() if g else g for g in match.groups()))
    return None


def _executed_code(command: str) -> str:
    """What the executor passes to ``exec``: the fenced line (if any), zeros dropped."""
    fence = _FENCE.search(command)
    if fence is not None:
        command = fence.group(1).strip().split("\n")[-1]
    lines = command.split("\n")
    if len(lines) > 1:
        command = next((line for line in lines if "Action: " in line), command)
    return _LEADING_ZEROS.sub(r"\1", command.strip())


def _do_arguments(code: str) -> dict[str, Any] | None:
    """The keyword values of a ``do(...)`` call that ``exec`` runs, or ``None`` when it
    cannot run (a syntax error, a name it does not know, anything but one ``do`` call)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    if call.func.id != "do" or call.args or any(k.arg is None for k in call.keywords):
        return None
    try:
        return {k.arg: ast.literal_eval(k.value) for k in call.keywords}  # type: ignore[misc]
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _point(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) in (2, 4)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    )


def _executor_runs(args: dict[str, Any]) -> bool:
    """Whether the executor's ``do`` carries the command out without raising."""
    action = args.get("action")
    if action in _POINTS:
        return all(_point(args.get(name)) for name in _POINTS[action])
    if action == "Swipe":
        # The device controller sizes a swipe from an int or a word; a float amount (ScaleCUA's
        # documented 0-1 fraction) leaves its distance unset and raises.
        dist = args.get("dist", "medium")
        dist_ok = isinstance(dist, str) or (isinstance(dist, int) and not isinstance(dist, bool))
        return args.get("direction") in _DIRECTIONS and dist_ok
    if action == "Type":
        return isinstance(args.get("text"), str)
    if action == "Launch":
        return isinstance(args.get("app"), str)
    # No action (``response``: a message only) fails the executor's assertion; ``Call_API``
    # (``call_user``) calls a method the pixel-level executor does not have.
    return action in ("Enter", "Home", "Back", "Wait", "finish")


def runs_on_androidlab(action: str) -> bool:
    """Whether AndroidLab's harness turns this ``<action>`` text into a command that runs.

    Mirrors the harness (see above): exactly one call the patterns know, its matched values
    pasted into a ``do(...)`` command that must parse and name only literal values
    (``click(x=.., y=.., clicks=1)`` pastes ``20, clicks=1`` in as the y value: a syntax error;
    ``long_press`` without ``duration`` and two calls match no pattern); text values re-quoted
    with double quotes (``write(message="say \"hi\"")`` runs, ``write(message='say "hi"')``
    does not); then what the executor's ``do`` accepts (no ``response`` or ``call_user``, a
    swipe direction and an int or word amount). Anything else ends the task with an exception.
    """
    if not isinstance(action, str):
        return False
    command = androidlab_command(action)
    if command is None:
        return False
    args = _do_arguments(_executed_code(command))
    return args is not None and _executor_runs(args)
