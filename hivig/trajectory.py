"""Trajectories and steps: the unit data_gen reads, annotates and turns into samples.

One trajectory per JSONL line, in exactly this form::

    {"id": "...", "episode_key": "...", "source": {"dataset": "...", "file": "..."},
     "platform": "windows", "task": "...", "screen": {"width": 1920, "height": 1080},
     "outcome": "success" | "failure" | "unknown",
     "steps": [{"index": 0, "screenshot": "rel/path.png", "think": "...", "intent": "...",
                "actions": [{"action": "left_click", "coordinate": [501, 874]}],
                "raw_action": "click(x=0.501, y=0.874)"}]}

``actions`` hold Qwen3-VL tool-call ``arguments`` objects on the 0–1000 grid. Action metadata
that Qwen has no field for (a drag's ``start``, a synthesised swipe, a terminate's ``info``, a
``source`` note) is kept in an optional step field ``action_meta``: a list parallel to
``actions`` of objects holding only the non-default metadata, written only when some action has
any. ``screenshot`` paths are relative to the corpus root.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hivig.actions import (
    PLATFORMS,
    Action,
    ActionError,
    action_from_arguments,
    space_for_platform,
)
from hivig.files import atomic_path, dumps_jsonl

Outcome = Literal["success", "failure", "unknown"]
OUTCOMES: tuple[str, ...] = ("success", "failure", "unknown")
"""Allowed ``Trajectory.outcome`` values."""

_ID_HEX = 16  # 64-bit ids: collision odds stay negligible for tens of millions of trajectories.


class TrajectoryError(ValueError):
    """A trajectory or step is malformed.

    Attributes:
        reason: Short stable code for counters and quarantine files: ``bad_json``,
            ``missing_field``, ``bad_field``, ``unknown_platform``, ``bad_outcome``, ``no_steps``,
            ``bad_step_index``, ``absolute_path``, ``bad_action``, ``bad_action_meta``.
        message: Human-readable detail naming the field.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# --------------------------------------------------------------------------------------------
# Keys


def _normalise_folder(source_folder: str) -> str:
    return source_folder.replace("\\", "/").strip("/")


def _short_hash(*parts: str) -> str:
    # NUL cannot occur in paths or instructions, so joined parts cannot collide by shifting.
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:_ID_HEX]


def trajectory_id(source_folder: str, instruction: str) -> str:
    """Stable id of a trajectory: hash of its source folder and whitespace-normalised task.

    Args:
        source_folder: The screenshots' folder, e.g. ``settings/free_task_20250605_101622``.
        instruction: The task text (runs of whitespace count as one space).

    Returns:
        16 lowercase hex characters, identical across runs and machines.
    """
    return _short_hash(
        "trajectory", _normalise_folder(source_folder), " ".join(instruction.split())
    )


def episode_key(source_folder: str, screenshots: Sequence[str]) -> str:
    """Key shared by instruction variants of one episode (same folder, same screenshots).

    Args:
        source_folder: The screenshots' folder.
        screenshots: The step screenshots in order (paths as stored in the steps).

    Returns:
        16 lowercase hex characters; split train/validation by this key, never by sample.
    """
    return _short_hash("episode", _normalise_folder(source_folder), *screenshots)


# --------------------------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True)
class Source:
    """Where a trajectory came from.

    Attributes:
        dataset: Dataset name and version, e.g. ``ScaleCUA-Data``.
        file: Annotation file inside the dataset.
    """

    dataset: str
    file: str


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_str(value: object, name: str, *, optional: bool = False, empty: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TrajectoryError("bad_field", f"{name} must be a string, got {type(value).__name__}")
    if not empty and not value.strip():
        raise TrajectoryError("bad_field", f"{name} must not be empty")


@dataclass
class Step:
    """One step: the screenshot the agent saw and what it did.

    Attributes:
        index: 0-based position in the trajectory.
        screenshot: Image path relative to the corpus root.
        think: The agent's reasoning, ``None`` when the source has none.
        intent: The verbal intent (ScaleCUA ``<operation>``), ``None`` when absent.
        actions: The executed actions (one step may hold several calls).
        raw_action: The action text exactly as in the source, for audit.
    """

    index: int
    screenshot: str
    think: str | None
    intent: str | None
    actions: list[Action] = field(default_factory=list)
    raw_action: str = ""

    def __post_init__(self) -> None:
        if not _is_int(self.index) or self.index < 0:
            raise TrajectoryError(
                "bad_step_index", f"step index must be an int >= 0: {self.index!r}"
            )
        _check_str(self.screenshot, "step.screenshot", empty=False)
        if _is_absolute(self.screenshot):
            raise TrajectoryError(
                "absolute_path",
                f"screenshot must be relative to the corpus root: {self.screenshot}",
            )
        _check_str(self.think, "step.think", optional=True)
        _check_str(self.intent, "step.intent", optional=True)
        _check_str(self.raw_action, "step.raw_action")
        if not isinstance(self.actions, list) or not all(
            isinstance(a, Action) for a in self.actions
        ):
            raise TrajectoryError(
                "bad_action", f"step {self.index}: actions must be a list of actions"
            )

    def to_json(self) -> dict[str, Any]:
        """The step's JSON object (see the module docstring)."""
        out: dict[str, Any] = {
            "index": self.index,
            "screenshot": self.screenshot,
            "think": self.think,
            "intent": self.intent,
            "actions": [_arguments(a, self.index) for a in self.actions],
            "raw_action": self.raw_action,
        }
        meta = [_action_meta(a) for a in self.actions]
        if any(meta):
            out["action_meta"] = meta
        return out

    @classmethod
    def from_json(cls, obj: object, space: str | None = None) -> Step:
        """Build a step from its JSON object.

        Args:
            obj: The decoded object.
            space: ``computer_use`` / ``mobile_use`` to restrict the action names.

        Returns:
            The step.

        Raises:
            TrajectoryError: Any missing or malformed field or action.
        """
        if not isinstance(obj, dict):
            raise TrajectoryError(
                "bad_field", f"a step must be an object, got {type(obj).__name__}"
            )
        index = _require(obj, "index", "step")
        where = f"step {index}"
        raw_actions = _require(obj, "actions", where)
        if not isinstance(raw_actions, list):
            raise TrajectoryError("bad_action", f"{where}: actions must be a list")
        meta = obj.get("action_meta") or [{}] * len(raw_actions)
        if not isinstance(meta, list) or len(meta) != len(raw_actions):
            raise TrajectoryError("bad_action_meta", f"{where}: action_meta must parallel actions")
        actions = [
            _with_meta(_parse_action(a, space, where), m, where)
            for a, m in zip(raw_actions, meta, strict=True)
        ]
        return cls(
            index=index,
            screenshot=_require(obj, "screenshot", where),
            think=obj.get("think"),
            intent=obj.get("intent"),
            actions=actions,
            raw_action=obj.get("raw_action", ""),
        )


@dataclass
class Trajectory:
    """An agent's attempt at one task on one platform.

    Attributes:
        id: Stable id, ``trajectory_id(source_folder, task)``.
        episode_key: ``episode_key(source_folder, screenshots)``; groups instruction variants.
        source: Dataset and file it was read from.
        platform: One of ``windows``, ``mac``, ``ubuntu``, ``web``, ``android``.
        task: The instruction.
        screen_w: Screen width in pixels (of the original screenshots).
        screen_h: Screen height in pixels.
        steps: Steps with contiguous indices 0..n-1.
        outcome: ``success``, ``failure`` or ``unknown``.
    """

    id: str
    episode_key: str
    source: Source
    platform: str
    task: str
    screen_w: int
    screen_h: int
    steps: list[Step]
    outcome: Outcome = "unknown"

    def __post_init__(self) -> None:
        _check_str(self.id, "id", empty=False)
        _check_str(self.episode_key, "episode_key", empty=False)
        if not isinstance(self.source, Source):
            raise TrajectoryError("bad_field", "source must be a Source")
        if self.platform not in PLATFORMS:
            raise TrajectoryError(
                "unknown_platform",
                f"platform must be one of {sorted(PLATFORMS)}: {self.platform!r}",
            )
        _check_str(self.task, "task", empty=False)
        for name in ("screen_w", "screen_h"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise TrajectoryError("bad_field", f"{name} must be a positive int: {value!r}")
        if self.outcome not in OUTCOMES:
            raise TrajectoryError(
                "bad_outcome", f"outcome must be one of {OUTCOMES}: {self.outcome!r}"
            )
        if not isinstance(self.steps, list) or not all(isinstance(s, Step) for s in self.steps):
            raise TrajectoryError("bad_field", "steps must be a list of Step")
        if not self.steps:
            raise TrajectoryError("no_steps", f"trajectory {self.id} has no steps")
        indices = [s.index for s in self.steps]
        if indices != list(range(len(indices))):
            raise TrajectoryError(
                "bad_step_index", f"step indices must be 0..{len(indices) - 1} in order: {indices}"
            )

    def to_json(self) -> dict[str, Any]:
        """The trajectory's JSON object (see the module docstring)."""
        return {
            "id": self.id,
            "episode_key": self.episode_key,
            "source": {"dataset": self.source.dataset, "file": self.source.file},
            "platform": self.platform,
            "task": self.task,
            "screen": {"width": self.screen_w, "height": self.screen_h},
            "outcome": self.outcome,
            "steps": [s.to_json() for s in self.steps],
        }

    @classmethod
    def from_json(cls, obj: object) -> Trajectory:
        """Build a trajectory from its JSON object; the inverse of ``to_json``.

        Args:
            obj: The decoded object.

        Returns:
            The validated trajectory.

        Raises:
            TrajectoryError: Any missing or malformed field, step or action.
        """
        if not isinstance(obj, dict):
            raise TrajectoryError(
                "bad_json", f"a trajectory must be an object, not {type(obj).__name__}"
            )
        platform = _require(obj, "platform", "trajectory")
        try:
            space = space_for_platform(platform)
        except ActionError as e:
            raise TrajectoryError("unknown_platform", e.message) from None
        source = _require(obj, "source", "trajectory")
        screen = _require(obj, "screen", "trajectory")
        steps = _require(obj, "steps", "trajectory")
        if not isinstance(source, dict) or not isinstance(screen, dict):
            raise TrajectoryError("bad_field", "source and screen must be objects")
        if not isinstance(steps, list):
            raise TrajectoryError("bad_field", "steps must be a list")
        dataset, file = _require(source, "dataset", "source"), _require(source, "file", "source")
        _check_str(dataset, "source.dataset")
        _check_str(file, "source.file")
        return cls(
            id=_require(obj, "id", "trajectory"),
            episode_key=_require(obj, "episode_key", "trajectory"),
            source=Source(dataset, file),
            platform=platform,
            task=_require(obj, "task", "trajectory"),
            screen_w=_require(screen, "width", "screen"),
            screen_h=_require(screen, "height", "screen"),
            steps=[Step.from_json(s, space) for s in steps],
            outcome=_require(obj, "outcome", "trajectory"),
        )


# --------------------------------------------------------------------------------------------
# Actions and their metadata


def _require(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise TrajectoryError("missing_field", f"{where} has no {key!r}")
    return obj[key]


def _arguments(action: Action, index: int) -> dict[str, Any]:
    try:
        return action.to_arguments()
    except ActionError as e:
        raise TrajectoryError("bad_action", f"step {index}: {e}") from None


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _action_meta(action: Action) -> dict[str, Any]:
    """Non-default dataclass fields that ``to_arguments`` does not write."""
    args = action.to_arguments()
    meta: dict[str, Any] = {}
    for f in dataclasses.fields(action):
        value = getattr(action, f.name)
        if f.name in args or f.default is dataclasses.MISSING or value == f.default:
            continue
        meta[f.name] = _jsonable(value)
    return meta


def _parse_action(obj: object, space: str | None, where: str) -> Action:
    action = action_from_arguments(obj, space)
    if isinstance(action, ActionError):
        raise TrajectoryError("bad_action", f"{where}: {action}")
    return action


def _is_absolute(path: str) -> bool:
    # String tests instead of PurePath objects: this runs once per step of every ingested line.
    return path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":")


def _check_meta_value(name: str, value: object, where: str) -> None:
    """Metadata types: a drag ``start`` is a grid point, ``synthetic`` a bool, ``info`` text."""
    ok = True
    if name == "start":
        ok = (
            isinstance(value, list | tuple)
            and len(value) == 2
            and all(_is_int(v) and 0 <= v <= 1000 for v in value)
        )
    elif name == "synthetic":
        ok = isinstance(value, bool)
    elif name == "info":
        ok = value is None or isinstance(value, str)
    if not ok:
        raise TrajectoryError("bad_action_meta", f"{where}: bad {name} value {value!r}")


def _with_meta(action: Action, meta: object, where: str) -> Action:
    if not meta:
        return action
    if not isinstance(meta, dict):
        raise TrajectoryError("bad_action_meta", f"{where}: action_meta items must be objects")
    args = action.to_arguments()
    names = {f.name for f in dataclasses.fields(action)} - set(args)
    unknown = sorted(set(meta) - names)
    if unknown:
        raise TrajectoryError(
            "bad_action_meta", f"{where}: {action.action} has no metadata {unknown}"
        )
    for name, value in meta.items():
        _check_meta_value(name, value, where)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in meta.items()}
    return dataclasses.replace(action, **values)


# --------------------------------------------------------------------------------------------
# JSONL files


def scan_trajectories(
    path: str | os.PathLike,
) -> Iterator[tuple[int, Trajectory | TrajectoryError]]:
    """Yield ``(line_number, trajectory or error)`` for every non-blank line of a JSONL file.

    For callers that quarantine bad lines instead of stopping (data_gen).

    Args:
        path: The JSONL file.

    Yields:
        1-based line number and the parsed trajectory, or the ``TrajectoryError`` for that line.
    """
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
                yield number, TrajectoryError("bad_json", f"line {number}: {e}")
                continue
            try:
                yield number, Trajectory.from_json(obj)
            except TrajectoryError as e:
                yield number, e


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """Read every trajectory of a JSONL file, failing on the first bad line.

    Args:
        path: The JSONL file (one trajectory per line; blank lines are ignored).

    Returns:
        The trajectories in file order.

    Raises:
        TrajectoryError: A line is not valid JSON or not a valid trajectory; the message names
            the file and line.
    """
    out: list[Trajectory] = []
    for number, item in scan_trajectories(path):
        if isinstance(item, TrajectoryError):
            raise TrajectoryError(item.reason, f"{path}:{number}: {item.message}") from item
        out.append(item)
    return out


def write_trajectories(trajectories: Iterable[Trajectory], path: str | os.PathLike) -> int:
    """Write trajectories as UTF-8 JSONL, atomically (temporary file, then rename).

    Args:
        trajectories: The trajectories, written in order.
        path: Destination file; its directory must exist.

    Returns:
        The number of lines written.
    """
    dest = Path(path)
    count = 0
    # Streamed (a corpus may not fit in memory as one string); the original file stays
    # untouched until the last line is written.
    with atomic_path(dest, mkdir=False) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for trajectory in trajectories:
            f.write(dumps_jsonl([trajectory.to_json()]))
            count += 1
    return count
