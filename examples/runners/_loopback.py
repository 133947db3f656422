"""What the runner examples share: a gateway to talk to and a small synthetic screen.

``--gateway URL`` uses a running gateway (``python -m serve --config configs/serve/local.yaml
model=DIR``); ``--selftest`` starts one in this process on 127.0.0.1 with a scripted critic
that answers Bad whenever the proposed action lands on ``BAD_POINT`` of the 0-1000 grid, so
every example shows a rejection, the re-proposal and what finally ran. The self-test runs in
a runner's venv with ``pip install "hivig[agent,gateway]"`` (the gateway without torch).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BAD_POINT = "[250, 250]"
"""The grid point the scripted critic rejects (each example's first proposal lands there)."""

_GOOD = (
    "<criticism>\nOverall Grading: Good\nExplanation: The action targets the control the task "
    "needs.\n</criticism>"
)
_BAD = (
    "<criticism>\nOverall Grading: Bad\nError Dimension: Grounding/Spatial Error\nExplanation: "
    "The marker sits on empty space, so nothing will happen.\n</criticism>"
)
_SUMMARY = (
    "<summary>\nProgress Summary: The task is under way.\nLast Action Result: The screen "
    "changed.\n</summary>"
)


class ScriptedCritic:
    """An inference backend answering from a rule (no model): Bad on ``BAD_POINT``."""

    model_name = "scripted-critic"

    async def generate(self, messages: Any, sampling: Any, *, request_hash: str | None = None):
        """One answer: a critique verdict, or a history summary."""
        from hivig.backends import Generation, Usage

        prompt = messages[-1].text()
        if "Current Proposed Step" in prompt:
            text = _BAD if BAD_POINT in prompt else _GOOD
        else:
            text = _SUMMARY
        return Generation(
            text=text,
            reasoning="",
            usage=Usage(prompt_tokens=1, completion_tokens=1),
            finish_reason="stop",
            model=self.model_name,
            sampling=sampling,
            request_hash=request_hash or "scripted",
            latency_s=0.0,
        )


def parser(description: str) -> argparse.ArgumentParser:
    """The examples' command line: ``--gateway URL`` or ``--selftest``."""
    p = argparse.ArgumentParser(description=description)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--gateway", help="URL of a running gateway (python -m serve)")
    group.add_argument(
        "--selftest", action="store_true", help="start a scripted gateway on 127.0.0.1"
    )
    return p


@contextlib.contextmanager
def gateway(args: argparse.Namespace) -> Iterator[Any]:
    """A ``CriticClient`` on ``--gateway``, or on a scripted gateway started here."""
    from serve.client import CriticClient

    if args.gateway:
        with CriticClient(args.gateway) as client:
            yield client
        return
    try:
        from hivig.config import load_config
        from serve.app import create_app
        from serve.config import ServeConfig
        from serve.server import BackgroundServer
    except ModuleNotFoundError as exc:
        # The runner side installs `hivig[agent]` only; the scripted gateway needs the
        # torch-free `gateway` extra beside it.
        from hivig.entry import GATEWAY_IMPORTS, extras_of, missing_stack

        prog = f"{Path(sys.argv[0]).name} --selftest"
        line = missing_stack(prog, exc, extras_of((GATEWAY_IMPORTS, "gateway")))
        if line is None:
            raise
        sys.stderr.write(line + "\n")
        sys.exit(2)

    with tempfile.TemporaryDirectory() as state:
        cfg = load_config(
            ServeConfig,
            None,
            [f"sessions.state_dir={state}", "frame.max_pixels=65536", "warmup=false"],
        )
        with (
            BackgroundServer(create_app(cfg, ScriptedCritic())) as srv,
            CriticClient(srv.url) as client,
        ):
            yield client


def screen_png(width: int, height: int, seed: int = 0) -> bytes:
    """A plain synthetic screen of ``width`` x ``height`` pixels as PNG bytes."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), (230, 232, 236))
    ImageDraw.Draw(img).rectangle(
        (width // 10, height // 4, width // 3, height // 3), fill=(20 + seed * 40 % 200, 120, 200)
    )
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def rejected(log: list[dict[str, Any]]) -> int:
    """Proposals the critic rejected in one episode log."""
    return sum(p.get("ruling") == "rejected" for step in log for p in step["proposals"])


def report(rejections: int, executed: list[Any]) -> None:
    """The example's last line: a JSON summary (what the test of the examples reads)."""
    sys.stdout.write(json.dumps({"rejected": rejections, "executed": executed}, default=str))
    sys.stdout.write("\n")
