"""Find the runs of one format under a results root and read them with ``hivig.run_folders``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from data_gen.runs._runtime_log import add_logged_intents
from hivig.run_folders import (
    FolderRun,
    detect_layout,
    read_androidlab,
    read_androidworld,
    read_osworld,
    read_trace,
    read_webarena,
    read_windowsagentarena,
)

FORMATS = ("osworld", "waa", "webarena-lite", "androidlab", "androidworld", "trace")
"""``--format`` values."""

BENCHMARKS = {
    "osworld": "osworld",
    "waa": "windowsagentarena",
    "webarena-lite": "webarena_lite_v2",
    "androidlab": "androidlab",
    "androidworld": "androidworld",
    "trace": "gateway_trace",
}
"""Benchmark name recorded per format (sidecars, meta.json keys)."""

# OSWorld and WAA write results/{action_space}/{observation_type}/{model}/{domain}/{example}.
_MODEL_DEPTH = 5


def _model_from_path(root: Path, folder: Path) -> str | None:
    parts = folder.relative_to(root).parts if folder.is_relative_to(root) else ()
    return parts[-3] if len(parts) >= _MODEL_DEPTH else None


def _example_instruction(examples: Path | None, folder: Path) -> str | None:
    """The task of an OSWorld/WAA result folder from ``examples/{domain}/{example_id}.json``.

    Their result folders do not store the instruction; the benchmark's example files do.
    """
    if examples is None:
        return None
    path = examples / folder.parent.name / f"{folder.name}.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = obj.get("instruction") if isinstance(obj, dict) else None
    return text if isinstance(text, str) and text.strip() else None


def _folders(root: Path, marker: str, layout: str) -> list[Path]:
    found = {p.parent for p in root.rglob(marker)}
    if marker == "trace.jsonl":
        found = {p.parent for p in found if p.name == "traces"}
    return sorted(f for f in found if detect_layout(f) == layout)


def discover(fmt: str, root: Path, examples: Path | None = None) -> Iterator[FolderRun]:
    """Every run of ``fmt`` under ``root``, in path order.

    Args:
        fmt: One of ``FORMATS``.
        root: The results root (or one task folder / file of that format).
        examples: OSWorld/WAA ``evaluation_examples/examples`` folder, for the instructions
            their result folders do not record.

    Yields:
        The runs as ``hivig.run_folders`` reads them (unreadable ones with no steps and the
        reason in ``skipped``).
    """
    if fmt in ("osworld", "waa"):
        layout = "osworld" if fmt == "osworld" else "windowsagentarena"
        reader = read_osworld if fmt == "osworld" else read_windowsagentarena
        for folder in _folders(root, "traj.jsonl", layout):
            run = reader(folder)
            if fmt == "osworld":
                # ScaleCUA's runner logs the agent's words beside traj.jsonl, not in it.
                run = add_logged_intents(run)
            run.model = run.model or _model_from_path(root, folder)
            run.task = run.task or _example_instruction(examples, folder)
            yield run
    elif fmt == "webarena-lite":
        for folder in _folders(root, "trajectory", "webarena"):
            yield read_webarena(folder)
    elif fmt == "androidlab":
        for folder in _folders(root, "trace.jsonl", "androidlab"):
            yield read_androidlab(folder)
    elif fmt == "androidworld":
        files = [root] if root.is_file() else sorted(root.rglob("*.pkl.gz"))
        for path in files:
            yield from read_androidworld(path)
    else:
        files = [root] if root.is_file() else sorted(root.rglob("*.jsonl"))
        for path in files:
            if path.parent.name == "traces" or root.is_file():
                yield read_trace(path)
