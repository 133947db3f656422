"""``diagnose`` on the result folders of WindowsAgentArena, AndroidLab and WebArenaLiteV2.

Each folder is written here from the fields the benchmark's own loop records (a reset line with a
null action, ``screenshot`` not ``screenshot_file``; ``traces/trace.jsonl`` with ``image``,
``xml``, ``parsed_action``, ``current_response`` and ``Screen/``; ``trajectory/{idx}.png``,
``result.json`` and the experiment's ``results.jsonl``), with a corrupt line, a missing
screenshot and a half-written run. Platform and screen must be the run's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from hivig.actions import Click, LeftClick, Terminate
from hivig.run_folders import detect_layout, png_size, read_folder, task_folders
from serve.diagnose import diagnose
from serve.diagnose.cli import main
from serve.diagnose.loaders import DiagnoseInputError, detect_kind, load_run
from serve.diagnose.synthetic import make_case


def _png(path: Path, size: tuple[int, int], label: str, box=None) -> Path:
    img = Image.new("RGB", size, (236, 238, 242))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, size[0], size[1] // 12), fill=(40, 90, 170))
    d.text((10, size[1] // 8), label, fill=(10, 10, 10))
    if box:
        d.rectangle(box, fill=(120, 180, 120), outline=(0, 0, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def _jsonl(path: Path, lines: list) -> None:
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")


def test_png_size_reads_the_header_only(tmp_path: Path):
    assert png_size(_png(tmp_path / "a.png", (1288, 812), "x")) == (1288, 812)
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 4)
    assert png_size(tmp_path / "b.png") is None
    assert png_size(tmp_path / "missing.png") is None


# ---------------------------------------------------------------------------------------------
# WindowsAgentArena: an injected failure written as its loop records it


def _waa_folder(folder: Path, seed: int) -> tuple[Path, int]:
    case = make_case(seed)
    folder.mkdir(parents=True)
    case.initial.save(folder / "screenshot-reset_20260101@100000.png")
    lines: list = [
        {
            "step_num": 0,
            "action_timestamp": "20260101@100000",
            "action": None,
            "screenshot": "screenshot-reset_20260101@100000.png",
        },
        '{"step_num": 1, "action": "pyautogui.cl',  # a line cut mid-write
    ]
    for n, step in enumerate(case.steps, start=1):
        ts = f"20260101@1001{n:02d}"
        name = f"screenshot-step_{n}_{ts}.png"
        step.after.save(folder / name)
        lines.append(
            {
                "step_num": n,
                "action_timestamp": ts,
                "action": step.code,
                "agent_raw_response": f"<think>Next.</think>\n<operation>{step.intent}"
                f"</operation>\n<action>{step.code}</action>",
                "reward": 0,
                "done": step.code in ("DONE", "FAIL"),
                "info": {},
                "screenshot": name,
            }
        )
    _jsonl(folder / "traj.jsonl", lines)
    (folder / "result.txt").write_text("0.0\n")
    (folder / "task.json").write_text(json.dumps({"instruction": case.task}))
    return folder, case.root_step


def test_windowsagentarena_folder(tmp_path: Path):
    folder, root = _waa_folder(tmp_path / "waa" / "notepad" / "task-7", 7)
    assert detect_layout(folder) == "windowsagentarena"
    assert detect_kind(folder) == detect_kind(folder / "traj.jsonl") == "windowsagentarena"
    run = load_run(folder)
    assert (run.kind, run.platform, run.screen) == ("windowsagentarena", "windows", (960, 540))
    assert run.outcome == "failure" and run.score == 0.0 and run.task
    assert {s.reason for s in run.skipped} == {"bad_json"}
    first = run.steps[0]
    assert first.before is not None and "reset" in first.before.name  # the reset screen
    assert first.after == run.steps[1].before and first.intent
    assert all(s.actions is not None for s in run.steps)
    result = diagnose(folder)
    assert result.root_cause_step == root == 3
    assert result.ranking[0]["step"] == root
    # An OSWorld folder (screenshot_file) is still read as OSWorld.
    os_folder = tmp_path / "osw"
    os_folder.mkdir()
    _png(os_folder / "step_1_a.png", (640, 360), "a")
    _jsonl(
        os_folder / "traj.jsonl",
        [{"step_num": 1, "action": "DONE", "screenshot_file": "step_1_a.png"}],
    )
    assert detect_kind(os_folder) == "osworld"


# ---------------------------------------------------------------------------------------------
# AndroidLab


LAB_SCREEN = (720, 1560)  # the policy saw the smart-resized frame 728x1568 (factor 28)


def _lab_step(folder: Path, k: int, response: str, parsed: dict, image: str | None) -> dict:
    return {
        "trace_id": folder.name,
        "index": k,
        "prompt": "** screenshot **",
        "image": image,
        "xml": f"/data/logs/{folder.name}/xml/{k}.xml",
        "ac_xml": None,
        "current_activity": "com.android.contacts/.Main",
        "window": list(LAB_SCREEN),
        "target": "Call Ada Lovelace",
        "parsed_action": parsed,
        "current_response": response,
    }


def _lab_folder(root: Path) -> Path:
    folder = root / "contacts_3_2026-01-01_10-00-00"
    screen_dir = folder / "Screen"
    search = (100, 200, 600, 260)
    names = [f"screenshot-{k}-1767261600.{k}-before.png" for k in range(5)]
    _png(screen_dir / names[0], LAB_SCREEN, "Contacts", box=search)
    _png(screen_dir / names[1], LAB_SCREEN, "Search open", box=(100, 300, 600, 360))
    for k in (2, 3):
        (screen_dir / names[k]).write_bytes((screen_dir / names[1]).read_bytes())
    # names[4] is never written: a missing screenshot.
    calls = [
        (
            "Open search",
            "click(x=354, y=231)",
            {"action": "Tap", "kwargs": {"element": [354, 231]}},
        ),
        ("Type the name", 'write(message="Ada")', {"action": "Type", "kwargs": {"text": "Ada"}}),
        ("Open the result", "click(x=680, y=1480)", {"action": "Tap", "kwargs": {}}),
        ("Open it again", "click(x=681, y=1481)", {"action": "Tap", "kwargs": {}}),
        ("Give up", 'terminate(status="failure")', {"action": "finish", "kwargs": {}}),
    ]
    lines: list = []
    for k, (op, call, parsed) in enumerate(calls):
        response = f"<think>Step {k}.</think>\n<operation>{op}</operation>\n<action>{call}</action>"
        lines.append(
            _lab_step(folder, k, response, parsed, f"/data/logs/{folder.name}/Screen/{names[k]}")
        )
        if k == 1:
            lines.append("{not json")
    (folder / "traces").mkdir(parents=True)
    _jsonl(folder / "traces" / "trace.jsonl", lines)
    _jsonl(root / "results.jsonl", [{"task_id": "contacts_3", "result": {"complete": False}}])
    return folder


def test_androidlab_folder(tmp_path: Path):
    folder = _lab_folder(tmp_path / "logs" / "evaluation" / "scalecua")
    assert detect_kind(folder) == detect_kind(folder / "traces" / "trace.jsonl") == "androidlab"
    run = load_run(folder)
    assert (run.platform, run.screen, run.outcome) == ("android", LAB_SCREEN, "failure")
    assert run.task == "Call Ada Lovelace" and {s.reason for s in run.skipped} == {"bad_json"}
    # click(x=354, y=231) in the 728x1568 frame is the search field's centre on the grid.
    assert run.steps[0].actions == [Click((486, 147))] and run.steps[0].intent == "Open search"
    assert run.steps[-1].actions == [Terminate("failure")]
    assert run.steps[-1].before is None and any("not in Screen/" in n for n in run.notes)
    result = diagnose(folder)
    assert result.root_cause_step == 3
    assert result.to_json()["input"]["platform"] == "android"


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2


def _web_task(exp: Path, task: str, *, finished: bool = True) -> Path:
    folder = exp / task
    shots = folder / "trajectory"
    size = (1280, 720)
    _png(shots / "0.png", size, "Shop", box=(500, 300, 780, 420))
    _png(shots / "1.png", size, "Product page", box=(100, 600, 400, 680))
    (shots / "2.png").write_bytes((shots / "1.png").read_bytes())
    # 3.png missing.
    if finished:
        result = {
            "task_id": task,
            "task": "Add the laptop to the cart",
            "final_result_response": "",
            "thought": ["Open it.", "Add it.", "Again.", "Stop."],
            "operation": ["Open the product", "Click add", "Click add again", "Give up"],
            "actions": [
                "click(x=644, y=364)",
                "click(x=1200, y=50)",
                "click(x=1201, y=51)",
                'terminate(status="failure")',
            ],
            "steps": 4,
        }
        (folder / "result.json").write_text(json.dumps(result))
    return folder


def test_webarena_folder_and_results_root(tmp_path: Path, capsys):
    exp = tmp_path / "results" / "exp1"
    folder = _web_task(exp, "7")
    _web_task(exp, "8", finished=False)  # a half-written run: screenshots, no result.json
    _jsonl(exp / "results.jsonl", [{"id": 0, "metric": 0, "save_folder": "results/exp1/7"}, "{x"])
    assert detect_kind(folder) == detect_kind(folder / "result.json") == "webarena"
    assert [f.name for _k, f in task_folders(exp)] == ["7", "8"]
    run = load_run(folder)
    assert (run.platform, run.screen, run.outcome, run.score) == ("web", (1280, 720), "failure", 0)
    assert run.steps[0].actions == [LeftClick((500, 500))] and run.steps[0].think == "Open it."
    assert run.steps[2].after is None  # 3.png was never written
    assert read_folder(folder).layout == "webarena"

    out = tmp_path / "out"
    assert main([str(folder), "--out", str(out)]) == 0
    report = json.loads((out / "diagnosis.json").read_text())
    assert report["input"]["platform"] == "web"
    assert report["input"]["screen"] == {"w": 1280, "h": 720}
    assert report["root_cause_step"] == 2
    capsys.readouterr()

    # A half-written run and a results root are user-facing one-line errors (exit 2).
    assert main([str(exp / "8"), "--out", str(tmp_path / "o8")]) == 2
    assert "no usable step" in capsys.readouterr().err
    assert main([str(exp), "--out", str(tmp_path / "oo")]) == 2
    err = capsys.readouterr().err
    assert "pass one task folder" in err and "Traceback" not in err
    with pytest.raises(DiagnoseInputError, match="2 task folders"):
        detect_kind(exp)
