"""What every runner adapter shares: action payloads, agent memory snapshots, screenshots."""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import json
import logging
import re
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hivig.actions import (
    ActionError,
    detect_format,
    first_block,
    in_space,
    parse_agent_output,
    parse_androidworld,
    parse_scalecua,
    render_tool_calls,
    space_for_platform,
)
from serve.guard import CriticGuard, Decision, GuardConfig, PolicyContext

log = logging.getLogger(__name__)

DEFAULT_SCREEN = (1920, 1080)
"""OSWorld's default screen, used when neither the caller nor the screenshot says otherwise."""

MEMORY_ATTRS = (
    "thoughts",
    "actions",
    "observations",
    "history",
    "history_images",
    "history_responses",
    "history_actions",
    "responses",
    "screenshots",
    "messages",
    "step_idx",
    "history_instruction",
    "step_his",
    "turn_number",
    "last_action",
    "repeat_time",
)
"""Attributes agents keep their own episode memory in (OSWorld, ScaleCUA, AndroidWorld agents);
the adapters snapshot those that exist so a rejected proposal leaves no trace in the agent.

ScaleCUA's agents: ``history_instruction`` (list of operations, its OSWorld agent); ``step_his``
(one string each step appends to), ``turn_number`` (an int counter), ``last_action`` and
``repeat_time`` (its repeat detector) in its AndroidWorld agent."""

VERBATIM = "verbatim"
"""Payload key: judge the text as it was written (no repair). Set when the adapter's reading
needed a repair the harness' own executor would not make, or when the coordinates cannot be what
the session's space says. The gateway still reads the text with its format's strict reader and
draws a marker when that reads a call; text that must reach the critic with no call read into it
is sent under a format that finds none (``androidlab.unrunnable_payload``)."""

_SYNTAX_REASONS = frozenset({"bad_syntax", "bad_key", "unknown_action", "no_tool_call", "empty"})
"""Strict-parser failures that say the text is not well-formed in its format (as opposed to a
value the tolerant reading rejects as well, e.g. a coordinate off the screen)."""

_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)
_OSWORLD_SPECIAL = ("WAIT", "DONE", "FAIL")

NO_ACTION = {"raw": "(no action executed)", "format": "auto"}
"""The prev_action sent when a step executed nothing (the agent answered without acting)."""


def action_payload(
    output: Any,
    fmt: str,
    *,
    platform: str,
    screen: tuple[int, int],
    coord_space: str | None = None,
    frame: tuple[int, int] | None = None,
    intent: str | None = None,
    executes_repair: bool = False,
) -> dict[str, Any]:
    """The API action object for one step of agent output.

    Well-formed output that parses (``hivig.actions.parse_agent_output``) is sent as the
    canonical Qwen3-VL tool-call text on the 0-1000 grid, so the gateway reads exactly what the
    critic was trained on. Anything else is sent as it is, under ``raw``: the gateway judges it as
    text without a marker; it is never dropped.

    The critic must judge what will execute. The tolerant reading repairs slips (an unescaped
    quote in ``typewrite``, a doubled brace, a ``pyautogui.`` prefix on a ScaleCUA call) that the
    harness' own executor does not repair: the VM would run, or fail on, the broken original.
    Output that reads only after such a repair (``well_formed`` is False) is therefore sent as
    its original text with ``verbatim: true`` (judge as written, no repair, no marker), never as
    the repaired canonical form; unless ``executes_repair``: the caller executes this same
    tolerant reading (``GuardedQwenPolicy.actions``), so the repaired form is what runs.

    Args:
        output: The agent's action text, or an AndroidWorld action object.
        fmt: ``osworld``, ``scalecua``, ``qwen``, ``androidworld`` or ``auto``.
        platform: Session platform.
        screen: Screen size ``(w, h)``.
        coord_space: How the output writes coordinates (``None``: the format's default).
        frame: Resized frame ``(w, h)`` for ``resized_px``.
        intent: The agent's verbal intent, if it states one.
        executes_repair: The executor runs ``parse_agent_output``'s reading (repairs included).

    Returns:
        ``{"raw", "format", ["coord_space"], ["verbatim"], ["intent"]}``.
    """
    parsed = parse_agent_output(
        output,
        fmt,
        platform=platform,
        width=screen[0],
        height=screen[1],
        coord_space=coord_space,
        frame=frame,
    )
    space = space_for_platform(platform)
    payload: dict[str, Any]
    readable = isinstance(parsed, list) and parsed and all(in_space(a, space) for a in parsed)
    runs_as_read = executes_repair or well_formed(output, fmt, platform=platform, screen=screen)
    if readable and runs_as_read:
        payload = {
            "raw": render_tool_calls(parsed, space),  # type: ignore[arg-type]
            "format": "qwen",
            "coord_space": "norm1000",
        }
    else:
        raw = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        payload = {"raw": raw, "format": fmt}
        if readable:
            log.info("agent output reads only after a repair: judged as written")
            payload[VERBATIM] = True
        elif isinstance(parsed, ActionError):
            log.info("agent output sent as raw text (%s)", parsed.reason)
    if intent:
        payload["intent"] = intent
    return payload


def well_formed(
    output: Any, fmt: str, *, platform: str = "ubuntu", screen: tuple[int, int] = DEFAULT_SCREEN
) -> bool:
    """Whether ``output`` is well-formed as its harness reads it, with no repair needed.

    * ``osworld``: the code compiles as it is (the VM runs the string with ``exec``), or it is
      ``WAIT``/``DONE``/``FAIL``; its keys need no check here, as ``parse_agent_output`` never
      repairs them in executed code (a combo pyautogui would not press stays unreadable);
    * ``qwen``: every ``<tool_call>`` block holds one strict-JSON object with ``name`` and
      ``arguments`` (what a tool-call harness decodes), free text around the blocks allowed;
    * ``scalecua``: the calls are bare-name calls the strict ScaleCUA parser reads (ScaleCUA's
      agents match ``name(...)`` per line: a module prefix or a ``+``-joined key fails there);
    * ``androidworld``: an action object, or JSON text the strict parser reads.
    """
    if isinstance(output, (dict, list, tuple)):
        return True  # a structured action (a JSONAction, a WebArena ``code`` list) runs as given
    if not isinstance(output, str):
        return False
    if fmt == "auto":
        fmt = detect_format(output)
    w, h = screen
    if fmt == "osworld":
        return _compiles(output)
    if fmt == "qwen":
        return _strict_tool_calls(output)
    if fmt == "androidworld":
        got = parse_androidworld(output, w, h)
        return not (isinstance(got, ActionError) and got.reason in _SYNTAX_REASONS)
    if fmt == "scalecua":
        block = first_block(output, "action")
        got = parse_scalecua(output if block is None else block, platform, w, h)
        return not (isinstance(got, ActionError) and got.reason in _SYNTAX_REASONS)
    return True  # a format without a strict form: the tolerant reading is the only one


def _compiles(code: str) -> bool:
    if code.strip() in _OSWORLD_SPECIAL:
        return True
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _strict_tool_calls(text: str) -> bool:
    low = text.lower()
    if low.count("<tool_call>") != low.count("</tool_call>"):
        return False  # an unterminated block (or a call written after an empty one)
    bodies = _TOOL_BLOCK.findall(text)
    if not bodies:
        return False
    for body in bodies:
        try:
            obj = json.loads(body.strip())
        except ValueError:
            return False
        if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
            return False
    return True


def scalecua_intent(response: Any) -> str | None:
    """The ``<operation>`` text of a ScaleCUA response (its verbal intent)."""
    if not isinstance(response, str):
        return None
    op = first_block(response, "operation")
    return op.strip() if op and op.strip() else None


INJECT_HISTORY = False
"""The runner adapters' default for ``inject_history``: the agent's prompt is the harness' own
unless the critic acts on the step (feedback on a rejected proposal, a recovery brief, an R3
reroute). HiViG's history injection (the gateway's progress summary added to every prompt) is
opt-in, per adapter, as it changes what the agent is asked on every step."""


def runner_config(config: GuardConfig | None, inject_history: bool) -> GuardConfig:
    """A runner adapter's guard settings: ``config`` with the adapter's ``inject_history``.

    The adapter's argument decides (a visible setting of each wrapper); ``config.inject_history``
    is overwritten by it, with a warning when the two differ, so a config that asked for the
    injection (or kept ``GuardConfig``'s default, which is on) is not overruled silently.
    """
    if not isinstance(inject_history, bool):
        raise ValueError(f"inject_history must be True or False, got {inject_history!r}")
    if config is not None and config.inject_history != inject_history:
        log.warning(
            "the runner adapter's inject_history=%s overrides the guard config's %s; pass "
            "inject_history=%s to the adapter to keep the config's",
            inject_history,
            config.inject_history,
            config.inject_history,
        )
    return dataclasses.replace(config or GuardConfig(), inject_history=inject_history)


def default_prompt(base: str, ctx: PolicyContext) -> str:
    """The agent's instruction with the guard's addendum (history, recovery brief, feedback)."""
    addendum = ctx.prompt_addendum()
    return f"{base}\n\n{addendum}" if addendum else base


PromptHook = Callable[[str, PolicyContext], str]
FeedbackHook = Callable[[Any, str], None]


def prompt_for(
    agent: Any, base: str, ctx: PolicyContext, prompt_hook: PromptHook, hook: FeedbackHook | None
) -> str:
    """The instruction to call the agent with.

    With a ``feedback_hook(agent, text)`` the guard's addendum goes to the agent through it
    (e.g. an extra user turn) and the instruction stays as it is; otherwise ``prompt_hook``
    builds the instruction.
    """
    if hook is None:
        return prompt_hook(base, ctx)
    addendum = ctx.prompt_addendum()
    if addendum:
        hook(agent, addendum)
    return base


class AgentMemory:
    """Snapshots of an agent's memory attributes.

    Containers (lists, dicts) are copied shallowly; immutable values (a ``str`` the agent
    appends to, an ``int`` counter) are kept as they are and restored by assignment, since the
    agent rebinds the attribute (``self.step_his += ...``) rather than changing the value.

    A dotted name reaches memory kept in a part of the agent (``"planner.messages"``: the
    list of ScaleCUA's agentic workflow's planner); the path is followed anew each time, so a
    part the agent replaces is still found.
    """

    def __init__(self, agent: Any, attrs: Iterable[str] = MEMORY_ATTRS) -> None:
        self.agent = agent
        self.attrs = tuple(a for a in attrs if self._has(agent, a))

    @staticmethod
    def _has(obj: Any, dotted: str) -> bool:
        for name in dotted.split("."):
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True

    def _get(self, dotted: str) -> Any:
        obj = self.agent
        for name in dotted.split("."):
            obj = getattr(obj, name)
        return obj

    def _set(self, dotted: str, value: Any) -> None:
        owner, _, name = dotted.rpartition(".")
        setattr(self._get(owner) if owner else self.agent, name, value)

    def take(self) -> dict[str, Any]:
        """The current values."""
        return {a: copy.copy(self._get(a)) for a in self.attrs}

    def put(self, snap: dict[str, Any]) -> None:
        """Restore ``snap``."""
        for attr, value in snap.items():
            self._set(attr, copy.copy(value))

    def splice(self, base: dict[str, Any], start: dict[str, Any]) -> None:
        """R3 Restore in the agent: ``base`` plus what was added since ``start``.

        Lists and strings become ``base + current[len(start):]`` (what a fresh-context proposal
        appended), counters ``base + (current - start)``; other values keep their current state.
        """
        for attr in self.attrs:
            now = self._get(attr)
            old, first = base.get(attr), start.get(attr)
            if _all(list, now, old, first) or _all(str, now, old, first):
                self._set(attr, old + now[len(first) :])
            elif _all(int, now, old, first) and not isinstance(now, bool):
                self._set(attr, old + (now - first))


def _all(kind: type, *values: Any) -> bool:
    return all(isinstance(v, kind) for v in values)


def _marked_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        depth = self.__dict__.get("_constructing", 0)
        object.__setattr__(self, "_constructing", depth + 1)
        try:
            init(self, *args, **kwargs)
        finally:
            object.__setattr__(self, "_constructing", depth)

    return wrapped


def png_size(data: Any) -> tuple[int, int] | None:
    """Width and height from a PNG header, without decoding (``None`` if not a PNG)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < 24:
        return None
    if bytes(data[:8]) != b"\x89PNG\r\n\x1a\n" or bytes(data[12:16]) != b"IHDR":
        return None
    w, h = struct.unpack(">II", bytes(data[16:24]))
    return (w, h) if w > 0 and h > 0 else None


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def rgb_png(pixels: Any, level: int = 1) -> bytes:
    """PNG bytes of an ``(h, w, 3)`` uint8 RGB array (AndroidWorld's ``state.pixels``).

    Written with ``zlib`` directly so the adapter needs no image library.
    """
    h, w = int(pixels.shape[0]), int(pixels.shape[1])
    if len(pixels.shape) != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected an (h, w, 3) RGB array, got shape {tuple(pixels.shape)}")
    raw = bytes(pixels.astype("uint8").tobytes()) if hasattr(pixels, "astype") else bytes(pixels)
    stride = w * 3
    rows = b"".join(b"\x00" + raw[y * stride : (y + 1) * stride] for y in range(h))
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows, level))
        + _chunk(b"IEND", b"")
    )


class EpisodeMemory(AgentMemory):
    """``AgentMemory`` that follows a guard's episode: snapshots per step and R3 events.

    ``begin()`` at the episode's first step, ``step(idx)`` before each step's proposals,
    ``sync(guard)`` after each observe applies what R3 decided to the agent's own memory: a
    Restore splices the memory from before the loop with what the accepted fresh-context step
    added; a failed reroute puts back the memory from before the loop.
    """

    def __init__(self, agent: Any, attrs: Iterable[str] = MEMORY_ATTRS) -> None:
        super().__init__(agent, attrs)
        self.start: dict[str, Any] = {}
        self.snaps: dict[int, dict[str, Any]] = {}
        self.seen_r3 = 0

    def begin(self) -> None:
        """Remember the empty-episode memory (what an R3 reset returns to)."""
        self.start, self.snaps, self.seen_r3 = self.take(), {}, 0

    def step(self, idx: int) -> dict[str, Any]:
        """Snapshot the memory before step ``idx``'s proposals; returns it."""
        snap = self.take()
        self.snaps[idx] = snap
        return snap

    def fresh(self) -> None:
        """R3 reset: the agent proposes with an empty memory."""
        self.put(self.start)

    def sync(self, guard: Any) -> bool:
        """Apply the guard's new R3 events to the agent's memory; True when there were any.

        Called after each observe and before each proposal: a reroute that fails in the middle
        of a step (``on_failure: continue``) puts back the memory from before the loop at once,
        so the step then decided in normal mode is added to that memory, as the guard adds it
        to its history.
        """
        changed = False
        while self.seen_r3 < len(guard.r3_events):
            event = guard.r3_events[self.seen_r3]
            self.seen_r3 += 1
            base = self.snaps.get(event["loop_start"], self.start)
            if event["event"] == "restored":
                self.splice(base, self.start)
            else:
                self.put(base)
            changed = True
        return changed

    def rebase(self, guard: Any, idx: int, snap: dict[str, Any]) -> dict[str, Any]:
        """Before a proposal at step ``idx``: ``snap`` (the step's starting memory) put back,
        then any new R3 event applied; returns the step's starting memory from now on."""
        self.put(snap)
        if self.sync(guard):
            snap = self.take()
            self.snaps[idx] = snap
        return snap


@dataclass
class StepProposals:
    """What one guarded harness step asked of the agent: its outputs in order, the agent's
    memory after each, and the step's starting memory (as the last proposal left it)."""

    outputs: list[Any]
    after: list[dict[str, Any]]
    start: dict[str, Any]


def decide_step(
    wrapper: Any, guard: CriticGuard, instruction: str, call: Callable[[str], Any]
) -> tuple[Any, StepProposals]:
    """Propose, critique and decide one step of a ``predict``-style harness.

    ``call(text)`` asks the wrapped agent once with the instruction to use (the harness' own
    call: positional, keywords, extra arguments). Before each proposal the agent's memory is put
    back to the step's start, so a rejected proposal leaves no trace; an R3 reroute proposes
    from an empty memory, and a reroute that failed within the step puts back the memory from
    before the loop. ``wrapper`` has ``agent``, ``memory`` (an ``EpisodeMemory``),
    ``prompt_hook`` and ``feedback_hook``; the screen is already observed.

    Returns:
        The guard's ``Decision`` and the step's ``StepProposals``.
    """
    memory = wrapper.memory
    memory.sync(guard)
    idx = guard.step_idx
    step = StepProposals([], [], memory.step(idx))

    def policy(ctx: PolicyContext) -> Any:
        step.start = memory.rebase(guard, idx, step.start)
        if ctx.mode == "reroute":
            memory.fresh()  # R3 reset: task and screen only
        text = prompt_for(
            wrapper.agent, instruction, ctx, wrapper.prompt_hook, wrapper.feedback_hook
        )
        out = call(text)
        step.outputs.append(out)
        step.after.append(memory.take())
        return out

    guard.policy = policy
    return guard.decide(), step


def step_result(
    memory: EpisodeMemory, decision: Decision, step: StepProposals, stop: Callable[[], Any]
) -> Any:
    """What a ``predict``-style wrapper hands the harness for a decided step.

    The accepted proposal's output, with the agent's memory as that proposal left it; on a stop,
    ``stop()`` (the harness' stop value) with the memory from the step's start, so the step's
    rejected proposals leave no trace in it either (the agent's history never lists a proposal
    that did not run).
    """
    if decision.stop:
        memory.put(step.start)
        return stop()
    outputs, after = step.outputs, step.after
    chosen = next((i for i, o in enumerate(outputs) if o is decision.proposal), None)
    if chosen is not None and chosen != len(outputs) - 1:
        memory.put(after[chosen])  # execute_first / best-of-N: that proposal's memory
    return decision.proposal


class GuardedAgent:
    """What every runner wrapper shares: attribute pass-through, the episode log and ``reset``.

    Subclasses set ``self.agent`` and ``self.guard`` (the episode's ``CriticGuard`` or ``None``).
    """

    agent: Any
    guard: CriticGuard | None

    def open_guard(
        self,
        task: str,
        *,
        platform: str,
        screen: tuple[int, int],
        coord_space: str,
        session_kwargs: dict[str, Any],
    ) -> CriticGuard:
        """Start the episode's guard: the wrapper's ``client``, ``config``, ``to_action`` and
        ``describe``; the policy is set per step (``decide_step``), and the agent's memory
        (``memory``) starts the episode."""
        wrapper: Any = self
        self.guard = CriticGuard(
            wrapper.client,
            lambda ctx: None,  # replaced per step by a closure over the harness' arguments
            task=task,
            platform=platform,
            screen=screen,
            coord_space=coord_space,
            config=wrapper.config,
            to_action=wrapper.to_action,
            session_kwargs=session_kwargs,
            describe=wrapper.describe,
        )
        wrapper.memory.begin()
        return self.guard

    def __getattr__(self, name: str) -> Any:
        # Harnesses read agent attributes (e.g. ``agent.action_space``); pass them through.
        if name == "agent":
            raise AttributeError(name)
        return getattr(self.agent, name)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every attribute a wrapper's ``__init__`` sets (a subclass' own included) is the
        # wrapper's: the constructors run marked, so ``__setattr__`` keeps those names here.
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:
            cls.__init__ = _marked_init(init)  # type: ignore[method-assign]

    def __setattr__(self, name: str, value: Any) -> None:
        # Harnesses also set agent attributes (AndroidWorld: ``agent.transition_pause = 0.5``).
        # A name the wrapper owns (set while constructing, defined on its class, or private)
        # stays the wrapper's; any other goes to the wrapped agent.
        mine = self.__dict__.get("_constructing", 0) > 0 or name in self.__dict__
        mine = mine or hasattr(type(self), name) or name.startswith("_")
        if mine or "agent" not in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self.agent, name, value)

    @property
    def log(self) -> list[dict[str, Any]]:
        """The critic exchange of the current episode (one dict per step)."""
        return self.guard.log if self.guard is not None else []

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        """Reset the wrapped agent and start a new critic episode."""
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        return self.agent.reset(*args, **kwargs) if hasattr(self.agent, "reset") else None
