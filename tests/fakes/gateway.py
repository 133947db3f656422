"""Test helpers for the gateway: scripted backends, screenshots and an app builder."""

from __future__ import annotations

import asyncio
import base64
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from hivig.backends import BackendHTTPError, Generation, Sampling, Usage
from hivig.config import load_config
from hivig.messages import ChatMessage
from serve.config import ServeConfig
from serve.server import BackgroundServer

GOOD = (
    "<criticism>\nOverall Grading: Good\nExplanation: The click opens the menu that the task "
    "needs next.\n</criticism>"
)
BAD = (
    "<criticism>\nOverall Grading: Bad\nError Dimension: Grounding/Spatial Error\nExplanation: "
    "The marker sits on empty space beside the button, so nothing will happen.\n</criticism>"
)
SUMMARY = (
    "<summary>\nProgress Summary: The settings page is open.\nLast Action Result: The click "
    "opened the settings page.\n</summary>"
)


@dataclass
class ScriptedBackend:
    """A backend answering from rules: ``mode`` is ok, slow, fail, garbage or truncated.

    ``verdict`` picks the critique answer (``good``/``bad``); every call's messages are kept in
    ``calls`` (materialised frames included) for parity checks.
    """

    mode: str = "ok"
    verdict: str = "good"
    delay_s: float = 0.0
    model_name: str = "scripted-critic"
    calls: list[tuple[str, list[ChatMessage]]] = field(default_factory=list)
    history_answers: list[str] = field(default_factory=list)
    bad_if: str | None = None
    """Answer Bad when the prompt holds this text (per-candidate verdicts)."""
    samplings: dict[str, Sampling] = field(default_factory=dict)
    """The latest call's sampling per kind (``history``/``critique``)."""

    async def generate(
        self, messages: list[ChatMessage], sampling: Sampling, *, request_hash: str | None = None
    ) -> Generation:
        kind = "critique" if "Current Proposed Step" in messages[-1].text() else "history"
        self.calls.append((kind, messages))
        self.samplings[kind] = sampling
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "slow":
            await asyncio.sleep(3600)
        if self.mode == "fail":
            raise BackendHTTPError("server exploded", status=500)
        text = self._answer(kind)
        if kind == "critique" and self.bad_if is not None:
            text = BAD if self.bad_if in messages[-1].text() else GOOD
        finish = "stop"
        if self.mode == "garbage":
            text = "I think this is probably fine {not json} <criticism>"
        if self.mode == "truncated":
            text, finish = text[: len(text) // 2], "length"
        return Generation(
            text=text,
            reasoning="The marker sits on the button.",
            usage=Usage(prompt_tokens=100, completion_tokens=20),
            finish_reason=finish,
            model=self.model_name,
            sampling=sampling,
            request_hash=request_hash or "h",
            latency_s=self.delay_s,
        )

    def _answer(self, kind: str) -> str:
        if kind == "history":
            return self.history_answers.pop(0) if self.history_answers else SUMMARY
        return GOOD if self.verdict == "good" else BAD


def screen(width: int = 320, height: int = 200, seed: int = 0, dialog: bool = False) -> bytes:
    """A synthetic screen as PNG bytes; ``dialog`` draws an opened dialog."""
    img = Image.new("RGB", (width, height), (230, 232, 236))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, width, height // 12), fill=(40, 60, 90 + seed % 100))
    d.rectangle(
        (width // 10, height // 4, width // 3, height // 3), fill=(20 + seed % 200, 120, 200)
    )
    if dialog:
        d.rectangle(
            (width // 4, height // 4, 3 * width // 4, 3 * height // 4), fill=(255, 255, 255)
        )
        d.rectangle((width // 4, height // 4, 3 * width // 4, height // 3), fill=(90, 90, 90))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    """Base64 text of bytes."""
    return base64.b64encode(data).decode()


def serve_config(state_dir: Path, *overrides: str) -> ServeConfig:
    """A gateway config for tests: small frame, short deadlines, no warm-up."""
    return load_config(
        ServeConfig,
        None,
        [
            f"sessions.state_dir={state_dir}",
            "frame.min_pixels=1024",
            "frame.max_pixels=65536",
            "critic.observe_deadline_s=1.0",
            "critic.critique_deadline_s=1.0",
            "warmup=false",
            *overrides,
        ],
    )


def session_body(**extra: Any) -> dict[str, Any]:
    """A ``POST /v1/sessions`` body for a 320x200 Ubuntu screen."""
    return {
        "task": "Open the settings",
        "platform": "ubuntu",
        "screen": {"w": 320, "h": 200},
        **extra,
    }


CLICK = {"type": "left_click", "x": 80, "y": 60, "intent": "Click the settings button"}


class LiveServer(BackgroundServer):
    """A real uvicorn server on 127.0.0.1 for tests (``serve.server.BackgroundServer``)."""


def gateway_client(
    tmp_path: Path,
    backend: Any = None,
    *overrides: str,
    name: str = "state",
    raise_server_exceptions: bool = True,
) -> Any:
    """A FastAPI test client of a gateway with ``backend`` (a ``ScriptedBackend`` by default)."""
    from fastapi.testclient import TestClient

    from serve.app import create_app

    app = create_app(serve_config(tmp_path / name, *overrides), backend or ScriptedBackend())
    return TestClient(app, raise_server_exceptions=raise_server_exceptions)


def start_session(c: Any, **extra: Any) -> str:
    """Open a session (``session_body`` plus ``extra``); its id."""
    r = c.post("/v1/sessions", json=session_body(**extra))
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def observe(c: Any, sid: str, k: int, prev: Any = None, **img: Any) -> Any:
    """Observe step ``k`` (a synthetic screen unless ``screenshot=``/``image_ref=`` is given)."""
    body = {"step_idx": k, **(img or {"screenshot": b64(screen(seed=k))})}
    if prev is not None:
        body["prev_action"] = prev
    return c.post(f"/v1/sessions/{sid}/observe", json=body)
