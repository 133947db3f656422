"""AndroidWorld checkpoints (gzipped pickles), read without running anything they name."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

from hivig.run_folders._base import (
    ANDROIDWORLD_PIXELS,
    FolderRun,
    FolderStep,
    as_number,
    capped_text,
    file_in,
    first_png_size,
    frame_ratio,
    nonblank,
    parse_response,
    pixel_calls,
    resized_frame,
    response_sections,
)

_MAX_PICKLE_BYTES = 4 << 30  # a task's episodes with raw screenshots stay well under this


class Pickled:
    """Stand-in for any object a pickle names: class path, arguments and state, nothing run.

    Attributes:
        module: The module the pickle named.
        qualname: The name it named in that module.
        args: The arguments the pickle passed to it.
        state: What the pickle set as the object's state.
        items: Values appended to it (list-like objects).
        mapping: Items set on it (dict-like objects).
    """

    module = ""
    qualname = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Pickled:  # noqa: D102
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items, obj.mapping = args, None, [], {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: ``__new__`` kept the arguments."""

    def __setstate__(self, state: Any) -> None:
        """Keep the state; never interpreted."""
        self.state = state

    def append(self, value: Any) -> None:
        """Keep an appended value."""
        self.items.append(value)

    def extend(self, values: Any) -> None:
        """Keep appended values."""
        self.items.extend(values)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Keep a set item."""
        self.mapping[key] = value


class InertUnpickler(pickle.Unpickler):
    """An unpickler that imports and calls nothing the file names.

    Plain containers, strings, numbers and bytes load as themselves. Every global the stream
    names (``numpy`` arrays, ``datetime``, an agent's dataclasses, and equally ``os.system``)
    becomes a fresh ``Pickled`` subclass that only records its arguments and state, so a hostile
    file cannot run code; numpy arrays and scalars are decoded from their recorded state by
    ``array_pixels`` and ``plain``.
    """

    def find_class(self, module: str, name: str) -> type:  # noqa: D102
        return type(name, (Pickled,), {"module": module, "qualname": name})

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise pickle.UnpicklingError("persistent ids are not supported")


def load_pickle_inert(data: bytes) -> Any:
    """Unpickle ``data`` with ``InertUnpickler``.

    Args:
        data: The pickle bytes.

    Returns:
        The object tree (unknown classes as ``Pickled``).

    Raises:
        pickle.UnpicklingError: The stream is malformed (also for truncated streams, via the
            ``EOFError``/``ValueError`` family the caller catches).
    """
    return InertUnpickler(io.BytesIO(data)).load()


def _dtype(obj: Any) -> str | None:
    if isinstance(obj, Pickled) and obj.qualname == "dtype" and obj.args:
        return str(obj.args[0])
    return None


_SCALARS = {"f8": "<d", "f4": "<f", "i8": "<q", "i4": "<i", "u1": "<B", "b1": "<?"}


def plain(value: Any) -> Any:
    """A numpy scalar recorded by ``InertUnpickler`` as its Python number; else the value."""
    if isinstance(value, Pickled) and value.qualname == "scalar" and len(value.args) == 2:
        code = _SCALARS.get((_dtype(value.args[0]) or "").lstrip("<>|="))
        raw = value.args[1]
        if code and isinstance(raw, bytes) and len(raw) == struct.calcsize(code):
            return struct.unpack(code, raw)[0]
    return value


def array_pixels(value: Any) -> tuple[int, int, str, bytes] | None:
    """``(width, height, mode, bytes)`` of a recorded uint8 ``(H, W, 3|4)`` numpy array."""
    if not (isinstance(value, Pickled) and value.qualname == "_reconstruct"):
        return None
    state = value.state
    if not (isinstance(state, tuple) and len(state) == 5):
        return None
    _version, shape, dtype, fortran, raw = state
    ok = isinstance(shape, tuple) and len(shape) == 3 and shape[2] in (3, 4) and not fortran
    if not ok or (_dtype(dtype) or "").lstrip("|") != "u1" or not isinstance(raw, bytes):
        return None
    height, width, channels = shape
    if len(raw) != height * width * channels or width <= 0 or height <= 0:
        return None
    return width, height, "RGB" if channels == 3 else "RGBA", raw


def read_androidworld(path: Path) -> list[FolderRun]:
    """Read one AndroidWorld checkpoint file (``{task}_{instance}.pkl.gz``) inertly.

    Per step the agent's text is ``response`` (ScaleCUA's ``<operation>/<action>``, read in the
    smart-resized frame, ``ANDROIDWORLD_PIXELS``) or ``action_output`` (``Reason: ... Action:
    {...}`` in device pixels). The screen before a step is ``raw_screenshot`` when the agent
    keeps it, else ``<file stem>/screenshot_{n}.png`` (n = 1.., the ScaleCUA agent's
    ``save_dir`` naming) next to the file.

    Args:
        path: The ``.pkl.gz`` file.

    Returns:
        One run per episode; an unreadable file gives one run with no steps and the reason
        in ``skipped``.
    """
    stem = path.name.removesuffix(".pkl.gz")
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(_MAX_PICKLE_BYTES + 1)
        if len(data) > _MAX_PICKLE_BYTES:
            raise ValueError("larger than the read limit")
        episodes = load_pickle_inert(data)
    except (OSError, EOFError, ValueError, pickle.UnpicklingError, zlib.error) as e:
        run = FolderRun("androidworld", path, stem, None, "android", None, [], finished=False)
        run.skipped.append((path.name, "unreadable_file", str(e)[:200]))
        return [run]
    if isinstance(episodes, dict):
        episodes = [episodes]
    if not isinstance(episodes, list):
        run = FolderRun("androidworld", path, stem, None, "android", None, [], finished=False)
        run.skipped.append((path.name, "not_episodes", type(episodes).__name__))
        return [run]
    return [_androidworld_episode(path, stem, k, ep) for k, ep in enumerate(episodes)]


def _step_lists(data: dict[str, Any]) -> tuple[int, dict[str, list[Any]]]:
    lists = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list)}
    steps = len(lists.get("step_number") or []) or max((len(v) for v in lists.values()), default=0)
    return steps, lists


def _androidworld_episode(path: Path, stem: str, k: int, ep: Any) -> FolderRun:
    where = f"{path.name}[{k}]"
    ep = ep if isinstance(ep, dict) else {}
    template = nonblank(ep.get("task_template")) or stem
    instance = plain(ep.get("instance_id"))
    task_id = f"{template}_{instance}" if isinstance(instance, int) else f"{stem}_{k}"
    run = FolderRun("androidworld", path, task_id, nonblank(ep.get("goal")), "android", None, [])
    run.model = nonblank(ep.get("agent_name"))
    success = as_number(plain(ep.get("is_successful")))
    data = ep.get("episode_data")
    if success is None or success != success or not isinstance(data, dict):  # NaN: it crashed
        run.finished = False
        info = str(ep.get("exception_info") or "no episode data")[:200]
        run.skipped.append((where, "episode_failed", info))
        return run
    run.score, run.outcome = success, "success" if success >= 1.0 else "failure"
    count, lists = _step_lists(data)

    def at(key: str, i: int) -> Any:
        values = lists.get(key) or []
        return values[i] if i < len(values) else None

    shots = [array_pixels(at("raw_screenshot", i)) for i in range(count)]
    files = [file_in(path.parent / stem, f"screenshot_{i + 1}.png") for i in range(count)]
    sized = next((s[:2] for s in shots if s), None) or first_png_size(files)
    run.screen = sized
    frame = resized_frame(sized, ANDROIDWORLD_PIXELS)
    for i in range(count):
        response, output = nonblank(at("response", i)), nonblank(at("action_output", i))
        think, operation, action = response_sections(response)
        if action is None and output is None:
            run.skipped.append((f"{where} step {i}", "no_action", "no <action> or action_output"))
            continue
        if action is not None:
            kw: dict[str, Any] = {"coord_space": "resized_px", "frame": frame} if frame else {}
            raw, fmt, ratio = action, "scalecua", frame_ratio(sized, frame)
        else:
            kw, raw, fmt, ratio = {}, output, "androidworld", (1.0, 1.0)
            think, operation = nonblank(at("action_reason", i)), nonblank(at("summary", i))
        actions, error = parse_response(raw, fmt, "android", sized, **kw)  # type: ignore[arg-type]
        run.steps.append(
            FolderStep(
                index=len(run.steps),
                source_ref=f"{where} step {i}",
                screenshot=files[i] if shots[i] is None else None,
                raw_action=raw,  # type: ignore[arg-type]
                actions=actions,
                parse_error=error,
                thought=capped_text(think),
                intent=nonblank(operation) or nonblank(at("operation", i)),
                calls=pixel_calls(raw, fmt, ratio) if actions is not None else None,  # type: ignore[arg-type]
                image=shots[i],
            )
        )
    return run
