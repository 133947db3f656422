"""What the gateway sends an OpenAI-compatible server (vLLM, SGLang) is what vLLM's chat API takes.

The gateway runs with its ``openai`` backend against a loopback server that records each request
body. Every body must have only fields vLLM's chat completion request defines, the system turn
first and then the user turn with its screenshots before its text (stable prefix first), explicit
greedy sampling, and image parts that are lossless PNG data URLs of exactly the canonical frame
the gateway built (markers included).
"""

from __future__ import annotations

import io

from fastapi.testclient import TestClient
from PIL import Image

from hivig.messages import PointMark
from hivig.vision import canonical_frame, draw_marks, size_class_for_platform
from serve.app import create_app
from tests.fakes.gateway import CLICK, GOOD, SUMMARY, b64, screen, serve_config, session_body
from tests.fakes.openai_server import Reply, ScriptedServer, request_images, request_text

# Top-level fields of vLLM's ChatCompletionRequest that the gateway may use.
VLLM_FIELDS = {
    "messages",
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "n",
    "stream",
    "logprobs",
    "top_logprobs",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "structured_outputs",
}


def _answer(body):
    text = request_text(body)
    return Reply(content=GOOD if "Current Proposed Step" in text else SUMMARY, reasoning="ok")


def test_request_bodies_are_what_vllm_accepts(tmp_path):
    with ScriptedServer(respond=_answer, model="hivig-critic") as server:
        cfg = serve_config(
            tmp_path / "state",
            "backend.kind=openai",
            f"backend.base_url={server.base_url}",
            "model=hivig-critic",
            "critic.critique_max_tokens=512",
            "critic.observe_deadline_s=10",
            "critic.critique_deadline_s=10",
        )
        shots = [screen(seed=0), screen(seed=1, dialog=True)]
        with TestClient(create_app(cfg)) as c:
            sid = c.post("/v1/sessions", json=session_body()).json()["session_id"]
            c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(shots[0])})
            obs = c.post(
                f"/v1/sessions/{sid}/observe",
                json={"step_idx": 1, "screenshot": b64(shots[1]), "prev_action": CLICK},
            ).json()
            v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK}).json()
        assert obs["status"] == "ok" and obs["history"]["version"] == 1
        assert v["verdict"] == "good" and v["source"] == "model"
        history, critique = server.requests[-2:]

    for body in (history, critique):
        assert set(body) <= VLLM_FIELDS, set(body) - VLLM_FIELDS
        assert body["model"] == "hivig-critic"
        assert body["temperature"] == 0.0 and body["top_p"] == 1.0
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        user = body["messages"][1]["content"]
        kinds = [p["type"] for p in user]
        assert set(kinds) <= {"text", "image_url"}
        assert kinds == sorted(kinds, key=lambda k: k != "image_url")  # images before text
        for part in user:
            if part["type"] == "image_url":
                assert part["image_url"]["url"].startswith("data:image/png;base64,")
    assert critique["max_tokens"] == 512

    # Pixels: the history call carries both clean canonical frames, the critique the marked one.
    frame = {"min_pixels": 1024, "max_pixels": 65536}
    clean = [canonical_frame(s, **frame) for s in shots]
    sent = [Image.open(io.BytesIO(b)).convert("RGB") for b in request_images(history)]
    assert [s.tobytes() for s in sent] == [c.tobytes() for c in clean]
    marked = draw_marks(clean[1], [PointMark(250, 300)], size_class_for_platform("ubuntu")).image
    (got,) = [Image.open(io.BytesIO(b)).convert("RGB") for b in request_images(critique)]
    assert got.tobytes() == marked.tobytes()
