"""ingest-runs: result folders of each runner -> a ScaleCUA corpus that data_gen's ingest reads.

Every fixture folder is written here from the runner's documented on-disk fields; every
coordinate check compares the corpus against the runner's own conversion written out in the
test (never against the code under test).
"""

from __future__ import annotations

import gzip
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_gen.ingest import ingest
from data_gen.runs import FORMATS, ingest_runs, main
from hivig.actions import parse_agent_output, parse_osworld, parse_tool_calls, tool_call
from hivig.run_folders import InertUnpickler, load_pickle_inert, plain, read_androidworld
from hivig.trajectory import trajectory_id

OP = "<operation>\n{op}\n</operation>"


def png(path: Path, size: tuple[int, int], shade: int = 200) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (shade, shade, 255 - shade)).save(path)
    return path.name


def jsonl(path: Path, rows: list[object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def corpus_lines(out: Path) -> list[dict]:
    rows = []
    for ann in sorted((out / "annotations").glob("*.jsonl")):
        rows += [json.loads(x) for x in ann.read_text().splitlines()]
    return rows


def action_calls(row: dict) -> list[str]:
    gpt = row["conversations"][1]["value"]
    return gpt.split("<action>\n", 1)[1].split("\n</action>", 1)[0].splitlines()


def xy(line: str) -> tuple[float, float]:
    """``x``/``y`` keyword values of one written call (ScaleCUA's [0, 1] fractions)."""
    kw = dict(part.split("=") for part in line[line.index("(") + 1 : -1].split(", "))
    return float(kw["x"]), float(kw["y"])


def balanced(stats: dict) -> None:
    assert stats["in"] == stats["kept"] + sum(stats["dropped"].values())


def reingest(corpus: Path, tmp: Path) -> list[dict]:
    """data_gen's own ScaleCUA ingest on the written corpus: nothing may be dropped."""
    res = ingest(corpus, tmp / "ing", progress=False)
    assert res.stats["dropped"] == {}, res.stats
    assert res.report["skipped_entries"] == {}
    return [json.loads(x) for x in (tmp / "ing" / "trajectories.jsonl").read_text().splitlines()]


def sidecars(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "episodes").rglob("*.json"))]


def qwen_smart_resize(h: int, w: int, lo: int, hi: int, factor: int = 28) -> tuple[int, int]:
    """Qwen2.5-VL's smart_resize as the ScaleCUA runners call it (height, width)."""
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if hb * wb > hi:
        beta = math.sqrt(h * w / hi)
        hb, wb = math.floor(h / beta / factor) * factor, math.floor(w / beta / factor) * factor
    elif hb * wb < lo:
        beta = math.sqrt(lo / (h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb, wb


# ---------------------------------------------------------------------------------------------
# OSWorld: results/{action_space}/{observation}/{model}/{domain}/{example}/


def osworld_task(folder: Path, steps: list[tuple[str, str | None]], score: str | None) -> None:
    png(folder / "step_0.png", (1920, 1080), 10)
    rows: list[object] = []
    for n, (code, op) in enumerate(steps, 1):
        shot = png(folder / f"step_{n}_20250101@1000{n:02d}.png", (1920, 1080), 10 + n)
        rows.append(
            {
                "step_num": n,
                "action_timestamp": f"20250101@1000{n:02d}",
                "action": code,
                "response": f"<think>\nstep {n}\n</think>\n" + OP.format(op=op) if op else "",
                "reward": 0,
                "done": code == "DONE",
                "info": {},
                "screenshot_file": shot,
            }
        )
    jsonl(folder / "traj.jsonl", rows)
    (folder / "task.json").write_text(json.dumps({"instruction": "Open the report in Chrome"}))
    if score is not None:
        (folder / "result.txt").write_text(score + "\n")


def test_osworld_pixels_counts_quarantine_and_roundtrip(tmp_path: Path):
    root = tmp_path / "results" / "pyautogui" / "screenshot" / "qwen3-vl" / "chrome"
    good = [
        ("pyautogui.click(1234, 567)", "Click the Reports tab"),
        ("pyautogui.typewrite('q3 summary')", "Type the report name"),
        ("DONE", "The report is open"),
    ]
    osworld_task(root / "ok-task", good, "1.0")
    osworld_task(root / "cut-short", good[:2], None)  # no result.txt: the run never ended
    osworld_task(root / "no-shot", good, "0.0")
    (root / "no-shot" / "step_1_20250101@100001.png").unlink()  # the screen before step 2
    with open(root / "ok-task" / "traj.jsonl", "a") as f:
        f.write("{not json\n")
    out = tmp_path / "corpus"
    stats = ingest_runs("osworld", tmp_path / "results", out)
    balanced(stats)
    assert stats["in"] == 9 and stats["kept"] == 4
    assert stats["dropped"] == {
        "bad_json": 1,
        "unfinished_run": 2,
        "missing_screenshot": 1,
        "after_bad_step": 1,
    }
    reasons = {json.loads(x)["reason"] for x in (out / "quarantine.jsonl").read_text().splitlines()}
    assert reasons == set(stats["dropped"])
    rows = corpus_lines(out)
    assert len(rows) == 4
    # OSWorld executes pyautogui code in screen pixels: the fraction times the screen is it.
    first = [r for r in rows if "Reports tab" in r["conversations"][1]["value"]]
    assert len(first) == 2  # ok-task and the good prefix of no-shot
    x, y = xy(action_calls(first[0])[0])
    assert abs(x * 1920 - 1234) < 1e-9 and abs(y * 1080 - 567) < 1e-9
    trajs = reingest(out, tmp_path)
    (traj,) = [t for t in trajs if len(t["steps"]) == 3]
    expected = [parse_osworld(code, 1920, 1080) for code, _ in good]
    assert [s["actions"] for s in traj["steps"]] == _as_json(expected)
    assert traj["steps"][0]["actions"][0]["coordinate"] == [643, 525]  # round(1234/1920*1000)
    (side,) = [s for s in sidecars(out) if s["steps_written"] == 3]
    assert side["benchmark"] == "osworld" and side["outcome"] == "success"
    assert side["task_id"] == "ok-task" and side["agent_model"] == "qwen3-vl"
    assert side["trajectory_id"] == traj["id"] == trajectory_id(side["episode"], side["task"])


def _as_json(actions_lists: list, space: str = "computer_use") -> list[list[dict]]:
    """Grid actions in the ``arguments`` form trajectories.jsonl stores."""
    return [[tool_call(a, space)["arguments"] for a in acts] for acts in actions_lists]


# ---------------------------------------------------------------------------------------------
# WindowsAgentArena: traj.jsonl with a reset line, screenshot-step_N_ts.png, result.txt


def test_waa_folder(tmp_path: Path):
    folder = tmp_path / "results" / "notepad" / "task-7"
    rows: list[object] = [
        {"step_num": 0, "action": None, "screenshot": png(folder / "start.png", (1280, 800))}
    ]
    for n, (code, op) in enumerate(
        [("pyautogui.doubleClick(333, 444)", "Open the file"), ("FAIL", "It cannot be done")], 1
    ):
        rows.append(
            {
                "step_num": n,
                "action_timestamp": f"2025-01-01_10-00-0{n}",
                "action": code,
                "reward": 0,
                "done": code == "FAIL",
                "info": {},
                "screenshot": png(folder / f"screenshot-step_{n}_ts.png", (1280, 800), n),
                "agent_raw_response": OP.format(op=op) + f"\n<action>\n{code}\n</action>",
            }
        )
    jsonl(folder / "traj.jsonl", rows)
    (folder / "task.json").write_text(json.dumps({"instruction": "Open notes.txt"}))
    (folder / "result.txt").write_text("0.0\n")
    out = tmp_path / "corpus"
    stats = ingest_runs("waa", tmp_path / "results", out)
    balanced(stats)
    assert stats["kept"] == 2 and stats["dropped"] == {}
    row = corpus_lines(out)[0]
    x, y = xy(action_calls(row)[0])
    assert action_calls(row)[0].startswith("doubleClick(")
    assert abs(x * 1280 - 333) < 1e-9 and abs(y * 800 - 444) < 1e-9
    (traj,) = reingest(out, tmp_path)
    assert traj["outcome"] == "failure"
    (side,) = sidecars(out)
    assert side["benchmark"] == "windowsagentarena" and side["outcome"] == "failure"
    assert side["terminate_status"] == "failure"


# ---------------------------------------------------------------------------------------------
# AndroidLab: logs/evaluation/{name}/{task}_{ts}/traces/trace.jsonl + Screen/, results.jsonl


def test_androidlab_resized_frame_to_device(tmp_path: Path):
    run = tmp_path / "logs" / "evaluation" / "exp" / "clock_3_2025-01-01_10-00-00"
    responses = [
        ("click(x=490, y=1064)", "Tap the Alarm tab"),
        ("swipe(from_coord=[490, 1600], to_coord=[490, 600])", "Scroll the alarm list"),
        ("terminate(status='success')", "Done"),
    ]
    rows: list[object] = []
    for k, (act, op) in enumerate(responses):
        shot = png(run / "Screen" / f"screenshot-{k}-ts.png", (1440, 3120), 30 + k)
        rows.append(
            {
                "index": k,
                "image": f"/abs/device/run/Screen/{shot}",
                "xml": "",
                "current_response": f"<think>\nlook\n</think>\n{OP.format(op=op)}\n"
                f"<action>\n{act}\n</action>",
                "parsed_action": {"action": "Tap"},
                "target": "Set an alarm for 7:30",
            }
        )
    jsonl(run / "traces" / "trace.jsonl", rows)
    jsonl(run.parent / "results.jsonl", [{"task_id": "clock_3", "result": {"complete": True}}])
    out = tmp_path / "corpus"
    stats = ingest_runs("androidlab", tmp_path / "logs", out)
    balanced(stats)
    assert stats["kept"] == 3 and stats["dropped"] == {}
    # The runner: <action> pixels of the smart-resized frame times device / frame.
    fh, fw = qwen_smart_resize(3120, 1440, 3136, 2_109_744)
    assert (fw, fh) == (980, 2128)
    rows_out = corpus_lines(out)
    x, y = xy(action_calls(rows_out[0])[0])
    assert abs(x * 1440 - 490 * 1440 / fw) < 1e-6 and abs(y * 3120 - 1064 * 3120 / fh) < 1e-6
    swipe = action_calls(rows_out[1])[0]
    start = json.loads(swipe.split("from_coord=")[1].split("], ")[0] + "]")
    assert abs(start[1] * 3120 - 1600 * 3120 / fh) < 1e-6
    (traj,) = reingest(out, tmp_path)
    direct = parse_agent_output(
        responses[0][0],
        "scalecua",
        platform="android",
        width=1440,
        height=3120,
        coord_space="resized_px",
        frame=(fw, fh),
    )
    assert traj["steps"][0]["actions"] == _as_json([direct], "mobile_use")[0]
    assert traj["steps"][0]["actions"][0]["coordinate"] == [500, 500]  # 490/980, 1064/2128
    (side,) = sidecars(out)
    assert side["outcome"] == "success" and side["task_id"] == "clock_3"
    assert side["benchmark"] == "androidlab"


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2: results/{exp}/{task}/trajectory/{idx}.png, result.json, results.jsonl


def test_webarena_and_a_half_written_run(tmp_path: Path):
    exp = tmp_path / "results" / "exp1"
    task = exp / "7"
    for k in range(3):
        png(task / "trajectory" / f"{k}.png", (1280, 720), 50 + k)
    result = {
        "task_id": "7",
        "task": "Find the cheapest laptop",
        "thought": ["a", "b"],
        "operation": ["Click the search box", "Type laptop and submit"],
        "actions": ["click(x=644, y=91)", "write(message='laptop')\npress(keys='enter')"],
        "steps": 2,
    }
    (task / "result.json").write_text(json.dumps(result))
    half = exp / "8"
    png(half / "trajectory" / "0.png", (1280, 720))  # killed before result.json was written
    jsonl(exp / "results.jsonl", [{"id": 0, "metric": 0.0, "save_folder": "results/exp1/7"}])
    out = tmp_path / "corpus"
    stats = ingest_runs("webarena-lite", tmp_path / "results", out)
    balanced(stats)
    assert stats["kept"] == 2 and stats["dropped"] == {"unfinished_run": 1}
    q = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    assert q[0]["reason"] == "unfinished_run" and q[0]["file"].endswith("8")
    # The native agent: code x = <action> x / resized_w * screen_w (screen pixels).
    fh, fw = qwen_smart_resize(720, 1280, 3136, 2_007_040)
    x, y = xy(action_calls(corpus_lines(out)[0])[0])
    assert abs(x * 1280 - 644 / fw * 1280) < 1e-6 and abs(y * 720 - 91 / fh * 720) < 1e-6
    (traj,) = reingest(out, tmp_path)
    assert len(traj["steps"][1]["actions"]) == 2
    (side,) = sidecars(out)
    assert side["benchmark"] == "webarena_lite_v2" and side["outcome"] == "failure"
    assert side["score"] == 0.0


# ---------------------------------------------------------------------------------------------
# AndroidWorld: the checkpointer's gzipped pickle of episode dicts


class _Boom:
    """A pickle that would write a file if anything executed what it names."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (self.target, "pwned"))


def _episodes(screens: list[np.ndarray]) -> list[dict]:
    data = {
        "step_number": list(range(len(screens))),
        "raw_screenshot": screens,
        "response": [
            OP.format(op="Open the Clock app") + "\n<action>\nclick(x=476, y=1078)\n</action>",
            OP.format(op="Finish") + "\n<action>\nterminate(status='success')\n</action>",
        ],
    }
    return [
        {
            "goal": "Set a timer",
            "task_template": "ClockTimerEntry",
            "instance_id": 0,
            "is_successful": np.float64(1.0),
            "episode_data": data,
            "episode_length": len(screens),
            "agent_name": "scalecua_qwenvl",
            "run_time": 12.5,
        }
    ]


def test_androidworld_pickle_is_read_inertly(tmp_path: Path):
    root = tmp_path / "run_20250101T100000"
    root.mkdir()
    screens = [np.full((2400, 1080, 3), v, dtype=np.uint8) for v in (40, 90)]
    (root / "ClockTimerEntry_0.pkl.gz").write_bytes(gzip.compress(pickle.dumps(_episodes(screens))))
    (root / "Broken_0.pkl.gz").write_bytes(gzip.compress(pickle.dumps([{}]))[:20])  # truncated
    target = tmp_path / "pwned.txt"
    evil = [{"goal": "x", "task_template": "Evil", "episode_data": _Boom(target)}]
    (root / "Evil_0.pkl.gz").write_bytes(gzip.compress(pickle.dumps(evil)))
    out = tmp_path / "corpus"
    stats = ingest_runs("androidworld", root, out)
    assert not target.exists()  # nothing the file named was run
    balanced(stats)
    assert stats["kept"] == 2
    assert stats["dropped"] == {"unreadable_file": 1, "episode_failed": 1}
    # The ScaleCUA AndroidWorld agent: x / resized_w * device_w on the smart-resized frame.
    fh, fw = qwen_smart_resize(2400, 1080, 3136, 2_109_744)
    row = corpus_lines(out)[0]
    x, y = xy(action_calls(row)[0])
    assert abs(x * 1080 - 476 / fw * 1080) < 1e-6 and abs(y * 2400 - 1078 / fh * 2400) < 1e-6
    assert (row["width"], row["height"]) == (1080, 2400)
    (traj,) = reingest(out, tmp_path)
    assert traj["platform"] == "android" and len(traj["steps"]) == 2
    (side,) = sidecars(out)
    assert side["outcome"] == "success" and side["task_id"] == "ClockTimerEntry_0"
    assert side["agent_model"] == "scalecua_qwenvl" and side["benchmark"] == "androidworld"


def test_inert_unpickler_records_instead_of_running(tmp_path: Path):
    target = tmp_path / "x.txt"
    obj = load_pickle_inert(pickle.dumps({"a": _Boom(target), "n": np.float32(2.5)}))
    assert not target.exists()
    assert (obj["a"].module, obj["a"].qualname) == ("pathlib", "Path.write_text")
    assert obj["a"].args[0].qualname.endswith("Path")  # recorded, never constructed
    assert plain(obj["n"]) == 2.5 and issubclass(InertUnpickler, pickle.Unpickler)
    with pytest.raises(pickle.UnpicklingError):
        load_pickle_inert(b"not a pickle")
    runs = read_androidworld(tmp_path / "missing.pkl.gz")
    assert runs[0].skipped[0][1] == "unreadable_file"


# ---------------------------------------------------------------------------------------------
# Gateway traces (the gateway's own schema, written by the diagnose fixture writer)


def test_trace_verdicts_and_outcome(tmp_path: Path):
    from serve.diagnose.synthetic import make_case, write_trace

    trace = write_trace(make_case(3, "wrong_element"), tmp_path / "state")
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    lines[-1]["outcome"] = "failure"  # the runner reported the evaluation on close
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    critiques = [x for x in lines if x["event"] == "critique"]
    out = tmp_path / "corpus"
    stats = ingest_runs("trace", tmp_path / "state", out)
    balanced(stats)
    assert stats["kept"] >= 2, stats
    (side,) = sidecars(out)
    assert side["benchmark"] == "gateway_trace" and side["outcome"] == "failure"
    assert side["verdicts"] and {v["verdict"] for v in side["verdicts"]} <= {"good", "bad"}
    executed = {a["action_text"] for x in critiques for a in x["actions"]}
    assert all(v["source_ref"].startswith("trace step_idx") for v in side["verdicts"])
    assert len(side["verdicts"]) <= len(critiques) and executed
    # Grid tool calls are written as grid / 1000 and read back to the same grid actions.
    trajs = reingest(out, tmp_path)
    observes = [x for x in lines if x["event"] == "observe" and x.get("prev_action")]
    first = parse_tool_calls(observes[0]["prev_action"]["action_text"])
    assert trajs[0]["steps"][0]["actions"] == _as_json([first])[0]


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_user_mistakes_are_one_line_and_exit_2(tmp_path: Path, capsys):
    assert main(["--format", "bogus", "--root", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert main(["--format", "osworld", "--out", str(tmp_path / "o")]) == 2
    missing = tmp_path / "nope"
    assert main(["--format", "osworld", "--root", str(missing), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    args = ["--format", "trace", "--root", str(tmp_path / "full"), "--out", str(tmp_path / "full")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("ingest-runs: ") for e in err)
    assert "--format" in err[0] and "--root" in err[1] and "does not exist" in err[2]
    assert set(FORMATS) == {
        "osworld",
        "waa",
        "webarena-lite",
        "androidlab",
        "androidworld",
        "trace",
    }


def test_cli_runs_and_reports(tmp_path: Path, capsys):
    folder = tmp_path / "res" / "a" / "b" / "m" / "d" / "t1"
    osworld_task(folder, [("pyautogui.click(10, 20)", "Click it"), ("DONE", "Done")], "1.0")
    assert (
        main(["--format", "osworld", "--root", str(tmp_path / "res"), "--out", str(tmp_path / "o")])
        == 0
    )
    out = capsys.readouterr().out
    assert "2 in = 2 kept + 0 dropped" in out


def test_a_trace_the_gateway_wrote_yields_its_verdicts(tmp_path: Path):
    # The real gateway's critique events hold lists (``actions``, ``verdicts``); the synthetic
    # writer mirrors them, but this trace comes from the gateway itself.
    from tests.fakes.gateway import (
        CLICK,
        ScriptedBackend,
        b64,
        gateway_client,
        observe,
        screen,
        start_session,
    )

    with gateway_client(tmp_path, ScriptedBackend(verdict="bad")) as c:
        sid = start_session(c)
        for k in range(3):
            assert observe(c, sid, k, prev=CLICK if k else None).status_code == 200
            body = {"step_idx": k, "action": CLICK, "screenshot": b64(screen(seed=k))}
            assert c.post(f"/v1/sessions/{sid}/critique", json=body).status_code == 200
        assert c.delete(f"/v1/sessions/{sid}").status_code in (200, 204)
    from hivig.run_folders import read_trace

    run = read_trace(tmp_path / "state" / "traces" / f"{sid}.jsonl")
    judged = [v for step in run.steps for v in step.verdicts]
    assert len(run.steps) == 2 and len(judged) == 2  # the two executed clicks, each judged
    assert {v["verdict"] for v in judged} == {"bad"}


def test_a_runner_reports_the_outcome_when_it_closes_the_session(tmp_path: Path):
    from serve.app import create_app
    from serve.client import CriticClient
    from serve.server import BackgroundServer
    from tests.fakes.gateway import CLICK, ScriptedBackend, screen, serve_config

    app = create_app(serve_config(tmp_path / "state"), ScriptedBackend())
    with BackgroundServer(app) as srv, CriticClient(srv.url) as client:
        session = client.start("Open the settings", platform="ubuntu", screen=(320, 200))
        session.observe(0, screen(seed=0))
        session.critique(0, CLICK)
        session.observe(1, screen(seed=1), CLICK)
        with pytest.raises(ValueError, match="outcome"):
            session.close("maybe")
        assert session.close("failure")
        sid = session.session_id
    lines = (tmp_path / "state" / "traces" / f"{sid}.jsonl").read_text().splitlines()
    close = json.loads(lines[-1])
    assert close["event"] == "close" and (close["outcome"], close["by"]) == ("failure", "runner")
    out = tmp_path / "corpus"
    ingest_runs("trace", tmp_path / "state", out)
    (side,) = sidecars(out)
    assert side["outcome"] == "failure"
    # diagnose reads the same reported outcome.
    from serve.diagnose.loaders import load_trace

    assert load_trace(tmp_path / "state" / "traces" / f"{sid}.jsonl").outcome == "failure"


def test_a_close_with_an_unknown_outcome_is_422(tmp_path: Path):
    from tests.fakes.gateway import gateway_client, start_session

    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        r = c.delete(f"/v1/sessions/{sid}?outcome=maybe")
        assert r.status_code == 422
        assert c.delete(f"/v1/sessions/{sid}?outcome=success").status_code == 200
