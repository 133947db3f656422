"""Gateway edge cases: drags, bad numbers, lost screens, slow in-process models, rewinds, growth."""

from __future__ import annotations

import asyncio
import threading
import time

from hivig.backends import Generation, Usage
from tests.fakes.gateway import (
    BAD,
    CLICK,
    GOOD,
    ScriptedBackend,
    b64,
    gateway_client,
    observe,
    screen,
    session_body,
    start_session,
)


def _client(tmp_path, backend=None, *overrides, name="state"):
    return gateway_client(tmp_path, backend, *overrides, name=name, raise_server_exceptions=False)


_start, _observe = start_session, observe


def _critique(c, sid, k, action):
    return c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": k, "action": action})


def test_a_typed_drag_is_a_move_and_a_drag_with_an_arrow(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        drag = {"type": "left_click_drag", "x": 32, "y": 20, "x2": 160, "y2": 20}
        v = _critique(c, sid, 0, drag).json()
        assert v["parse_error"] is None and v["source"] == "model"
        assert v["marker"]["shape"] == "arrow"
        assert (v["marker"]["x_1000"], v["marker"]["x2_1000"]) == (100, 500)
        off = _critique(c, sid, 0, {**drag, "x2": 500}).json()  # ends right of a 320 px screen
        assert (off["verdict"], off["source"]) == ("bad", "rule")
    text = backend.calls[0][1][-1].text()
    assert '"action": "mouse_move"' in text and '"action": "left_click_drag"' in text


def test_non_finite_numbers_are_refused_not_crashed_on(tmp_path):
    with _client(tmp_path) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        for raw in (
            '{"step_idx": 0, "action": {"type": "left_click", "x": NaN, "y": 1}}',
            '{"step_idx": 0, "action": {"type": "left_click", "x": Infinity, "y": 1}}',
            # Overflows a double: infinity by another spelling.
            '{"step_idx": 0, "action": {"type": "left_click", "x": 1e400, "y": 1}}',
        ):
            r = c.post(f"/v1/sessions/{sid}/critique", content=raw)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "bad_request")
        raw = (
            '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
            '"coordinate": [1e400, 1]}}\n</tool_call>'
        )
        r = _critique(c, sid, 0, {"raw": raw, "format": "qwen", "coord_space": "screen_px"})
        assert r.status_code == 200


def test_an_unhandled_error_still_answers_in_the_error_shape(tmp_path, monkeypatch):
    with _client(tmp_path) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        gateway = c.app.state.gateway
        monkeypatch.setattr(gateway.steps, "_critique", lambda *a, **k: 1 / 0)
        r = _critique(c, sid, 0, CLICK)
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal"


class LockedModel:
    """An in-process model: one generation at a time in a worker thread, ``seconds`` each."""

    model_name = "locked"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.started = 0

    def _run(self):
        with self.lock:
            self.started += 1
            time.sleep(self.seconds)
        return GOOD

    async def generate(self, messages, sampling, *, request_hash=None):
        text = await asyncio.to_thread(self._run)
        return Generation(text, "ok", Usage(1, 1), "stop", "locked", sampling, "h", self.seconds)


def test_timed_out_work_keeps_its_queue_place_and_images_do_not_wait_behind_it(tmp_path):
    model = LockedModel(1.5)
    with _client(tmp_path, model, "critic.critique_deadline_s=0.3", "limits.max_queue=3") as c:
        sids = [_start(c) for _ in range(4)]
        for sid in sids:
            _observe(c, sid, 0)
        t = time.perf_counter()
        first = _critique(c, sids[0], 0, CLICK).json()
        assert first["reason"] == "timeout" and time.perf_counter() - t < 1.0
        # The model is still busy with it: the place in the queue is still taken.
        assert c.app.state.gateway.queue.depth == 1
        # A screenshot is decoded at once although model threads are blocked.
        t = time.perf_counter()
        assert c.post("/v1/images", json={"image": b64(screen(seed=9))}).status_code == 201
        assert time.perf_counter() - t < 1.0
        _critique(c, sids[1], 0, CLICK)
        _critique(c, sids[2], 0, CLICK)
        full = _critique(c, sids[3], 0, CLICK)
        assert full.status_code == 429 and full.headers["Retry-After"]
        # The retry of a timed-out critique reaches the model again once it is free.
        for _ in range(100):
            if c.app.state.gateway.queue.depth == 0:
                break
            time.sleep(0.1)
        assert c.app.state.gateway.queue.depth == 0


def test_a_retry_after_a_timeout_asks_the_model_again(tmp_path):
    class FlakyOnce(ScriptedBackend):
        async def generate(self, messages, sampling, *, request_hash=None):
            if not self.calls:
                self.calls.append(("critique", messages))
                await asyncio.sleep(5)
            return await super().generate(messages, sampling, request_hash=request_hash)

    backend = FlakyOnce()
    with _client(tmp_path, backend, "critic.critique_deadline_s=0.3") as c:
        sid = _start(c)
        _observe(c, sid, 0)
        assert _critique(c, sid, 0, CLICK).json()["reason"] == "timeout"
        again = _critique(c, sid, 0, CLICK).json()
        assert again["verdict"] == "good" and again["status"] == "ok"


def test_an_echo_recreated_on_a_fresh_gateway_continues_without_its_old_screens(tmp_path):
    with _client(tmp_path, None, name="first") as c:
        sid = _start(c)
        _observe(c, sid, 0)
        echo = _observe(c, sid, 1, prev=CLICK).json()["echo"]
    with _client(tmp_path, None, name="second") as c:  # another state folder: no images
        assert (
            c.post("/v1/sessions", json=session_body(session_id=sid, echo=echo)).status_code == 201
        )
        obs = _observe(c, sid, 2, prev=CLICK).json()
        assert (obs["status"], obs["reason"]) == ("degraded", "missing_before")
        assert obs["history"]["stale"] is True and len(obs["echo"]["steps"]) == 2
        v = _critique(c, sid, 2, CLICK).json()
        assert v["status"] == "ok"
        # With the previous screen sent along, the history update runs.
        obs = c.post(
            f"/v1/sessions/{sid}/observe",
            json={
                "step_idx": 3,
                "screenshot": b64(screen(seed=3)),
                "prev_screenshot": b64(screen(seed=2)),
                "prev_action": CLICK,
            },
        ).json()
        assert obs["status"] == "ok" and obs["history"]["version"] == 2


def test_a_malformed_echo_is_refused_at_creation(tmp_path):
    with _client(tmp_path) as c:
        for echo in (
            {"step_idx": 1, "steps": [{"step_text": "x"}]},
            {"step_idx": "0"},
            {"step_idx": 0, "screens": {"0": "../../etc/passwd"}},
            {"step_idx": 0, "pointer": [1]},
        ):
            r = c.post("/v1/sessions", json=session_body(session_id="s1", echo=echo))
            assert (r.status_code, r.json()["error"]["code"]) == (422, "bad_request"), echo


def test_raw_text_in_pixels_with_a_bad_block_keeps_grid_marks_and_drops_the_thought(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c, coord_space="screen_px")
        _observe(c, sid, 0)
        raw = (
            "Thought: the save button is at the bottom.\nAction: Click the save button\n"
            '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
            '"coordinate": [300, 150]}}\n</tool_call>\n'
            '<tool_call>\n{"name": "computer_use", "arguments": {"action": "teleport"}}\n'
            "</tool_call>"
        )
        v = _critique(c, sid, 0, {"raw": raw, "format": "qwen"}).json()
        assert v["parse_error"] and v["source"] == "model"
        assert (v["marker"]["x_1000"], v["marker"]["y_1000"]) == (938, 750)
    step = backend.calls[0][1][-1].text().split("Current Proposed Step:\n", 1)[1]
    assert step.startswith("Action: Click the save button\n<tool_call>")
    assert "Thought:" not in step and step.count("Action: Click") == 1
    assert '"coordinate": [938, 750]' in step


def test_a_forced_earlier_step_rewinds_the_session(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        one = _observe(c, sid, 1, prev=CLICK).json()
        _observe(c, sid, 2, prev={**CLICK, "intent": "second"})
        redo = {"type": "left_click", "x": 10, "y": 10, "intent": "redo"}
        r = c.post(
            f"/v1/sessions/{sid}/observe",
            json={
                "step_idx": 1,
                "screenshot": b64(screen(seed=5)),
                "prev_action": redo,
                "force": True,
            },
        ).json()
        assert [s["intent"] for s in r["echo"]["steps"]] == ["redo"]
        assert sorted(r["echo"]["screens"]) == ["0", "1"]
        assert r["history"]["version"] > one["history"]["version"]
        _critique(c, sid, 1, CLICK)
    text = backend.calls[-1][1][-1].text()
    assert "Step 1:\nAction: redo" in text and "Step 2:" not in text


def test_unknown_sessions_leave_no_locks_and_old_answers_are_pruned(tmp_path):
    with _client(tmp_path) as c:
        for i in range(50):
            c.post(f"/v1/sessions/nope{i}/observe", json={"step_idx": 0, "screenshot": "x"})
        gateway = c.app.state.gateway
        assert not any(k.startswith("nope") for k in gateway.sessions.locks)
        sid = _start(c)
        _observe(c, sid, 0)
        for k in range(1, 6):
            _observe(c, sid, k, prev=CLICK)
            _critique(c, sid, k, CLICK)
        stored = gateway.store._db.execute(
            "SELECT DISTINCT step_idx FROM responses WHERE session_id = ?", (sid,)
        ).fetchall()
        assert sorted(s for (s,) in stored) == [4, 5]
        c.delete(f"/v1/sessions/{sid}")
        assert not gateway.store._db.execute(
            "SELECT COUNT(*) FROM responses WHERE session_id = ?", (sid,)
        ).fetchone()[0]


def test_contract_details(tmp_path):
    with _client(tmp_path, ScriptedBackend(verdict="bad")) as c:
        up = c.post("/v1/images", json={"image": b64(screen())}).json()
        assert {"image_ref", "schema_version", "timing_ms"} <= set(up)
        obs = c.post(
            "/v1/observe",
            json={
                **session_body(),
                "before": {"image_ref": up["image_ref"]},
                "after": {"screenshot": b64(screen(seed=4))},
                "prev_action": CLICK,
            },
        )
        assert obs.status_code == 200, obs.text
        sid = _start(c, session_id="episode-1")
        r = c.post("/v1/sessions", json={**session_body(session_id=sid), "task": "Another task"})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "session_conflict")
        assert _start(c, session_id=sid) == sid  # the same episode again: the same session
        assert BAD  # the scripted backend answers Bad here


def test_osworld_scroll_clicks_read_like_scalecua_clicks(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        for raw, fmt in (("pyautogui.scroll(-5)", "osworld"), ("scroll(clicks=-5)", "scalecua")):
            v = _critique(c, sid, 0, {"raw": raw, "format": fmt}).json()
            assert v["parse_error"] is None, v
            assert '"pixels": -500' in v["action_text"], (raw, v["action_text"])


def test_bodies_with_a_bom_are_read_and_deep_nesting_is_refused(tmp_path):
    import json

    with _client(tmp_path) as c:
        r = c.post("/v1/sessions", content=b"\xef\xbb\xbf" + json.dumps(session_body()).encode())
        assert r.status_code == 201, r.text
        step = {"step_idx": 0, "step_text": "click", "actions": [{"action": "left_click"}]}
        nested: object = 1
        for _ in range(300):  # readable, but more than the session document could write back
            nested = [nested]
        step["actions"][0]["extra"] = nested
        echo = {**r.json()["echo"], "session_id": "deep", "step_idx": 1, "steps": [step]}
        r = c.post("/v1/sessions", json={**session_body(), "session_id": "deep", "echo": echo})
        assert (r.status_code, r.json()["error"]["code"]) == (422, "bad_request")
        assert "nests deeper" in r.json()["error"]["message"]


def test_documents_of_earlier_builds_stay_readable_and_bad_ones_do_not_stop_expiry(tmp_path):
    from serve.sessions import SQLiteStore

    with _client(tmp_path) as c:
        old, broken, fine = (_start(c) for _ in range(3))
    db = SQLiteStore(tmp_path / "state" / "sessions.sqlite")
    (text,) = db._db.execute("SELECT state FROM sessions WHERE id = ?", (old,)).fetchone()
    # The standard library wrote non-finite numbers as ``Infinity``; orjson refuses to read them.
    legacy = text.replace('"pointer":null', '"pointer":[Infinity,1]')
    assert legacy != text
    db._db.execute("UPDATE sessions SET state = ? WHERE id = ?", (legacy, old))
    db._db.execute("UPDATE sessions SET state = '{' WHERE id = ?", (broken,))
    assert db.load(old).pointer[0] == float("inf")
    gone = db.expire(idle_before=time.time() + 10)
    assert sorted(gone) == sorted([old, broken, fine])
    assert db.count_open() == 0
    db.close()
