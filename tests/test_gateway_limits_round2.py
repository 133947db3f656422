"""Limits a hostile client or a broken backend must not get past (second round).

A backend's usage numbers are vetted (a count past 64 bits once made every route a 500), its
answers are bounded in size, screenshots are PNG or JPEG only, request heads are bounded in
size, request bodies in time, and connections in number. Everything runs on loopback with a
bounded number of connections and sub-second or few-second deadlines.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from hivig.backends import BackendError, OpenAIClient, Sampling
from hivig.backends.openai_client import response_limit
from hivig.messages import ChatMessage, TextPart
from serve.app import create_app
from tests.fakes.gateway import (
    CLICK,
    GOOD,
    SUMMARY,
    LiveServer,
    ScriptedBackend,
    b64,
    gateway_client,
    serve_config,
    session_body,
    start_session,
)
from tests.fakes.openai_server import Reply, ScriptedServer, request_text

FAST = {"timeout_s": 5.0, "max_retries": 2, "backoff_s": 0.0}


def _generate(client: OpenAIClient, max_tokens: int = 16) -> Any:
    messages = [ChatMessage(role="user", content=[TextPart("Is the click correct?")])]

    async def main() -> Any:
        async with client:
            return await client.generate(messages, Sampling(max_tokens=max_tokens))

    return asyncio.run(main())


def _completion(content: str, **usage: Any) -> bytes:
    """A chat completion body with ``usage`` as given (numbers JSON allows, whatever size)."""
    body = {
        "choices": [
            {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": usage,
    }
    return json.dumps(body).encode()


def _openai_gateway(tmp_path, server: ScriptedServer, *overrides: str) -> TestClient:
    cfg = serve_config(
        tmp_path / "state",
        "backend.kind=openai",
        "backend.model=scripted",
        f"backend.base_url={server.base_url}",
        "backend.max_retries=2",
        "backend.backoff_s=0",
        *overrides,
    )
    return TestClient(create_app(cfg), raise_server_exceptions=False)


def _answer_by_kind(critique: bytes, history: bytes | None = None):
    """A scripted backend answer: ``critique`` for verdicts, a plain summary for the rest."""

    def respond(body: dict) -> Reply:
        if "Current Proposed Step" in request_text(body):
            return Reply(raw_body=critique)
        return Reply(raw_body=history) if history is not None else Reply(content=SUMMARY)

    return respond


# ---------------------------------------------------------------------------------------------
# 15. Usage numbers from the backend


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10**30, "completion_tokens": 5},
        {"prompt_tokens": -3, "completion_tokens": 5},
        {"prompt_tokens": 7.5, "completion_tokens": 5},
        {"prompt_tokens": "12", "completion_tokens": 5},
        {"prompt_tokens": True, "completion_tokens": 5},
    ],
)
def test_a_usage_count_that_is_not_a_count_is_treated_as_absent(usage, caplog):
    with ScriptedServer([Reply(raw_body=_completion("Good", **usage))]) as server:
        with caplog.at_level(logging.WARNING, logger="hivig.backends.openai_client"):
            gen = _generate(OpenAIClient(server.base_url, "m", **FAST))
    assert (gen.text, gen.usage.prompt_tokens, gen.usage.completion_tokens) == ("Good", 0, 5)
    assert "usage.prompt_tokens" in caplog.text and "treated as absent" in caplog.text


def test_a_usage_count_past_64_bits_gives_a_normal_verdict_and_commits_the_step(tmp_path):
    huge = _completion(GOOD, prompt_tokens=10**30, completion_tokens=10**30)
    with ScriptedServer(respond=_answer_by_kind(huge, huge.replace(GOOD.encode(), b""))) as srv:
        # The history answer carries the same usage: both routes must survive it.
        with _openai_gateway(tmp_path, srv) as c:
            sid = start_session(c)
            r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": _png()})
            assert r.status_code == 200, r.text
            r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
            assert r.status_code == 200, r.text
            assert r.json()["verdict"] == "good" and r.json()["usage"]["prompt"] == 0
            assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 0
            stateless = c.post(
                "/v1/critique", json={**session_body(), "screenshot": _png(), "action": CLICK}
            )
            assert stateless.status_code == 200, stateless.text
            assert stateless.json()["verdict"] == "good"


# ---------------------------------------------------------------------------------------------
# 18. Size of the backend's answers


def test_an_answer_over_the_size_limit_is_a_bad_response_not_retried():
    big = _completion("x" * 300_000, prompt_tokens=1, completion_tokens=1)
    with ScriptedServer(default=Reply(raw_body=big)) as server:
        client = OpenAIClient(server.base_url, "m", max_response_bytes=100_000, **FAST)
        with pytest.raises(BackendError) as err:
            _generate(client)
        assert server.request_count == 1  # the same request would be answered as long again
    assert err.value.reason == "bad_response" and "over 100000 bytes" in str(err.value)


def test_the_default_size_limit_follows_the_token_cap():
    assert response_limit(768) < 5 * 1024 * 1024 < response_limit(8192)
    over = _completion("y" * (response_limit(16) + 1000))
    with ScriptedServer([Reply(raw_body=over), Reply(content="Good")]) as server:
        client = OpenAIClient(server.base_url, "m", **FAST)
        with pytest.raises(BackendError, match="over"):
            _generate(client, max_tokens=16)
        assert _generate(client, max_tokens=16).text == "Good"  # an ordinary answer still reads


def test_an_oversized_backend_answer_makes_the_verdict_abstain(tmp_path):
    big = _completion("<criticism>" + "z" * 400_000, prompt_tokens=1, completion_tokens=1)
    with ScriptedServer(respond=_answer_by_kind(big)) as server:
        with _openai_gateway(tmp_path, server, "backend.max_response_bytes=200000") as c:
            sid = start_session(c)
            r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": _png()})
            assert r.status_code == 200, r.text
            before = server.request_count
            r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
            assert r.status_code == 200, r.text
            assert r.json()["verdict"] == "abstain" and r.json()["status"] == "degraded"
            assert server.request_count == before + 1


def _png(size: tuple[int, int] = (320, 200)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 210, 220)).save(buf, "PNG")
    return b64(buf.getvalue())


# ---------------------------------------------------------------------------------------------
# 19. Screenshot formats


def _encoded(fmt: str) -> bytes | None:
    """A screen in Pillow format ``fmt``; ``None`` when this Pillow cannot write it."""
    image = Image.new("RGB", (64, 48), (30, 90, 200))
    buf = io.BytesIO()
    try:
        image.save(buf, format=fmt)
    except (OSError, KeyError, ValueError):
        return None
    return buf.getvalue()


REFUSED = ["TIFF", "BMP", "ICO", "TGA", "PCX", "JPEG2000", "AVIF", "WEBP", "GIF", "EPS"]


@pytest.mark.parametrize("fmt", REFUSED)
def test_a_screenshot_in_another_format_is_refused_before_it_is_decoded(tmp_path, fmt):
    data = _encoded(fmt)
    if data is None:
        pytest.skip(f"this Pillow cannot write {fmt}")
    with gateway_client(tmp_path) as c:
        up = c.post("/v1/images", json={"image": b64(data)})
        assert up.status_code == 415, up.text
        assert up.json()["error"]["code"] == "bad_image"
        assert "neither PNG nor JPEG" in up.json()["error"]["message"]
        sid = start_session(c)
        r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(data)})
        assert r.status_code == 415 and r.json()["error"]["code"] == "bad_image"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_png_and_jpeg_screenshots_are_still_served(tmp_path, fmt):
    with gateway_client(tmp_path) as c:
        up = c.post("/v1/images", json={"image": b64(_encoded(fmt))})
        assert up.status_code == 201, up.text


def test_an_image_with_png_magic_but_another_body_is_a_bad_image(tmp_path):
    with gateway_client(tmp_path) as c:
        fake = b"\x89PNG\r\n\x1a\n" + _encoded("BMP")
        up = c.post("/v1/images", json={"image": b64(fake)})
        assert (up.status_code, up.json()["error"]["code"]) == (400, "bad_image")
