"""Train/serve parity through the gateway: a replayed episode meets the model as its training data.

data_gen writes critique and history records for a generated corpus; training encodes a record
as ``record_messages`` → ``materialise`` → ``encode_sample``. Here the same trajectory is replayed
into the gateway the way a runner would drive it (screenshots as PNG bytes, executed actions as
tool-call text, the proposed step at the end), and the messages the gateway hands its backend are
encoded with the same processor. Input ids, pixel values and grids must be identical.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from fastapi.testclient import TestClient

from data_gen.run import run
from hivig.actions import render_tool_calls, space_for_platform
from hivig.backends import Generation, Usage, split_reasoning
from hivig.models.qwen_vl import encode_sample
from hivig.records import SPLITS, read_image_root, read_records, record_messages
from hivig.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS, tiny_processor
from hivig.trajectory import read_trajectories
from hivig.vision import materialise
from serve.app import create_app
from tests._sample_run import ingested_demo_config
from tests.fakes.gateway import b64, serve_config


class Replay:
    """Answers history calls with the records' own targets, records every call's messages."""

    model_name = "replay"

    def __init__(self, history_targets: list[str]) -> None:
        self.history_targets = list(history_targets)
        self.calls: list[tuple[str, list]] = []

    async def generate(self, messages, sampling, *, request_hash=None):
        kind = "critique" if "Current Proposed Step" in messages[-1].text() else "history"
        self.calls.append((kind, messages))
        target = self.history_targets.pop(0) if kind == "history" else ""
        reasoning, text = split_reasoning(target)
        await asyncio.sleep(0)
        return Generation(text, reasoning, Usage(1, 1), "stop", "replay", sampling, "h", 0.0)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    cfg = ingested_demo_config(root, 8, 3)
    run(cfg, None)
    records = [r for s in SPLITS for r in read_records(root / "o" / "dataset" / "records" / s)]
    trajectories = {t.id: t for t in read_trajectories(root / "i" / "trajectories.jsonl")}
    image_root = read_image_root(root / "o" / "dataset" / "records")
    return records, trajectories, image_root


def _history_chain(records, traj_id: str, upto: int) -> list[str] | None:
    by_step = {
        r.step_index: r for r in records if r.kind == "history" and r.trajectory_id == traj_id
    }
    if any(k not in by_step for k in range(upto)):
        return None
    return [by_step[k] for k in range(upto)]


def _proposed(record) -> tuple[str | None, str]:
    text = "".join(p.text for p in record.user if hasattr(p, "text"))
    step = text.split("Current Proposed Step:\n", 1)[1]
    if step.startswith("Action: "):
        intent, _, calls = step.partition("\n")
        return intent[len("Action: ") :], calls
    return None, step


def _replay(records, traj, image_root, k, proposed, masked_history_at=None):
    """Drive the gateway through steps 0..k of ``traj``; returns the backend's calls."""
    chain = _history_chain(records, traj.id, k)
    assert chain is not None
    backend = Replay([r.target for r in chain])
    space = space_for_platform(traj.platform)
    cfg = serve_config(
        image_root.parent / "serve-state",
        "sessions.store=memory",
        f"frame.min_pixels={TINY_MIN_PIXELS}",
        f"frame.max_pixels={TINY_MAX_PIXELS}",
        "critic.recurrence_note=false",
    )
    with TestClient(create_app(cfg, backend)) as c:
        body = {
            "task": traj.task,
            "platform": traj.platform,
            "screen": {"w": traj.screen_w, "h": traj.screen_h},
            "coord_space": "norm1000",
        }
        sid = c.post("/v1/sessions", json=body).json()["session_id"]
        for i in range(k + 1):
            shot = (image_root / traj.steps[i].screenshot).read_bytes()
            obs = {"step_idx": i, "screenshot": b64(shot)}
            if i > 0:
                prev = traj.steps[i - 1]
                action = {"raw": render_tool_calls(list(prev.actions), space), "format": "qwen"}
                if prev.intent and masked_history_at != i - 1:
                    action["intent"] = prev.intent
                obs["prev_action"] = action
            r = c.post(f"/v1/sessions/{sid}/observe", json=obs)
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        if proposed is not None:
            intent, calls = proposed
            action = {"raw": calls, "format": "qwen", **({"intent": intent} if intent else {})}
            r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": k, "action": action})
            assert r.status_code == 200, r.text
    return backend.calls


def _assert_same_encoding(record, served_messages, image_root):
    processor = tiny_processor()
    prompt = [m for m in record_messages(record) if m.role != "assistant"]
    trained = materialise(
        prompt, image_root, min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS
    )
    a, b = encode_sample(processor, trained), encode_sample(processor, served_messages)
    assert a.input_ids.tolist() == b.input_ids.tolist()
    assert torch.equal(a.image_grid_thw, b.image_grid_thw)
    assert torch.equal(a.pixel_values, b.pixel_values)
    assert a.num_image_tokens > 0


def _pick(records, trajectories, *, verdict, min_step=1, masked=None):
    for r in records:
        if r.kind != "critique" or r.labels.verdict != verdict or r.step_index < min_step:
            continue
        if masked is not None and r.labels.intent_masked != masked:
            continue
        traj = trajectories.get(r.trajectory_id)
        if traj is not None and _history_chain(records, traj.id, r.step_index) is not None:
            return r, traj
    pytest.skip(f"no {verdict} critique record past step {min_step} with a full history chain")


def test_good_critique_matches_training_token_for_token(dataset):
    records, trajectories, image_root = dataset
    record, traj = _pick(records, trajectories, verdict="Good", min_step=2, masked=False)
    calls = _replay(records, traj, image_root, record.step_index, _proposed(record))
    kind, served = calls[-1]
    assert kind == "critique"
    _assert_same_encoding(record, served, image_root)


def test_bad_critique_matches_training_token_for_token(dataset):
    records, trajectories, image_root = dataset
    record, traj = _pick(records, trajectories, verdict="Bad", min_step=1)
    calls = _replay(records, traj, image_root, record.step_index, _proposed(record))
    _assert_same_encoding(record, calls[-1][1], image_root)


def test_history_update_matches_training_token_for_token(dataset):
    records, trajectories, image_root = dataset
    for record in records:
        if record.kind == "history" and record.step_index >= 1:
            traj = trajectories.get(record.trajectory_id)
            if traj and _history_chain(records, traj.id, record.step_index + 1):
                break
    else:
        pytest.skip("no history record past the first pair")
    k = record.step_index
    masked = k if record.labels.intent_masked else None
    calls = _replay(records, traj, image_root, k + 1, None, masked_history_at=masked)
    history_calls = [m for kind, m in calls if kind == "history"]
    assert len(history_calls) == k + 1
    _assert_same_encoding(record, history_calls[k], image_root)
