"""A gateway trace that holds re-created sessions: every executed step is read, by every reader.

R3's Restore (or a client re-creating a lost session from its echo) starts a new ``session``
event with ``"reseeded": true`` in the same ``traces/<sid>.jsonl``; its ``step_idx`` numbering
repeats earlier ones. The trace here comes from the real gateway running the demo episode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_gen.runs import ingest_runs
from hivig.run_folders.trace import read_trace, trace_events, trace_segments

# What the demo's agent did, in the order it ran: the Restore re-created the session after
# "Open the Settings dialog", and the last two clicks happened in the second session.
EXECUTED = [
    "Type 'dark mode' into the search field",
    "Click Publish to apply the new theme",
    "Click Publish to apply the new theme",
    "Open the Settings dialog",
    "Tick the Dark mode checkbox",
    "Save the settings",
    "Dark mode is on; the task is done",
]


@pytest.fixture(scope="module")
def demo_state(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(state_dir, trace)`` of the demo episode run through a real gateway."""
    from serve.app import create_app
    from serve.demo.desk import SyntheticDesk
    from serve.demo.episode import run_episode
    from serve.server import BackgroundServer
    from tests.fakes.gateway import ScriptedBackend, serve_config

    state = tmp_path_factory.mktemp("gateway") / "state"
    app = create_app(serve_config(state), ScriptedBackend())
    with BackgroundServer(app) as srv, SyntheticDesk() as env:
        result = run_episode(env, srv.url)
    assert result.success
    return state, state / "traces" / f"{result.session_id}.jsonl"


def _events(trace: Path) -> list[dict]:
    return [json.loads(x) for x in trace.read_text().splitlines()]


def test_the_fixture_is_a_reseeded_trace(demo_state: tuple[Path, Path]):
    _state, trace = demo_state
    sessions = [e for e in _events(trace) if e["event"] == "session"]
    assert [s["reseeded"] for s in sessions] == [False, True]
    observed = [e["step_idx"] for e in _events(trace) if e["event"] == "observe"]
    assert len(observed) > len(set(observed))  # the second session repeats indices


def test_segments_split_at_the_reseeded_session(demo_state: tuple[Path, Path], tmp_path: Path):
    _state, trace = demo_state
    events = _events(trace)
    lines = trace.read_text().splitlines()
    # A repeated observe (observe is idempotent per step) and an unreadable line.
    second_obs = next(i for i, e in enumerate(events) if e["event"] == "observe" and i > 0)
    lines.insert(second_obs + 1, lines[second_obs].replace('"reasoning"', '"x": 1, "reasoning"'))
    lines.insert(1, "{not json")
    edited = tmp_path / "traces" / "edited.jsonl"
    edited.parent.mkdir()
    edited.write_text("\n".join(lines) + "\n")

    segments = trace_segments(edited)
    assert len(segments) == 2
    first, second = segments
    reseed = next(i for i, e in enumerate(events) if e.get("reseeded") is True)
    for seg, part in ((first, events[:reseed]), (second, events[reseed:])):
        observes = [e for e in part if e["event"] == "observe"]
        critiques = [e for e in part if e["event"] == "critique"]
        assert sorted(seg.observes) == sorted({e["step_idx"] for e in observes})
        assert all("x" not in o for o in seg.observes.values())  # the first per index is kept
        assert [c for k in sorted(seg.critiques) for c in seg.critiques[k]] == critiques
    assert min(second.observes) < max(first.observes)
    # The bad line is skipped here and recorded by trace_events.
    assert ("edited.jsonl:2", "bad_json") in [(w, r) for w, r, _d in trace_events(edited).skipped]


def test_read_trace_lists_every_executed_step_once(demo_state: tuple[Path, Path]):
    _state, trace = demo_state
    run = read_trace(trace)
    assert [s.intent for s in run.steps] == EXECUTED
    assert [s.index for s in run.steps] == list(range(len(EXECUTED)))
    assert len({s.source_ref for s in run.steps}) == len(EXECUTED)
    assert all(s.screenshot is not None and s.screenshot.is_file() for s in run.steps)
    assert run.outcome == "success" and run.finished
    assert run.steps[-1].actions and run.steps[-1].actions[-1].status == "success"


def test_read_trace_and_diagnose_read_the_same_steps(demo_state: tuple[Path, Path]):
    from serve.diagnose.loaders import load_trace

    _state, trace = demo_state
    folder_run, run = read_trace(trace), load_trace(trace)
    assert [s.raw_action for s in folder_run.steps] == [s.raw for s in run.steps]
    assert [s.source_ref for s in folder_run.steps] == [s.source_ref for s in run.steps]
    assert [s.screenshot for s in folder_run.steps] == [s.before for s in run.steps]


def test_ingest_runs_keeps_every_executed_step(demo_state: tuple[Path, Path], tmp_path: Path):
    state, _trace = demo_state
    stats = ingest_runs("trace", state, tmp_path / "corpus")
    assert (stats["in"], stats["kept"], stats["episodes"]) == (len(EXECUTED), len(EXECUTED), 1)
    assert stats["outcomes"] == {"success": 1}
    (images,) = (tmp_path / "corpus" / "data" / "gateway_trace").iterdir()
    assert len(list((images / "images").glob("*.png"))) == len(EXECUTED)


def test_a_raw_line_separator_inside_an_event_loses_no_step(
    demo_state: tuple[Path, Path], tmp_path: Path
):
    from serve.diagnose.loaders import load_trace

    # A JSON writer may leave U+2028 raw inside a string (the gateway's traces do); it is not a
    # line break of the trace, so the observe that holds it still counts.
    state, trace = demo_state
    lines = trace.read_text(encoding="utf-8").strip("\n").split("\n")
    events = [json.loads(x) for x in lines]
    last_observe = max(i for i, e in enumerate(events) if e["event"] == "observe")
    events[last_observe]["reasoning"] = "a\u2028b"
    lines[last_observe] = json.dumps(events[last_observe], ensure_ascii=False)
    assert "\u2028" in lines[last_observe]
    (tmp_path / "traces").mkdir()
    (tmp_path / "images").symlink_to(state / "images")
    edited = tmp_path / "traces" / trace.name
    edited.write_text("\n".join(lines), encoding="utf-8")
    assert [s.intent for s in read_trace(edited).steps] == EXECUTED
    assert [s.intent for s in load_trace(edited).steps] == EXECUTED
