"""Which layout a folder is, the task folders of a results root, and the reader for each."""

from __future__ import annotations

from pathlib import Path

from hivig.run_folders._base import LAYOUTS, FolderRun, read_jsonl_rows
from hivig.run_folders.androidlab import read_androidlab
from hivig.run_folders.osworld import read_osworld
from hivig.run_folders.waa import read_windowsagentarena
from hivig.run_folders.webarena import read_webarena


def detect_layout(path: Path) -> str | None:
    """The layout of one task folder (or of its record file), or ``None``.

    Args:
        path: A task folder, or its ``traj.jsonl`` / ``trace.jsonl`` / ``result.json``.

    Returns:
        ``osworld``, ``windowsagentarena``, ``androidlab``, ``webarena`` or ``None``.
    """
    if path.is_file():
        if path.name == "trace.jsonl" and path.parent.name == "traces":
            return "androidlab"
        if path.name == "result.json" and (path.parent / "trajectory").is_dir():
            return "webarena"
        if path.name == "traj.jsonl":
            return "windowsagentarena" if _is_waa(path) else "osworld"
        return None
    if (path / "traces" / "trace.jsonl").is_file():
        return "androidlab"
    if (path / "result.json").is_file() or (path / "trajectory" / "0.png").is_file():
        # result.json is written when the task ends: a run cut short has screenshots only.
        return "webarena" if (path / "trajectory").is_dir() else None
    if (path / "traj.jsonl").is_file():
        return "windowsagentarena" if _is_waa(path / "traj.jsonl") else "osworld"
    return None


def _is_waa(traj: Path) -> bool:
    """WindowsAgentArena names the screenshot ``screenshot`` (OSWorld: ``screenshot_file``)."""
    for _line, obj in read_jsonl_rows(traj, [])[:3]:
        if "screenshot_file" in obj:
            return False
        if "screenshot" in obj or "agent_raw_response" in obj:
            return True
    return False


def task_folders(root: Path) -> list[tuple[str, Path]]:
    """``(layout, folder)`` of every task folder directly under ``root`` (a results root).

    Args:
        root: A results folder holding one folder per task.

    Returns:
        The task folders in name order; empty when ``root`` holds none.
    """
    if not root.is_dir():
        return []
    found = []
    for child in sorted(root.iterdir()):
        layout = detect_layout(child) if child.is_dir() else None
        if layout is not None:
            found.append((layout, child))
    return found


def read_folder(path: Path) -> FolderRun:
    """Read one task folder of any layout.

    Args:
        path: The task folder (or its record file).

    Returns:
        The run.

    Raises:
        ValueError: The path is not a task folder of a known layout.
    """
    layout = detect_layout(path)
    folder = path
    if path.is_file():
        folder = path.parent.parent if layout == "androidlab" else path.parent
    if layout == "osworld":
        return read_osworld(folder)
    if layout == "windowsagentarena":
        return read_windowsagentarena(folder)
    if layout == "androidlab":
        return read_androidlab(folder)
    if layout == "webarena":
        return read_webarena(folder)
    raise ValueError(f"{path} is not a task folder of {', '.join(LAYOUTS)}")
