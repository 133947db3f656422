"""diagnose: successful runs, every executed step, the demo's own episode, disabled controls, and
an unwritable output folder."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from serve.diagnose import diagnose
from serve.diagnose.cli import main
from serve.diagnose.loaders import load_run, load_trace
from serve.diagnose.screens import Screens
from serve.diagnose.signals import guess_error, rank_candidates
from serve.diagnose.synthetic import make_case, write_osworld

# ---------------------------------------------------------------------------------------------
# A run that succeeded has no root cause


def test_a_successful_run_gets_no_root_cause_step(tmp_path: Path, capsys):
    folder = write_osworld(make_case(3, "wrong_element"), tmp_path / "task")
    (folder / "result.txt").write_text("1.0\n")  # the evaluator scored it a success
    result = diagnose(folder, out_dir=tmp_path / "out")
    assert result.root_cause_step is None and result.method == "run_succeeded"
    assert result.error["l2"] is None and result.evidence == []
    assert any("succeeded" in n for n in result.notes)
    assert result.ranking  # the mistakes it recovered from are still shown
    assert "none: the run succeeded" in (tmp_path / "out" / "diagnosis.html").read_text()
    assert main([str(folder), "--out", str(tmp_path / "cli")]) == 0
    assert "the run succeeded: no root-cause step" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2: a step whose response held no <action> still ran (the runner's fallback wait)


def _shot(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (1280, 720), (shade, shade, 240)).save(path)


def test_webarena_lists_every_executed_step(tmp_path: Path):
    folder = tmp_path / "results" / "exp" / "12"
    actions = [f"click(x={100 + 40 * k}, y=300)" for k in range(8)]
    actions[3] = ""  # the agent wrote no <action>: the runner executed its fallback wait
    for k in range(len(actions) + 1):
        _shot(folder / "trajectory" / f"{k}.png", 20 * k)
    result = {
        "task_id": "12",
        "task": "Open the orders page",
        "thought": ["t"] * 8,
        "operation": [f"op {k}" for k in range(8)],
        "actions": actions,
        "steps": 8,
    }
    (folder / "result.json").write_text(json.dumps(result))
    run = load_run(folder)
    assert len(run.steps) == 8 and all(s.executed for s in run.steps)
    assert run.steps[3].actions is None and run.steps[3].parse_error.startswith("no_action")
    assert [s.intent for s in run.steps] == [f"op {k}" for k in range(8)]
    doc = diagnose(folder).to_json()
    assert len(doc["steps"]) == doc["input"]["num_steps"] == 8


# ---------------------------------------------------------------------------------------------
# The demo's own episode through a real gateway: R3 re-creates the session in the same trace


def _demo_trace(tmp_path: Path) -> tuple[Path, bool]:
    from serve.app import create_app
    from serve.demo.desk import SyntheticDesk
    from serve.demo.episode import run_episode
    from serve.server import BackgroundServer
    from tests.fakes.gateway import ScriptedBackend, serve_config

    state = tmp_path / "state"
    app = create_app(serve_config(state), ScriptedBackend())
    with BackgroundServer(app) as srv, SyntheticDesk() as env:
        result = run_episode(env, srv.url)
    return state / "traces" / f"{result.session_id}.jsonl", result.success


def test_the_demo_episode_is_read_whole_and_its_outcome_is_the_environments(tmp_path: Path):
    trace, success = _demo_trace(tmp_path)
    assert success
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    assert sum(e["event"] == "session" for e in events) == 2  # R3's Restore re-created it
    # The episode closed its session with the environment's outcome.
    assert (events[-1]["event"], events[-1].get("outcome")) == ("close", "success")
    run = load_trace(trace)
    assert [s.intent for s in run.steps] == [
        "Type 'dark mode' into the search field",
        "Click Publish to apply the new theme",
        "Click Publish to apply the new theme",
        "Open the Settings dialog",
        "Tick the Dark mode checkbox",
        "Save the settings",
        "Dark mode is on; the task is done",
    ]
    assert run.outcome == "success"
    result = diagnose(trace)
    assert result.root_cause_step is None and result.method == "run_succeeded"
    assert not any("assumed" in n for n in result.notes)
    assert not any(s["name"] == "premature_done" for c in result.ranking for s in c["signals"])
    # The first mistake it recovered from is the injected one: typing with no field focused.
    assert result.ranking[0]["step"] == 1

    # Without the reported outcome the run is diagnosed as a failure: the root cause is still
    # the injected step, and the disabled Publish button is not "no control".
    lines = [x for x in trace.read_text().splitlines() if '"outcome"' not in x]
    unreported = trace.with_name("unreported.jsonl")
    unreported.write_text("\n".join(lines) + "\n")
    failed = diagnose(unreported)
    assert failed.root_cause_step == 1
    assert failed.error["hivig_dimension"] == "Procedural Prerequisite Neglect"
    run = load_trace(unreported)
    ranked, _ = rank_candidates(run, Screens())
    publish = next(c for c in ranked if c.step == 2)
    dim, _l2, why = guess_error(run.steps[1], publish)
    assert dim is not None and dim.key != "grounding_spatial_error", why


# ---------------------------------------------------------------------------------------------
# A no-effect click on a disabled control is not "a point that hits no control"


def _click_loop(folder: Path, point: tuple[int, int]) -> Path:
    """An OSWorld folder: a page with a greyed-out button, clicked twice to no effect."""
    folder.mkdir(parents=True)
    img = Image.new("RGB", (1280, 800), (246, 247, 249))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, 1280, 60), fill=(35, 60, 110))
    d.rounded_rectangle((440, 160, 560, 200), radius=6, fill=(205, 208, 214))
    d.text((470, 175), "Publish", fill=(150, 150, 150))
    img.save(folder / "step_0.png")
    codes = [f"pyautogui.click({point[0]}, {point[1]})"] * 2 + ["FAIL"]
    rows = []
    for n, code in enumerate(codes, start=1):
        img.save(folder / f"step_{n}_20250101@1000{n:02d}.png")
        rows.append(
            {
                "step_num": n,
                "action_timestamp": f"20250101@1000{n:02d}",
                "action": code,
                "reward": 0,
                "done": code == "FAIL",
                "info": {},
                "screenshot_file": f"step_{n}_20250101@1000{n:02d}.png",
            }  # fmt: skip
        )
    (folder / "traj.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "result.txt").write_text("0.0\n")
    return folder


def test_a_no_effect_click_on_a_disabled_button_is_not_a_grounding_miss(tmp_path: Path):
    on_button = diagnose(_click_loop(tmp_path / "button", (500, 180)))
    assert on_button.root_cause_step == 1
    assert on_button.error["hivig_dimension"] != "Grounding/Spatial Error"
    assert "did not respond" in on_button.correction
    assert "hits no control" not in on_button.correction
    # The same loop on open page background is a point that hits no control.
    on_nothing = diagnose(_click_loop(tmp_path / "empty", (900, 500)))
    assert on_nothing.root_cause_step == 1
    assert on_nothing.error["hivig_dimension"] == "Grounding/Spatial Error"
    assert "hits no control" in on_nothing.correction


# ---------------------------------------------------------------------------------------------
# An unwritable --out is one line and exit 2


def _writable(folder: Path) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` made read-only: by its mode, or (as root, which modes do not stop) immutable."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    immutable = False
    try:
        if _writable(folder):
            got = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
            immutable = got.returncode == 0
        if _writable(folder):
            pytest.skip("no way to make a folder read-only here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=False)
        folder.chmod(0o755)


@pytest.mark.parametrize("sub", ["", "inner"])
def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path: Path, capsys, sub: str):
    folder = write_osworld(make_case(1), tmp_path / "task")
    locked = tmp_path / "locked"
    with _read_only(locked):
        out = locked / sub if sub else locked
        assert main([str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--out" in err and "not writable" in err
