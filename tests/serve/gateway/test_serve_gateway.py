"""The critic gateway through FastAPI's test client: sessions, errors, fail-open, auth, restart."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from tests.fakes.gateway import (
    BAD,
    CLICK,
    SUMMARY,
    ScriptedBackend,
    b64,
    gateway_client,
    observe,
    screen,
    serve_config,
    session_body,
    start_session,
)

_client = gateway_client


_start, _observe = start_session, observe


def _code(r):
    return r.json()["error"]["code"]


# ---------------------------------------------------------------------------------------------
# A whole session


def test_full_session_observe_critique_observe(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        first = _observe(c, sid, 0).json()
        assert first["status"] == "ok" and first["change"] is None
        assert first["history"]["version"] == 0
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK}).json()
        assert v["verdict"] == "good" and v["source"] == "model" and v["status"] == "ok"
        # 80 px of 320 is 250 on the grid; the response gives both.
        assert v["marker"] == {"x_1000": 250, "y_1000": 300, "x_px": 80, "y_px": 60, "shape": "x"}
        for key in ("model_version", "prompt_version", "schema_version", "timing_ms"):
            assert key in v
        second = _observe(c, sid, 1, prev=CLICK).json()
        assert second["history"] == {
            "progress_summary": "The settings page is open.",
            "last_action_result": "The click opened the settings page.",
            "version": 1,
            "stale": False,
        }
        assert second["change"]["identical"] is False
        steps = second["echo"]["steps"]
        assert [s["intent"] for s in steps] == ["Click the settings button"]
        v2 = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK}).json()
        assert v2["history_version"] == 1
        got = c.get(f"/v1/sessions/{sid}").json()
        assert got["step_idx"] == 1 and not got["closed"]
        assert c.delete(f"/v1/sessions/{sid}").json()["closed"] is True
        assert _code(_observe(c, sid, 2, prev=CLICK)) == "unknown_session"
    # The critique prompt shows the executed step; the history prompt both screens.
    kinds = [k for k, _ in backend.calls]
    assert kinds == ["critique", "history", "critique"]
    critique_text = backend.calls[2][1][-1].text()
    assert "Step 1:\nAction: Click the settings button\n<tool_call>" in critique_text
    assert len(backend.calls[1][1][-1].images()) == 2
    trace = [json.loads(line) for line in (tmp_path / "state" / "traces" / f"{sid}.jsonl").open()]
    assert [e["event"] for e in trace] == [
        "session",
        "observe",
        "critique",
        "observe",
        "critique",
        "close",
    ]
    assert trace[3]["raw_output"] and trace[3]["prompt"][1]["content"][0]["type"] == "image"
    assert trace[2]["marks"] == [[{"shape": "x", "x": 250, "y": 300}]]
    for event in trace[1:5]:
        ref = event["image_ref"]
        assert (tmp_path / "state" / "images" / f"{ref.split(':')[1]}.png").is_file()


def test_retries_are_idempotent_and_gaps_conflict(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        assert _observe(c, sid, 0).status_code == 200
        one = _observe(c, sid, 1, prev=CLICK).json()
        again = _observe(c, sid, 1, prev=CLICK).json()
        assert one == again
        body = {"step_idx": 1, "action": CLICK}
        v1 = c.post(f"/v1/sessions/{sid}/critique", json=body).json()
        v2 = c.post(f"/v1/sessions/{sid}/critique", json=body).json()
        assert v1 == v2
        assert [k for k, _ in backend.calls] == ["history", "critique"]
        r = _observe(c, sid, 3, prev=CLICK)
        assert r.status_code == 409 and _code(r) == "step_conflict"
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
        assert r.status_code == 409 and _code(r) == "step_conflict"
        forced = _observe(c, sid, 3, prev=CLICK, screenshot=b64(screen(seed=9)))
        assert forced.status_code == 409  # force is a body flag, not implied
        forced = c.post(
            f"/v1/sessions/{sid}/observe",
            json={
                "step_idx": 3,
                "screenshot": b64(screen(seed=9)),
                "prev_action": CLICK,
                "force": True,
            },
        )
        assert forced.status_code == 200 and forced.json()["step_idx"] == 3


def test_stateless_observe_and_critique(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        obs = c.post(
            "/v1/observe",
            json={
                **session_body(),
                "previous_summary": "Progress Summary: Nothing yet.\nLast Action Result: None.",
                "before": b64(screen(seed=1)),
                "after": b64(screen(seed=2)),
                "prev_action": CLICK,
            },
        )
        assert obs.status_code == 200, obs.text
        assert obs.json()["history"]["version"] == 1
        assert "Nothing yet." in backend.calls[0][1][-1].text()
        v = c.post(
            "/v1/critique",
            json={
                **session_body(),
                "trajectory": [CLICK],
                "screenshot": b64(screen(seed=3)),
                "action": {"type": "type", "text": "dark mode"},
            },
        )
        assert v.status_code == 200, v.text
        assert v.json()["verdict"] == "good" and v.json()["marker"] is None
        assert "Step 1:\nAction: Click the settings button" in backend.calls[1][1][-1].text()


def test_candidates_are_ranked_good_first_and_off_screen_is_a_rule(tmp_path):
    backend = ScriptedBackend(bad_if='"coordinate": [900, 900]')
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        far = {"type": "left_click", "x": 288, "y": 180}  # 900/900 on the grid
        off = {"type": "left_click", "x": 400, "y": 10}  # right of a 320 px screen
        out = c.post(
            f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "candidates": [far, off, CLICK]}
        ).json()
        verdicts = [(v["verdict"], v["source"]) for v in out["results"]]
        assert verdicts == [("bad", "model"), ("bad", "rule"), ("good", "model")]
        assert out["results"][1]["error_dimension"] == "Grounding/Spatial Error"
        assert out["ranking"][0] == 2
        assert sorted(out["ranking"]) == [0, 1, 2]
    assert len(backend.calls) == 2  # the off-screen candidate never reached the model


def test_coordinate_spaces_name_the_same_pixel(tmp_path):
    spaces = {
        "screen_px": (80, 60),
        "norm1000": (250, 300),
        "norm999": (249.75, 299.7),
        "norm01": (0.25, 0.3),
        "resized_px": (40, 30),  # a 160x100 frame the policy saw
    }
    with _client(tmp_path) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        for space, (x, y) in spaces.items():
            action = {"type": "left_click", "x": x, "y": y, "coord_space": space}
            if space == "resized_px":
                action["frame"] = {"w": 160, "h": 100}
            v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": action})
            assert v.json()["marker"]["x_1000"] == 250, space
            assert v.json()["marker"]["y_1000"] == 300, space


def test_unparseable_actions_are_critiqued_as_raw_text(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        raw = (
            '<tool_call>\n{"name": "computer_use", "arguments": '
            '{"action": "left_click", "coordinate": [1, }\n</tool_call>'
        )
        v = c.post(
            f"/v1/sessions/{sid}/critique",
            json={"step_idx": 0, "action": {"raw": raw, "format": "qwen"}},
        ).json()
        assert v["verdict"] == "good" and v["marker"] is None and v["parse_error"]
    assert raw in backend.calls[0][1][-1].text()


# ---------------------------------------------------------------------------------------------
# Errors


def test_every_error_code(tmp_path):
    with _client(tmp_path, None, "limits.max_body_bytes=200000", "limits.max_candidates=2") as c:
        assert _code(c.post("/v1/sessions", json={"platform": "ubuntu"})) == "bad_request"
        assert _code(c.post("/v1/sessions", json=session_body(platform="amiga"))) == "bad_request"
        assert (
            _code(c.post("/v1/sessions", json=session_body(coord_space="inches"))) == "bad_request"
        )
        assert _code(c.post("/v1/sessions", content=b"not json")) == "bad_request"
        sid = _start(c)
        r = _observe(c, sid, 0, screenshot=b64(b"definitely not a png"))
        assert (r.status_code, _code(r)) == (415, "bad_image")  # neither PNG nor JPEG
        r = _observe(c, sid, 0, screenshot="%%%")
        assert (r.status_code, _code(r)) == (400, "bad_image")
        r = _observe(c, sid, 0, screenshot=b64(b"\0" * 300_000))
        assert (r.status_code, _code(r)) == (413, "image_too_large")
        r = _observe(c, sid, 0, image_ref="sha256:" + "0" * 64)
        assert (r.status_code, _code(r)) == (404, "unknown_image_ref")
        assert _observe(c, sid, 0).status_code == 200
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": {"intent": "x"}})
        assert (r.status_code, _code(r)) == (422, "bad_action")
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "candidates": [CLICK] * 3})
        assert (r.status_code, _code(r)) == (422, "bad_action")
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": "one", "action": CLICK})
        assert (r.status_code, _code(r)) == (422, "bad_request")
        r = c.post(
            f"/v1/sessions/{sid}/critique",
            json={"step_idx": 0, "action": {**CLICK, "coord_space": "feet"}},
        )
        assert (r.status_code, _code(r)) == (422, "bad_request")
        r = _observe(c, "no-such-session", 0)
        assert (r.status_code, _code(r)) == (404, "unknown_session")
        r = _observe(c, sid, 1)  # no prev_action
        assert (r.status_code, _code(r)) == (422, "bad_action")
        r = _observe(c, sid, 4, prev=CLICK)
        assert (r.status_code, _code(r)) == (409, "step_conflict")
        metrics = c.get("/metrics").text
        assert 'hivig_errors_total{code="bad_image"} 2.0' in metrics


def test_images_by_reference(tmp_path):
    with _client(tmp_path) as c:
        up = c.post("/v1/images", json={"image": b64(screen(seed=4))})
        assert up.status_code == 201
        ref = up.json()["image_ref"]
        # The same pixels in another encoding are the same reference.
        from io import BytesIO

        from PIL import Image

        buf = BytesIO()
        Image.open(BytesIO(screen(seed=4))).save(buf, format="PNG", compress_level=1)
        assert buf.getvalue() != screen(seed=4)
        assert c.post("/v1/images", json={"image": b64(buf.getvalue())}).json()["image_ref"] == ref
        sid = _start(c)
        r = _observe(c, sid, 0, image_ref=ref)
        assert r.status_code == 200 and r.json()["image_ref"] == ref


@pytest.mark.parametrize(("width", "height"), [(1, 1), (7, 3), (333, 77), (1920, 1080)])
def test_image_ref_is_sha256_of_size_and_canonical_png(tmp_path, width, height):
    import base64
    import hashlib
    import io

    import numpy as np
    from PIL import Image

    from hivig.backends import default_image_cache
    from hivig.config import FrameConfig
    from hivig.vision import FAST_PNG_LEVEL, BandedPng, canonical_frame
    from serve.images import ImageStore

    pixels = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    fc = FrameConfig()
    cache = default_image_cache()
    store = ImageStore(tmp_path, fc, max_bytes=1 << 26, max_pixels=1 << 24, payloads=cache)
    stored = store.put_bytes(buf.getvalue())
    frame = canonical_frame(
        Image.fromarray(pixels),
        min_pixels=fc.min_pixels,
        max_pixels=fc.max_pixels,
        factor=fc.factor,
    )
    png = BandedPng.encode(frame, FAST_PNG_LEVEL).png()
    # The documented reference: one SHA-256 over "WxH:" and the canonical frame's PNG.
    assert stored.ref == "sha256:" + hashlib.sha256(f"{width}x{height}:".encode() + png).hexdigest()
    # That PNG is what the transport sends for the cached frame: it is not encoded again.
    clean = store.clean_frame(stored.ref)
    assert cache.has_part(clean)
    sent = base64.b64decode(cache.data_url(clean).partition(",")[2])
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(sent))), np.asarray(frame))
    # Another screen is another reference.
    pixels[height // 2, width // 2] ^= 255
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    assert store.put_bytes(buf.getvalue()).ref != stored.ref


def test_every_frame_the_model_is_sent_is_encoded_once_and_exactly(tmp_path):
    """The transport sends the clean frames' PNGs the store made when naming them, and each
    marked frame's PNG spliced from the clean bands; each decodes to the frame's pixels."""
    import io
    from base64 import b64decode

    import numpy as np
    from PIL import Image

    from hivig.backends import default_image_cache

    class PngBackend(ScriptedBackend):
        png_payloads = default_image_cache()  # as the OpenAI transport: frames travel as PNGs

    cache = default_image_cache()
    encodes = cache.stats.encodes
    backend = PngBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        for k in range(3):
            assert _observe(c, sid, k, prev=CLICK if k else None).status_code == 200
            r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": k, "action": CLICK})
            assert r.status_code == 200
        frames = [img for _, messages in backend.calls for m in messages for img in m.images()]
        assert len(frames) == 3 + 2 * 2  # a marked frame per critique, two per history update
        for frame in frames:
            assert cache.has_part(frame)
            sent = b64decode(cache.data_url(frame).partition(",")[2])
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(sent))), np.asarray(frame))
    assert cache.stats.encodes == encodes


def test_a_marked_frame_whose_bands_are_gone_is_encoded_whole_and_exactly(tmp_path):
    """Bands evicted (or a frame read back from disk): the transport encodes the marked frame
    itself, once, and it still decodes to the frame's pixels."""
    import io
    from base64 import b64decode

    import numpy as np
    from PIL import Image

    from hivig.backends import default_image_cache

    class PngBackend(ScriptedBackend):
        png_payloads = default_image_cache()

    cache = default_image_cache()
    backend = PngBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        assert _observe(c, sid, 0).status_code == 200
        c.app.state.gateway.images._bands.clear()
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
        assert r.status_code == 200
    (marked,) = backend.calls[-1][1][-1].images()
    assert not cache.has_part(marked)  # nothing handed over
    encodes = cache.stats.encodes
    sent = b64decode(cache.data_url(marked).partition(",")[2])
    assert cache.stats.encodes == encodes + 1
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(sent))), np.asarray(marked))


def test_a_payload_cache_at_another_png_level_is_handed_nothing(tmp_path):
    from hivig.backends import ImagePayloadCache
    from hivig.config import FrameConfig
    from serve.images import ImageStore

    other = ImagePayloadCache(png_level=6)
    store = ImageStore(
        tmp_path, FrameConfig(), max_bytes=1 << 26, max_pixels=1 << 24, payloads=other
    )
    stored = store.put_bytes(screen(seed=1))
    assert not other.has_part(store.clean_frame(stored.ref)) and not store._bands


def test_without_a_png_transport_nothing_is_handed_over_or_kept(tmp_path):
    """An in-process model reads the frames themselves: no PNG part, no bands in memory."""
    from hivig.backends import default_image_cache

    backend = ScriptedBackend()  # no ``png_payloads``: not a PNG transport
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        assert _observe(c, sid, 0).status_code == 200
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
        assert r.status_code == 200
        images = c.app.state.gateway.images
        assert not images._bands
    frames = [img for _, messages in backend.calls for m in messages for img in m.images()]
    assert frames and not any(default_image_cache().has_part(f) for f in frames)


def test_unmarked_frames_in_memory_are_looked_up_without_a_thread_hop(tmp_path):
    from hivig.messages import ChatMessage, ImagePart, ImageRef, PointMark, TextPart

    with _client(tmp_path) as c:
        sid = _start(c)
        ref = _observe(c, sid, 0).json()["image_ref"]
        critic = c.app.state.gateway.critic

        def prompt(image_ref):
            return [ChatMessage("user", [TextPart("look"), ImagePart(image_ref)])]

        frames = critic._cached_frames(prompt(ImageRef(ref)))
        assert frames == critic.materialise(prompt(ImageRef(ref)))
        assert frames[0].images()[0] is c.app.state.gateway.images.cached_frame(ref)
        # Marks to draw, or a frame only on disk: the image threads do it.
        assert critic._cached_frames(prompt(ImageRef(ref, (PointMark(500, 500),)))) is None
        c.app.state.gateway.images._frames.clear()
        assert critic._cached_frames(prompt(ImageRef(ref))) is None
        assert critic.materialise(prompt(ImageRef(ref)))[0].images()  # read back from disk


def test_a_difference_the_resize_averages_away_is_the_same_screen(tmp_path):
    """The reference names the frame the critic sees (the serving design's canonical bytes)."""
    import io

    import numpy as np
    from PIL import Image

    from hivig.config import FrameConfig
    from serve.images import ImageStore

    def png(pixels):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        return buf.getvalue()

    store = ImageStore(tmp_path, FrameConfig(), max_bytes=1 << 26, max_pixels=1 << 24)
    pixels = np.full((1080, 1920, 3), 200, np.uint8)
    first = store.put_bytes(png(pixels))
    faint = pixels.copy()
    faint[501, 501, 0] ^= 1  # one level of one channel of one pixel, shrunk 1.43 times
    assert store.put_bytes(png(faint)).ref == first.ref
    visible = pixels.copy()
    visible[500:520, 500:520] = 0  # a 20-pixel square: still there at the frame's size
    assert store.put_bytes(png(visible)).ref != first.ref


# ---------------------------------------------------------------------------------------------
# Fail-open


@pytest.mark.parametrize(
    ("mode", "reason", "parse_status"),
    [("slow", "timeout", "failed"), ("fail", "backend", "failed"), ("garbage", "parse", "failed")],
)
def test_backend_trouble_fails_open_within_the_deadline(tmp_path, mode, reason, parse_status):
    with _client(tmp_path, ScriptedBackend(mode=mode)) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        start = time.perf_counter()
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK}).json()
        took = time.perf_counter() - start
        assert (v["status"], v["verdict"], v["source"], v["reason"]) == (
            "degraded",
            "abstain",
            "fallback",
            reason,
        )
        assert v["parse_status"] == parse_status
        assert took < 2.5  # deadline 1 s plus the request itself
        obs = _observe(c, sid, 1, prev=CLICK).json()
        assert obs["status"] == "degraded" and obs["reason"] == reason
        assert obs["history"]["stale"] is True and obs["history"]["version"] == 0
        assert (
            f'hivig_degraded_total{{call="critique",reason="{reason}"}} 1.0'
            in c.get("/metrics").text
        )


def test_truncated_answer_with_a_complete_block_keeps_its_verdict(tmp_path):
    class Capped(ScriptedBackend):
        async def generate(self, messages, sampling, *, request_hash=None):
            gen = await super().generate(messages, sampling, request_hash=request_hash)
            from dataclasses import replace

            return replace(gen, text=BAD, finish_reason="length")

    with _client(tmp_path, Capped()) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK}).json()
        assert (v["verdict"], v["status"], v["truncated"], v["reason"]) == (
            "bad",
            "degraded",
            True,
            "truncated",
        )


def test_a_missing_closing_tag_is_repaired(tmp_path):
    class Unclosed(ScriptedBackend):
        async def generate(self, messages, sampling, *, request_hash=None):
            from dataclasses import replace

            gen = await super().generate(messages, sampling, request_hash=request_hash)
            return replace(gen, text=BAD.replace("</criticism>", ""))

    with _client(tmp_path, Unclosed()) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK}).json()
        assert (v["verdict"], v["parse_status"], v["status"]) == ("bad", "repaired", "ok")


# ---------------------------------------------------------------------------------------------
# Auth, health, info, prompt profiles


def test_bearer_token_is_enforced_when_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("HIVIG_SERVE_TOKEN", "s3cret")
    with _client(tmp_path) as c:
        assert c.get("/healthz").status_code == 200
        r = c.post("/v1/sessions", json=session_body())
        assert (r.status_code, _code(r)) == (401, "unauthorized")
        r = c.post("/v1/sessions", json=session_body(), headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = c.post("/v1/sessions", json=session_body(), headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 201


def test_health_readiness_info_and_metrics(tmp_path):
    app = create_app(serve_config(tmp_path / "s", "warmup=true"), ScriptedBackend())
    with TestClient(app) as c:
        for _ in range(100):
            if c.get("/readyz").status_code == 200:
                break
            time.sleep(0.02)
        ready = c.get("/readyz").json()
        assert ready["ready"] is True and "critique ok" in ready["detail"]
        info = c.get("/v1/info").json()
        assert info["schema_version"] == "1" and len(info["taxonomy"]) == 12
        assert "norm999" in info["coord_spaces"]
        assert info["frame"]["max_pixels"] == 65536
        assert "hivig_queue_depth" in c.get("/metrics").text


def test_readiness_stays_red_when_the_backend_is_down(tmp_path):
    app = create_app(serve_config(tmp_path / "s", "warmup=true"), ScriptedBackend(mode="fail"))
    with TestClient(app) as c:
        time.sleep(0.3)
        r = c.get("/readyz")
        assert r.status_code == 503 and "warm-up failed" in r.json()["detail"]


def test_a_prompt_profile_replaces_the_wording(tmp_path):
    from hivig.prompts import load_prompt

    profile = tmp_path / "profile"
    profile.mkdir()
    for name in ("critic_history", "critic_critique"):
        t = load_prompt(name)
        images = f"@@ images {' '.join(t.image_slots)}\n" if t.image_slots else ""
        text = f"@@ system\nHOUSE STYLE. {t.system}\n@@ user\n{images}{t.user}\n"
        (profile / f"{name}_v7.txt").write_text(text)
    backend = ScriptedBackend()
    with _client(tmp_path, backend, f"critic.prompt_dir={profile}") as c:
        sid = _start(c)
        _observe(c, sid, 0)
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK}).json()
        assert v["prompt_version"] == "critic_history_v7+critic_critique_v7"
    assert backend.calls[0][1][0].text().startswith("HOUSE STYLE.")
    (profile / "critic_critique_v8.txt").write_text("@@ system\n$task\n@@ user\nno slots\n")
    from hivig.prompts import PromptError

    with pytest.raises(PromptError, match="differ from the documented"):
        create_app(serve_config(tmp_path / "x", f"critic.prompt_dir={profile}"), backend)


# ---------------------------------------------------------------------------------------------
# Sessions survive


def test_a_restarted_gateway_continues_the_session(tmp_path):
    first = ScriptedBackend()
    with _client(tmp_path, first) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        step1 = _observe(c, sid, 1, prev=CLICK).json()
    second = ScriptedBackend()
    with _client(tmp_path, second) as c:  # same state_dir: a restart
        assert _observe(c, sid, 1, prev=CLICK).json() == step1  # the retry gets the stored answer
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK}).json()
        assert v["history_version"] == 1
        step2 = _observe(c, sid, 2, prev=CLICK).json()
        assert step2["history"]["version"] == 2 and len(step2["echo"]["steps"]) == 2
    assert [k for k, _ in second.calls] == ["critique", "history"]
    assert "Step 1:\nAction: Click the settings button" in second.calls[0][1][-1].text()


def test_a_lost_session_is_recreated_from_its_echo(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend, "sessions.store=memory") as c:
        sid = _start(c)
        _observe(c, sid, 0)
        echo = _observe(c, sid, 1, prev=CLICK).json()["echo"]
        c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK})
    with _client(tmp_path, backend, "sessions.store=memory") as c:  # memory: nothing survived
        assert _code(_observe(c, sid, 2, prev=CLICK)) == "unknown_session"
        r = c.post("/v1/sessions", json=session_body(session_id=sid, echo=echo))
        assert r.status_code == 201 and r.json()["echo"]["step_idx"] == 1
        c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK})
    # The re-created session renders the same critique prompt as the original one.
    critiques = [m for k, m in backend.calls if k == "critique"]
    assert critiques[0][-1].text() == critiques[1][-1].text()


def test_idle_sessions_expire(tmp_path):
    with _client(tmp_path, None, "sessions.ttl_s=0.05") as c:
        sid = _start(c)
        time.sleep(0.1)
        assert _code(_observe(c, sid, 0)) == "unknown_session"


def test_a_failed_step_that_changed_the_screen_proposes_recovery(tmp_path):
    failed = SUMMARY.replace(
        "Last Action Result: The click opened the settings page.",
        "Last Action Result: The click failed: an unrelated error dialog opened instead.",
    )
    backend = ScriptedBackend(history_answers=[SUMMARY, failed])
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        first = _observe(c, sid, 0).json()
        ok = _observe(c, sid, 1, prev=CLICK).json()
        assert ok["recovery"] is None
        wrong = _observe(c, sid, 2, prev=CLICK, screenshot=b64(screen(seed=2, dialog=True))).json()
    rec = wrong["recovery"]
    assert rec["target_step"] == 1 and rec["target_image_ref"] == ok["image_ref"]
    assert rec["target_image_ref"] != first["image_ref"]
    assert "settings page is open" in rec["brief"].lower()


def test_diagnose_job_on_a_session_trace(tmp_path):
    with _client(tmp_path) as c:
        sid = _start(c)
        _observe(c, sid, 0)
        for k in range(1, 4):  # a dead click repeated: the screen never changes
            _observe(c, sid, k, prev=CLICK, screenshot=b64(screen(seed=0)))
        r = c.post("/v1/diagnose", json={"session_id": sid})
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        for _ in range(200):
            job = c.get(f"/v1/jobs/{job_id}").json()
            if job["status"] in ("done", "failed"):
                break
            time.sleep(0.05)
        assert job["status"] == "done", job
        assert job["result"]["root_cause_step"] is not None
        assert (tmp_path / "state" / "diagnoses" / job_id / "diagnosis.html").is_file()
        r = c.post("/v1/diagnose", json={"path": "/etc"})
        assert (r.status_code, _code(r)) == (403, "forbidden_path")
        assert _code(c.post("/v1/diagnose", json={"session_id": "nope"})) == "unknown_session"
        assert _code(c.get("/v1/jobs/nope")) == "unknown_job"


def test_reseeding_a_session_from_an_earlier_echo_voids_its_later_answers(tmp_path):
    backend = ScriptedBackend()
    with _client(tmp_path, backend) as c:
        sid = _start(c)
        echo0 = _observe(c, sid, 0).json()["echo"]
        _observe(c, sid, 1, prev=CLICK)
        c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK})
        c.delete(f"/v1/sessions/{sid}")
        r = c.post("/v1/sessions", json=session_body(session_id=sid, echo=echo0))
        assert r.json()["echo"]["step_idx"] == 0
        again = _observe(c, sid, 1, prev=CLICK, screenshot=b64(screen(seed=7, dialog=True))).json()
        assert again["echo"]["steps"][-1]["step_idx"] == 0 and len(again["echo"]["steps"]) == 1
        c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK})
    assert [k for k, _ in backend.calls] == ["history", "critique", "history", "critique"]


def test_unknown_routes_and_methods_answer_in_the_error_shape(tmp_path):
    with gateway_client(tmp_path) as c:
        missing = c.get("/v1/nothing")
        wrong = c.put("/v1/sessions")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert "GET /v1/nothing" in missing.json()["error"]["message"]
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong.headers["allow"]  # the methods the route has, as HTTP asks
    assert "detail" not in missing.json() and "detail" not in wrong.json()


@pytest.mark.parametrize("image_format", ["png", "jpeg"])
def test_the_openai_client_is_handed_pngs_only_when_it_sends_pngs(tmp_path, image_format):
    """The gateway asks the backend for the cache its PNG parts come from: the OpenAI client
    names the process-wide cache when it sends PNGs and none when it sends JPEGs (whose bytes
    a PNG cannot stand for)."""
    from hivig.backends import OpenAIClient, default_image_cache
    from serve.gateway import Gateway
    from tests.fakes.gateway import serve_config

    client = OpenAIClient("http://127.0.0.1:1/v1", "m", image_format=image_format)
    expected = default_image_cache() if image_format == "png" else None
    assert client.png_payloads is expected
    gateway = Gateway(serve_config(tmp_path), client, "test")
    try:
        assert gateway.images._payloads is expected
    finally:
        gateway.close()
