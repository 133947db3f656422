"""Root-cause diagnosis: loaders, cheap-signal ranking, critic inspection, outputs and CLI."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from hivig.actions import LeftClick, Terminate, Type
from hivig.backends import Generation, Sampling, SyncBackend, Usage
from hivig.config import FrameConfig
from hivig.contracts import render_critique_target
from hivig.messages import ChatMessage, ImagePart
from hivig.trajectory import Source, Step, Trajectory, write_trajectories
from serve.diagnose import (
    DiagnoseInputError,
    add_cli,
    detect_kind,
    diagnose,
    diagnose_async,
    load_run,
    main,
)
from serve.diagnose.cli import parse_backend_spec
from serve.diagnose.loaders import strip_thought_strings
from serve.diagnose.synthetic import KINDS, make_case, write_osworld, write_trace

ROOT = Path(__file__).resolve().parents[3]


def _screen(path: Path, label: str, *, size=(640, 360), box=None) -> Path:
    """A small flat screen with a label (and an optional highlighted box)."""
    img = Image.new("RGB", size, (236, 238, 242))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, size[0], 24), fill=(40, 90, 170))
    d.text((10, 40), label, fill=(10, 10, 10))
    if box:
        d.rectangle(box, fill=(120, 180, 120), outline=(0, 0, 0))
    img.save(path)
    return path


# ---------------------------------------------------------------------------------------------
# An OSWorld folder written by hand, as real runs write it


@pytest.fixture
def osworld_folder(tmp_path: Path) -> Path:
    d = tmp_path / "chrome" / "task-1"
    d.mkdir(parents=True)
    shots = {
        1: _screen(d / "step_1_20260101@100001.png", "Search page", box=(100, 100, 300, 140)),
        2: _screen(d / "step_2_20260101@100005.png", "Results page", box=(100, 200, 300, 240)),
    }
    # Steps 3 and 4 click a dead spot: the screen stays the results page (same pixels).
    for n in (3, 4, 5):
        (d / f"step_{n}_20260101@10001{n}.png").write_bytes(shots[2].read_bytes())
    lines = [
        {
            "step_num": 1,
            "action_timestamp": "20260101@100001",
            "action": '"""I will open the search box."""\npyautogui.click(200, 120)',
            "response": "Thought: open the search box",
            "reward": 0,
            "done": False,
            "info": {},
            "screenshot_file": "step_1_20260101@100001.png",
        },
        "this line is not json {",
        {"Error": "chrome/task-1 - Time limit exceeded"},
        {
            "step_num": 2,
            "action_timestamp": "20260101@100005",
            "action": "import pyautogui\npyautogui.typewrite('weather'); pyautogui.press('enter')",
            "response": {"thought": "Search for the weather", "intent": "Type the query"},
            "reward": 0,
            "done": False,
            "info": {},
            "screenshot_file": "step_2_20260101@100005.png",
        },
        {
            "step_num": 3,
            "action_timestamp": "20260101@100013",
            "action": "pyautogui.click(600, 340)",
            "response": {"thought": "Open the first result"},
            "reward": 0,
            "done": False,
            "info": {},
            "screenshot_file": "step_3_20260101@100013.png",
        },
        {
            "step_num": 4,
            "action_timestamp": "20260101@100014",
            "action": "pyautogui.click(601, 341)",
            "response": "Open the first result again",
            "reward": 0,
            "done": False,
            "info": {},
            "screenshot_file": "step_4_20260101@100014.png",
        },
        {
            "step_num": 5,
            "action_timestamp": "20260101@100015",
            "action": "DONE",
            "response": None,
            "reward": 0,
            "done": True,
            "info": {},
            "screenshot_file": "step_5_20260101@100015.png",
        },
    ]
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    (d / "traj.jsonl").write_text(text, encoding="utf-8")
    (d / "result.txt").write_text("0.0\n", encoding="utf-8")
    return d


def test_hand_written_osworld_folder(osworld_folder: Path):
    run = load_run(osworld_folder)
    assert run.kind == "osworld" and run.outcome == "failure" and run.score == 0.0
    assert [s.step for s in run.steps] == [1, 2, 3, 4, 5]
    reasons = {s.reason for s in run.skipped}
    assert reasons == {"bad_json", "error_line"}
    assert run.screen == (640, 360)
    first, second = run.steps[0], run.steps[1]
    assert first.parse_error is None and first.actions == [LeftClick((313, 333))]
    assert first.before is None and first.after is not None
    assert second.think == "Search for the weather" and second.intent == "Type the query"
    assert second.before == first.after
    assert run.steps[-1].actions == [Terminate("success")]

    result = diagnose(osworld_folder)
    assert result.root_cause_step == 3
    assert result.error["l1"] == "G" and result.error["l2"] == "G1"
    assert result.error["hivig_dimension"] == "Grounding/Spatial Error"
    assert result.method == "cheap_signals" and result.confidence <= 0.45
    top = result.ranking[0]
    assert top["step"] == 3
    assert {"no_effect", "recurrence_onset"} <= {s["name"] for s in top["signals"]}
    assert 5 in [c["step"] for c in result.ranking]  # the premature DONE is a candidate too
    assert {s["reason"] for s in result.skipped} == {"bad_json", "error_line"}
    assert any("no critic backend" in n for n in result.notes)
    assert any("Time limit exceeded" in n for n in result.notes)
    assert result.candidates_considered == sorted(result.candidates_considered)


def test_osworld_action_objects_and_thought_strings(tmp_path: Path):
    code = '"""Thought: click it.\nSecond line."""\npyautogui.click(10, 20)'
    assert "Thought" not in strip_thought_strings(code)
    assert strip_thought_strings("pyautogui.click(") == "pyautogui.click("
    d = tmp_path / "run"
    d.mkdir()
    _screen(d / "step_1_a.png", "a")
    lines = [
        {
            "step_num": 1,
            "action": {"action_type": "click", "command": "pyautogui.click(5, 5)"},
            "screenshot_file": "step_1_a.png",
        },
        {"step_num": 2, "action": {"x": 1}, "screenshot_file": "../escape.png"},
        {"step_num": 3},
        [1, 2],
    ]
    (d / "traj.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = load_run(d / "traj.jsonl")
    assert run.outcome == "unknown"  # no result.txt
    assert run.steps[0].actions == [LeftClick((8, 14))]
    assert run.steps[1].actions is None and run.steps[1].parse_error
    assert run.steps[1].after is None  # a path outside the folder is never read
    assert {s.reason for s in run.skipped} == {"no_action", "not_an_object"}


# ---------------------------------------------------------------------------------------------
# Detection and user errors


def test_detect_kind_and_bad_inputs(tmp_path: Path, osworld_folder: Path):
    case = make_case(0)
    trace = write_trace(case, tmp_path / "state")
    assert detect_kind(trace) == "trace"
    assert detect_kind(osworld_folder) == "osworld"
    assert detect_kind(osworld_folder / "traj.jsonl") == "osworld"
    with pytest.raises(DiagnoseInputError, match="does not exist"):
        detect_kind(tmp_path / "missing.jsonl")
    with pytest.raises(DiagnoseInputError, match="without traj.jsonl"):
        detect_kind(tmp_path)
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n[1]\n")
    with pytest.raises(DiagnoseInputError, match="no JSON object"):
        detect_kind(junk)
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(DiagnoseInputError, match="cannot tell the format"):
        detect_kind(other)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "traj.jsonl").write_text('{"Error": "boom"}\n')
    with pytest.raises(DiagnoseInputError, match="no usable step"):
        load_run(empty)


# ---------------------------------------------------------------------------------------------
# Gateway traces


def test_trace_loader(tmp_path: Path):
    case = make_case(3)  # premature_done: ends in DONE, so the last step is a final critique
    trace = write_trace(case, tmp_path / "state", critic_recall=1.0, critic_false_bad=0.0)
    with open(trace, "a") as f:
        f.write("garbage\n")
        f.write(json.dumps({"event": "observe", "step_idx": -1}) + "\n")
        f.write(json.dumps({"event": "mystery"}) + "\n")
    run = load_run(trace)
    assert run.kind == "trace" and run.task == case.task and run.platform == "ubuntu"
    assert len(run.steps) == len(case.steps)
    assert all(s.before is not None for s in run.steps)
    assert all(s.after is not None for s in run.steps[:-1]) and run.steps[-1].after is None
    assert run.steps[-1].executed and run.steps[-1].actions == [Terminate("success")]
    for s, expected in zip(run.steps, case.steps, strict=True):
        assert s.raw.startswith("<tool_call>") or s.parse_error
        assert s.intent == expected.intent
    # The executed action's verdict is attached, never a rejected alternative's.
    bad = [s.step for s in run.steps if s.verdict and s.verdict.verdict == "bad"]
    assert bad == [case.root_step]
    assert {s.reason for s in run.skipped} == {"bad_json", "bad_step_idx", "unknown_event"}
    result = diagnose(trace)
    assert result.root_cause_step == case.root_step
    assert any("assumed" in n for n in result.notes)


def test_trace_without_images_uses_recorded_change(tmp_path: Path):
    case = make_case(0)  # dead click
    trace = write_trace(case, tmp_path / "state", critic_recall=0.0, critic_false_bad=0.0)
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    for obj in lines:
        if obj.get("event") == "observe" and obj["step_idx"] > 0:
            same = obj["image_ref"] == obj["prev_image_ref"]
            obj["change"] = {
                "identical": same,
                "dhash_dist": 0 if same else 9,
                "masked_diff_frac": 0.0 if same else 0.2,
                "no_effect": same,
            }
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for png in (tmp_path / "state" / "images").iterdir():
        png.unlink()
    result = diagnose(trace)
    assert any("no readable before-screenshot" in n for n in result.notes)
    assert result.root_cause_step == case.root_step
    assert "no_effect" in {s["name"] for s in result.ranking[0]["signals"]}


# ---------------------------------------------------------------------------------------------
# Ingested trajectories


def test_trajectories_file(tmp_path: Path):
    corpus = tmp_path / "corpus"
    (corpus / "ep").mkdir(parents=True)
    a = _screen(corpus / "ep" / "0.png", "form")
    (corpus / "ep" / "1.png").write_bytes(a.read_bytes())  # the click did nothing
    (corpus / "ep" / "2.png").write_bytes(a.read_bytes())
    steps = [
        Step(0, "ep/0.png", "  \n ", "Click Save", [LeftClick((900, 900))], "click(0.9, 0.9)"),
        Step(1, "ep/1.png", "retry", "Type the name", [Type("Ada")], "write('Ada')"),
        Step(2, "ep/2.png", None, None, [Terminate("success")], "terminate('success')"),
    ]
    traj = Trajectory(
        "t1",
        "e1",
        Source("demo", "a.jsonl"),
        "windows",
        "Save the form",
        640,
        360,
        steps,
        "failure",
    )
    out = tmp_path / "ingested"
    out.mkdir()
    path = out / "trajectories.jsonl"
    write_trajectories([traj], path)
    with open(path, "a") as f:
        f.write('{"id": "broken"}\n')
    run = load_run(path, images_root=corpus)
    assert run.kind == "trajectories" and run.platform == "windows" and run.outcome == "failure"
    assert [s.before.name for s in run.steps] == ["0.png", "1.png", "2.png"]
    assert run.steps[-1].after is None
    assert [s.reason for s in run.skipped] == ["missing_field"]
    result = diagnose(path, images_root=corpus)
    assert result.root_cause_step == 1
    assert result.error["hivig_dimension"] == "Grounding/Spatial Error"
    # Without the corpus root the screenshots are not found, which the result says.
    blind = diagnose(path)
    assert any("not found" in n for n in blind.notes)
    with pytest.raises(DiagnoseInputError, match="no trajectory with id"):
        load_run(path, trajectory_id="nope")


# ---------------------------------------------------------------------------------------------
# The cheap-signal ranking on generated failures


def test_synthetic_cases_are_failures_with_the_injected_step():
    for seed in range(12):
        case = make_case(seed)
        assert case.kind == KINDS[seed % len(KINDS)]
        assert 2 <= case.root_step <= len(case.steps)
        assert case.steps[case.root_step - 2].code != ""  # a correct prefix precedes it
    again = make_case(5)
    assert [s.code for s in again.steps] == [s.code for s in make_case(5).steps]
    with pytest.raises(ValueError):
        make_case(0, "nonsense")


def test_backing_out_of_a_wrong_page_points_at_the_wrong_click(tmp_path: Path):
    case = make_case(7)  # wrong tab, back, the same wrong tab again, back, again, FAIL
    assert case.kind == "wrong_element" and case.root_step == 3
    result = diagnose(write_osworld(case, tmp_path / "run"))
    top = result.ranking[0]
    assert top["step"] == 3
    names = {s["name"] for s in top["signals"]}
    assert {"later_reverted", "recurrence_onset"} <= names and "no_effect" not in names
    # The click worked but led to a page the agent had to leave: a misread target.
    assert result.error["hivig_dimension"] == "Semantic Error" and result.error["l2"] == "P5"


def test_cheap_ranking_finds_most_injected_steps(tmp_path: Path):
    # 18 cases, three per kind. The full figure (60 cases, both formats) comes from
    # benchmarks/bench_diagnose.py; this guards against a regression of the ranking.
    hits1 = hits3 = 0
    n = 18
    for seed in range(n):
        case = make_case(seed)
        result = diagnose(write_osworld(case, tmp_path / f"c{seed}"))
        hits1 += result.root_cause_step == case.root_step
        hits3 += case.root_step in [c["step"] for c in result.ranking[:3]]
    assert hits3 / n >= 0.8, (hits1, hits3)
    assert hits1 / n >= 0.65, (hits1, hits3)


# ---------------------------------------------------------------------------------------------
# Outputs


def test_outputs_written(tmp_path: Path, osworld_folder: Path):
    out = tmp_path / "out"
    result = diagnose(osworld_folder, out_dir=out)
    doc = json.loads((out / "diagnosis.json").read_text())
    assert doc["root_cause_step"] == result.root_cause_step == 3
    assert doc == {**result.to_json(), "images": doc["images"]}
    page = (out / "diagnosis.html").read_text()
    assert "Root-cause diagnosis" in page and "recurrence_onset" in page
    shots = doc["images"]["3"]
    assert {"before", "after", "marked"} <= set(shots)
    for rel in shots.values():
        assert (out / rel).is_file()
    # The page shows the marked before-shot in place of the plain one, and the after-shot.
    assert f"src='{shots['marked']}'" in page and f"src='{shots['after']}'" in page
    marked = Image.open(out / shots["marked"])
    plain = Image.open(out / shots["before"])
    assert marked.size == plain.size and marked.tobytes() != plain.tobytes()
    assert "<script" not in page and "http" not in page.replace(str(osworld_folder), "")


# ---------------------------------------------------------------------------------------------
# Backends


class ScriptedCritic:
    """An InferenceBackend that answers every critique with a fixed verdict."""

    def __init__(self, verdict: str, dimension: str | None = None) -> None:
        self.verdict, self.dimension = verdict, dimension
        self.model_name = "scripted-critic"
        self.calls: list[list[ChatMessage]] = []

    async def generate(self, messages, sampling, *, request_hash=None):
        self.calls.append(messages)
        images = [p.image for m in messages for p in m.content if isinstance(p, ImagePart)]
        assert images and all(isinstance(i, Image.Image) for i in images)
        if "history tracker" in messages[0].text():
            text = (
                "<think>compare</think><summary>\nProgress Summary: nothing yet\n"
                "Last Action Result: The click had no visible effect.\n</summary>"
            )
        else:
            dim = self.dimension if self.verdict == "Bad" else None
            text = render_critique_target("Looking at the marker.", self.verdict, dim, "It misses.")
        return Generation(text, None, Usage(1, 1), "stop", self.model_name, sampling, "h", 0.0)


def test_critic_confirms_a_candidate(osworld_folder: Path):
    critic = ScriptedCritic("Bad", "Visual Hallucination")
    result = diagnose(osworld_folder, backend=critic, top_k=2)
    assert result.method == "critic"
    assert result.root_cause_step == min(result.candidates_considered) == 3
    assert result.error["hivig_dimension"] == "Visual Hallucination"
    assert result.error["l2"] == "P1"
    assert result.confidence > 0.45
    assert result.backend["parsed"] == 2
    assert any(e["source"] == "critic" for e in result.evidence)
    summaries = {s["step"]: s for s in result.per_step_summaries}
    assert summaries[3]["summary_source"] == "debugger_inspected"
    assert summaries[3]["outcome_summary"].startswith("The click had no visible effect")
    # Two critiques and two history requests; the critique image carries the marker.
    assert len(critic.calls) == 4


def test_critic_judging_good_keeps_cheap_answer_with_less_confidence(osworld_folder: Path):
    cheap = diagnose(osworld_folder)
    good = diagnose(osworld_folder, backend=ScriptedCritic("Good"), use_history=False)
    assert good.method == "cheap_signals"
    assert good.root_cause_step == cheap.root_cause_step
    assert good.confidence < cheap.confidence
    assert any("judged every usable inspected step Good" in n for n in good.notes)


def test_sync_backend_and_async_entry_points(osworld_folder: Path):
    with SyncBackend(ScriptedCritic("Bad", "Grounding/Spatial Error")) as sync:
        first = diagnose(osworld_folder, backend=sync, top_k=1)
        second = diagnose(osworld_folder, backend=sync, top_k=1)
    assert first.to_json() == second.to_json()
    assert first.root_cause_step == 3 and first.method == "critic"

    async def inside_loop():
        with pytest.raises(RuntimeError, match="diagnose_async"):
            diagnose(osworld_folder, backend=ScriptedCritic("Good"))
        return await diagnose_async(osworld_folder, backend=ScriptedCritic("Good"), top_k=1)

    assert asyncio.run(inside_loop()).method == "cheap_signals"
    with pytest.raises(ValueError, match="top_k"):
        diagnose(osworld_folder, top_k=0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_transformers_backend_falls_back(tmp_path: Path):
    from hivig.backends.transformers_backend import TransformersBackend
    from hivig.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS, tiny_model, tiny_processor

    processor = tiny_processor()
    backend = TransformersBackend(tiny_model(processor).eval(), processor, model_name="tiny")
    case = make_case(0)
    out = tmp_path / "out"
    result = diagnose(
        write_osworld(case, tmp_path / "run"),
        backend=backend,
        top_k=2,
        out_dir=out,
        frame=FrameConfig(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS),
        sampling=Sampling(max_tokens=12),
    )
    # Random weights never write the contract: both answers are unusable, recorded, and the
    # cheap signals decide.
    assert result.backend["model"] == "tiny" and result.backend["inspected"] == 2
    assert result.backend["parsed"] == 0
    assert all(i["status"] == "unparseable" and i["reason"] for i in result.inspections)
    assert result.method == "cheap_signals" and result.root_cause_step == case.root_step
    assert any("fell back to the cheap signals" in n for n in result.notes)
    assert json.loads((out / "diagnosis.json").read_text())["backend"]["parsed"] == 0


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli(tmp_path: Path, osworld_folder: Path, capsys):
    out = tmp_path / "cli"
    assert main([str(osworld_folder), "--out", str(out)]) == 0
    assert (out / "diagnosis.json").is_file() and (out / "diagnosis.html").is_file()
    assert "root cause: step 3" in capsys.readouterr().out
    for argv in (
        [str(tmp_path / "missing"), "--out", str(out)],
        [str(osworld_folder), "--out", str(out), "--backend", "bogus"],
        [str(osworld_folder), "--out", str(out), "--backend", "transformers:/no/such/ckpt"],
        [str(osworld_folder), "--out", str(out), "--top-k", "0"],
        [str(osworld_folder), "--out", str(osworld_folder / "result.txt")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("diagnose: error:") and "\n" not in err, err
    assert parse_backend_spec("openai:http://u:p@host:8000/v1@critic") == (
        "openai",
        "http://u:p@host:8000/v1",
        "critic",
    )


def _scripted_reply(body: dict) -> str:
    from tests.fakes.openai_server import request_text

    if "history tracker" in request_text(body):
        return (
            "<think>compare</think><summary>\nProgress Summary: searched\n"
            "Last Action Result: The click did not change the screen.\n</summary>"
        )
    return render_critique_target(
        "The marker sits on blank space.", "Bad", "Grounding/Spatial Error", "Nothing is there."
    )


def test_cli_openai_backend(tmp_path: Path, osworld_folder: Path):
    from tests.fakes.openai_server import ScriptedServer

    out = tmp_path / "http"
    with ScriptedServer(respond=_scripted_reply, model="critic") as server:
        spec = f"openai:{server.base_url}@critic"
        assert main([str(osworld_folder), "--out", str(out), "--backend", spec]) == 0
        assert server.request_count == 6  # three critiques, three history requests
    doc = json.loads((out / "diagnosis.json").read_text())
    assert doc["method"] == "critic" and doc["root_cause_step"] == 3
    assert doc["backend"]["model"] == "critic" and doc["backend"]["parsed"] == 3
    assert doc["error"]["l2"] == "G1"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_transformers_checkpoint(tmp_path: Path, osworld_folder: Path, tiny_checkpoint):
    ckpt = tiny_checkpoint
    out = tmp_path / "tf"
    argv = [
        str(osworld_folder),
        "--out",
        str(out),
        "--backend",
        f"transformers:{ckpt}",
        "--top-k",
        "1",
        "--max-tokens",
        "8",
        "--no-history",
    ]
    assert main(argv) == 0
    doc = json.loads((out / "diagnosis.json").read_text())
    assert doc["backend"]["inspected"] == 1 and doc["backend"]["parsed"] == 0
    assert doc["method"] == "cheap_signals" and doc["root_cause_step"] == 3


def test_add_cli_subcommand(tmp_path: Path, osworld_folder: Path):
    parser = argparse.ArgumentParser(prog="serve")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diagnose", str(osworld_folder), "--out", str(tmp_path / "o")])
    assert args.handler(args) == 0
    assert json.loads((tmp_path / "o" / "diagnosis.json").read_text())["root_cause_step"] == 3


def test_python_m_serve_diagnose(tmp_path: Path, osworld_folder: Path):
    out = tmp_path / "m"
    proc = subprocess.run(
        [sys.executable, "-m", "serve.diagnose", str(osworld_folder), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "diagnosis.html").is_file()


def test_a_gateway_trace_carries_the_sessions_volatile_regions(tmp_path: Path):
    from tests.fakes.gateway import CLICK, gateway_client, observe, session_body

    with gateway_client(tmp_path) as c:
        body = session_body(volatile_regions=[[0, 950, 1000, 1000]])
        sid = c.post("/v1/sessions", json=body).json()["session_id"]
        assert observe(c, sid, 0).status_code == 200
        assert observe(c, sid, 1, prev=CLICK).status_code == 200
    trace = next(tmp_path.rglob(f"traces/{sid}.jsonl"))
    run = load_run(trace)
    assert run.volatile_regions == [[0, 950, 1000, 1000]]
    lines = trace.read_text().splitlines()
    first = json.loads(lines[0])
    first["volatile_regions"] = [[5, 5, 1, 1]]
    trace.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    run = load_run(trace)
    assert run.volatile_regions == [] and any("volatile_regions" in n for n in run.notes)
