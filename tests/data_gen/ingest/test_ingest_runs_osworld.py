"""ingest-runs on a ScaleCUA OSWorld result folder (its agent's own runner, not the stock one).

ScaleCUA's OSWorld runner writes ``traj.jsonl`` lines without the agent's response
(``step_num``, ``action_timestamp``, ``action``, ``reward``, ``done``, ``info``,
``screenshot_file``), ``step_0.png`` before the first action, ``step_{n}_{ts}.png`` after each
action, ``result.txt``, and a ``runtime.log`` into which its agent logs, per prediction, the
whole response (``RESPONE: <repr>``), the ``<action>`` lines (``PARSED ACTION: <repr>``) and the
pyautogui code it returned (``pyautogui code(s): <repr>``). The task instruction lives in the
benchmark's ``evaluation_examples/examples/{domain}/{id}.json``. The fixture below writes that
shape: the log through ``logging`` with a bare ``FileHandler``, as the runner's does.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from data_gen.runs import ingest_runs
from hivig.run_folders import parse_osworld_action
from tests.data_gen.ingest.test_ingest_runs import (
    _as_json,
    action_calls,
    balanced,
    corpus_lines,
    png,
    qwen_smart_resize,
    reingest,
    sidecars,
    xy,
)

SCREEN = (1920, 1080)
# The agent points in the smart-resized frame; the runner scales to the screen with "{:.4f}".
FRAME_H, FRAME_W = qwen_smart_resize(SCREEN[1], SCREEN[0], 3136, 2109744)
TASK = "Open the Q3 report in Chrome"


def _px(x: int, y: int) -> tuple[str, str]:
    sx = f"{float(x) / FRAME_W * SCREEN[0]:.4f}"
    sy = f"{float(y) / FRAME_H * SCREEN[1]:.4f}"
    return sx, sy


def _click(x: int, y: int) -> str:
    sx, sy = _px(x, y)
    return f'pyautogui.click(x={sx}, y={sy}, clicks=1, button="left")'


# (operation, <action> lines, the pyautogui codes the agent returns for them)
PREDICTIONS = [
    ("Click the Reports tab", ["click(x=1240, y=580)"], [_click(1240, 580)]),
    (
        "Type the report name and confirm",
        ["write(message='q3 summary')", "press(keys='enter')"],
        ['pyautogui.write("q3 summary")', "pyautogui.press('enter')"],
    ),
    ("The report is open", ["terminate(status='success')"], ["DONE"]),
]


def _response(n: int, operation: str, lines: list[str]) -> str:
    action = "\n".join(lines)
    return (
        f"<think>\nStep {n}: the screen shows what I need.\n</think>\n"
        f"<operation>\n{operation}\n</operation>\n<action>\n{action}\n</action>"
    )


def scalecua_osworld_task(
    folder: Path, predictions: list[tuple[str, list[str], list[str]]], score: str, log: bool = True
) -> None:
    """One example's result folder as ScaleCUA's ``run_single_example`` leaves it."""
    png(folder / "step_0.png", SCREEN, 10)
    logger = logging.getLogger(f"desktopenv.example.{folder.name}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(folder / "runtime.log")
    if log:
        logger.addHandler(handler)
    rows = []
    step_idx = 0
    try:
        for operation, lines, codes in predictions:
            prediction = _response(step_idx + 1, operation, lines)
            for line in lines:
                logger.info("************************ Parsed Action ************************")
                logger.info({"name": line.split("(")[0], "parameters": {}})
            logger.info("RESPONE: %s", repr(prediction))
            logger.info("PARSED ACTION: %s", repr(lines))
            logger.info("pyautogui code(s): %s", repr(codes))
            for code in codes:
                ts = f"20250101@1000{len(rows):02d}"
                shot = f"step_{step_idx + 1}_{ts}.png"
                png(folder / shot, SCREEN, 20 + len(rows))
                done = code in ("DONE", "FAIL")
                rows.append(
                    {
                        "step_num": step_idx + 1,
                        "action_timestamp": ts,
                        "action": code,
                        "reward": 0,
                        "done": done,
                        "info": {},
                        "screenshot_file": shot,
                    }
                )
                if done:
                    break
            step_idx += 1
    finally:
        logger.removeHandler(handler)
        handler.close()
    (folder / "traj.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "result.txt").write_text(f"{score}\n")


def _examples(tmp: Path, domain: str, ids: list[str]) -> Path:
    examples = tmp / "evaluation_examples" / "examples"
    for i in ids:
        path = examples / domain / f"{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"id": i, "instruction": TASK}))
    return examples


def _root(tmp: Path) -> Path:
    return tmp / "results" / "pyautogui" / "screenshot" / "scalecua-7b" / "chrome"


def test_a_scalecua_osworld_folder_keeps_its_steps(tmp_path: Path):
    task_id = "bb5e4c0d-f964-439c-97b6-bdb9747de3f4"
    scalecua_osworld_task(_root(tmp_path) / task_id, PREDICTIONS, "1.0")
    out = tmp_path / "corpus"
    stats = ingest_runs(
        "osworld", tmp_path / "results", out, examples=_examples(tmp_path, "chrome", [task_id])
    )
    balanced(stats)
    # Four executed lines (one prediction held two actions), every one kept.
    assert (stats["in"], stats["kept"], stats["dropped"]) == (4, 4, {}), stats
    rows = corpus_lines(out)
    gpts = [r["conversations"][1]["value"] for r in rows]
    ops = [g.split("<operation>\n", 1)[1].split("\n</operation>", 1)[0] for g in gpts]
    # Each executed line carries the operation of the prediction that produced it.
    assert ops == [
        "Click the Reports tab",
        "Type the report name and confirm",
        "Type the report name and confirm",
        "The report is open",
    ]
    assert all("<think>\nStep " in g for g in gpts)  # the agent's reasoning, from the log
    # The pixel the runner clicked comes back from the written fraction.
    x, y = xy(action_calls(rows[0])[0])
    sx, sy = _px(1240, 580)
    assert abs(x * SCREEN[0] - float(sx)) < 1e-9 and abs(y * SCREEN[1] - float(sy)) < 1e-9
    (traj,) = reingest(out, tmp_path)
    codes = [c for _, _, cs in PREDICTIONS for c in cs]
    assert [s["actions"] for s in traj["steps"]] == _as_json(
        [parse_osworld_action(c, *SCREEN) for c in codes]
    )
    (side,) = sidecars(out)
    assert side["outcome"] == "success" and side["agent_model"] == "scalecua-7b"
    assert side["task"] == TASK and side["steps_written"] == 4


def test_a_log_that_disagrees_with_the_executed_code_gives_no_intent(tmp_path: Path):
    # A response whose logged code is not what traj.jsonl executed is not the step's: the step
    # is not given its words (quarantined no_intent), the prefix that matches is kept.
    task_id = "mismatch"
    save = ("Click Save", ["click(x=10, y=10)"], [_click(10, 10)])
    preds = [PREDICTIONS[0], save, PREDICTIONS[2]]
    folder = _root(tmp_path) / task_id
    scalecua_osworld_task(folder, preds, "0.0")
    rows = [json.loads(x) for x in (folder / "traj.jsonl").read_text().splitlines()]
    rows[1]["action"] = _click(30, 30)  # executed: not the logged code
    (folder / "traj.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = ingest_runs(
        "osworld",
        tmp_path / "results",
        tmp_path / "corpus",
        examples=_examples(tmp_path, "chrome", [task_id]),
    )
    balanced(stats)
    assert stats["kept"] == 1
    assert stats["dropped"] == {"no_intent": 1, "after_bad_step": 1}, stats


def test_the_step_cap_fail_and_a_client_error_done_carry_no_words(tmp_path: Path):
    # At the step cap the runner replaces the agent's code by FAIL (the response said
    # something else); after a client error it executes DONE with no response logged.
    preds = [PREDICTIONS[0], ("Click Save", ["click(x=10, y=10)"], ["FAIL"])]
    scalecua_osworld_task(_root(tmp_path) / "cap", preds, "0.0")
    client_error = _root(tmp_path) / "client-error"
    scalecua_osworld_task(client_error, PREDICTIONS[:1], "0.0")
    with open(client_error / "traj.jsonl", "a") as f:
        png(client_error / "step_2_20250101@100099.png", SCREEN, 99)
        row = {"step_num": 2, "action_timestamp": "20250101@100099", "action": "DONE",
               "reward": 0, "done": True, "info": {},
               "screenshot_file": "step_2_20250101@100099.png"}  # fmt: skip
        f.write(json.dumps(row) + "\n")
    stats = ingest_runs(
        "osworld",
        tmp_path / "results",
        tmp_path / "corpus",
        examples=_examples(tmp_path, "chrome", ["cap", "client-error"]),
    )
    balanced(stats)
    assert stats["kept"] == 2 and stats["dropped"] == {"no_intent": 2}, stats


def test_a_folder_without_runtime_log_is_still_no_intent(tmp_path: Path):
    scalecua_osworld_task(_root(tmp_path) / "nolog", PREDICTIONS, "1.0", log=False)
    (_root(tmp_path) / "nolog" / "runtime.log").unlink()
    stats = ingest_runs(
        "osworld",
        tmp_path / "results",
        tmp_path / "corpus",
        examples=_examples(tmp_path, "chrome", ["nolog"]),
    )
    assert stats["kept"] == 0 and stats["dropped"] == {"no_intent": 1, "after_bad_step": 3}
