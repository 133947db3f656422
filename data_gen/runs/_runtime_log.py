"""The agent's words for an OSWorld result folder whose ``traj.jsonl`` records none.

ScaleCUA's OSWorld runner writes ``traj.jsonl`` lines without the agent's response, so no
step has the ``<operation>`` the published layout requires. Its agent logs each prediction to
the example's ``runtime.log`` instead, in three lines (a bare ``FileHandler``, so the message
alone, or after whatever prefix a formatter adds)::

    RESPONE: '<think>..</think>\\n<operation>..</operation>\\n<action>..</action>'
    PARSED ACTION: ['click(x=.., y=..)']
    pyautogui code(s): ['pyautogui.click(x=.., y=.., clicks=1, button="left")']

The third line is the code the runner then executes, one ``traj.jsonl`` line per entry, so a
response belongs to the next steps exactly when their recorded ``action`` texts equal its code
list (the runner stops inside a list at ``done``, so the last one may match a prefix). The first
step that matches no response, and every step after it, keeps no intent: it is quarantined
(``no_intent``) rather than given words that were not its own.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hivig.actions import first_block
from hivig.run_folders import FolderRun, FolderStep

LOG_NAME = "runtime.log"
_RESPONSE = "RESPONE: "  # the agent's own spelling
_CODES = "pyautogui code(s): "
_STEP_CAP = "FAIL"
"""The runner's code when the agent reached its step cap: it replaces whatever the response
said, so that response's words do not describe the step."""


@dataclass(frozen=True)
class _Prediction:
    think: str | None
    operation: str | None
    codes: list[str]


def _literal(line: str, marker: str) -> object:
    text = line[line.index(marker) + len(marker) :].strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _block(response: str, tag: str) -> str | None:
    got = first_block(response, tag)
    return got.strip() if got and got.strip() else None


def read_predictions(log: Path) -> list[_Prediction]:
    """The predictions a ``runtime.log`` records, in order (a response without its code line,
    or lines that do not read as Python literals, are left out)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out: list[_Prediction] = []
    response: str | None = None
    for line in text.splitlines():
        if _RESPONSE in line:
            got = _literal(line, _RESPONSE)
            response = got if isinstance(got, str) else None
        elif _CODES in line and response is not None:
            codes = _literal(line, _CODES)
            if isinstance(codes, list) and codes and all(isinstance(c, str) for c in codes):
                out.append(
                    _Prediction(_block(response, "think"), _block(response, "operation"), codes)
                )
            response = None
    return out


def _with_words(step: FolderStep, prediction: _Prediction) -> FolderStep:
    if prediction.codes == [_STEP_CAP]:
        return step
    return dataclasses.replace(
        step,
        intent=step.intent or prediction.operation,
        thought=step.thought or prediction.think,
    )


def add_logged_intents(run: FolderRun) -> FolderRun:
    """``run`` with each step's intent and thought from the folder's ``runtime.log``.

    Steps that already record an intent, and runs without a log, are left as they are.
    """
    log = run.folder / LOG_NAME
    if not run.steps or all(s.intent for s in run.steps) or not log.is_file():
        return run
    steps = list(run.steps)
    k = 0
    for prediction in read_predictions(log):
        chunk = [s.raw_action for s in steps[k : k + len(prediction.codes)]]
        if not chunk or chunk != prediction.codes[: len(chunk)]:
            break
        for j in range(k, k + len(chunk)):
            steps[j] = _with_words(steps[j], prediction)
        k += len(chunk)
    run.steps = steps
    run.notes.append(f"intents of {k} of {len(steps)} step(s) read from {LOG_NAME}")
    return run
