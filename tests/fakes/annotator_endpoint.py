"""A whole ``data_gen run`` against an annotator endpoint that behaves like a real LLM service.

Every request goes over HTTP to a loopback OpenAI-compatible server (``ScriptedServer``), which
may answer it the way a busy, imperfect service does (``faulty_responder``): 429 with
``Retry-After``, 500, a 200 whose body is an error object, a connection closed without an
answer, or an answer cut at ``max_tokens``. What a successful request answers is the offline
annotator's text for the same request (the server cannot know the stage contracts), and a share
of those answers carries a fence inside its answer block, as real models write them.

The faults are a function of the request alone, so two runs meet the same ones: a transient
fault strikes the first time the server sees a body (the retry passes), a cut answer every time
(the retry is another body: the annotator moves the sampling seed on), a fence by the request's
hash. A killed run and its rerun therefore converge on the same export.

    python -m tests.fakes.annotator_endpoint CORPUS TRAJECTORIES OUT URL [CONCURRENCY]
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import data_gen.run as run_module
from data_gen.annotator import Annotator, offline_answer
from data_gen.config import DataGenConfig
from hivig.backends import OpenAIClient
from hivig.config import load_config
from tests.fakes.openai_server import Reply

DEMO = Path(__file__).resolve().parents[2] / "configs" / "data_gen" / "demo.yaml"

FAULT_RATES = {"429": 0.06, "500": 0.04, "error_body": 0.05, "drop": 0.03}
"""Share of new request bodies answered with each transient fault."""
CUT_RATE = 0.04
"""Share of request bodies answered with ``finish_reason: length``."""
FENCE_RATE = 0.2
"""Share of answers whose answer block holds a fence inside its tags."""


def _unit(text: str, salt: str) -> float:
    digest = hashlib.sha256(f"{salt}\x1f{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class FaultyResponder:
    """``ScriptedServer``'s ``respond``: transient faults on first sight, cuts by content."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.faults: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        key = json.dumps(body, sort_keys=True)
        with self._lock:
            first = key not in self.seen
            self.seen.add(key)
        if first:
            u, edge = _unit(key, "transient"), 0.0
            for kind, rate in FAULT_RATES.items():
                edge += rate
                if u < edge:
                    self.faults[kind] += 1
                    return _fault(kind)
        if _unit(key, "cut") < CUT_RATE:
            self.faults["cut"] += 1
            return Reply(content="ok", finish_reason="length")
        return Reply(content="ok")


def _fault(kind: str) -> Reply:
    if kind == "429":
        return Reply(status=429, headers={"Retry-After": "0"})
    if kind == "500":
        return Reply(status=500)
    if kind == "error_body":
        error = {"error": {"message": "upstream model overloaded", "type": "server_error"}}
        return Reply(raw_body=json.dumps(error).encode())
    return Reply(drop_connection=True)


def fenced(text: str) -> str:
    """``text`` with a fence line inside each answer block (and around a bare JSON answer)."""
    out = text
    for tag in ("criticism", "summary", "next_state"):
        out = out.replace(f"<{tag}>\n", f"<{tag}>\n```\n").replace(
            f"\n</{tag}>", f"\n```\n</{tag}>"
        )
    if out == text and text.lstrip().startswith("{"):
        out = f"```json\n{text}\n```"
    return out


class ReplayingAnnotator(Annotator):
    """Pays a real request to the endpoint for every answer, then answers as the offline
    annotator would (the plan and oracles are the offline ones); a share of the answers is
    fenced inside (``fence_rate``)."""

    stages: Counter[str]
    fence_rate: float = 0.0

    @property
    def is_offline(self) -> bool:
        return True

    async def _send(self, request: Any, key: str, attempt: int) -> Any:
        answer, finish = await super()._send(request, key, attempt)
        self.stages[request.stage] += 1
        text, reasoning = offline_answer(request.stage, request.oracle, attempt)
        if _unit(key, "fence") < self.fence_rate:
            text = fenced(text)
        return answer._replace(text=text, reasoning=reasoning), finish


def annotator_factory(
    url: str, concurrency: int, made: list[ReplayingAnnotator], fence_rate: float = 0.0
) -> Callable[[DataGenConfig], Annotator]:
    """A ``data_gen.run.build_annotator`` replacement building ``ReplayingAnnotator``s."""

    def build(cfg: DataGenConfig) -> Annotator:
        a = cfg.annotator
        client = OpenAIClient(
            url, "scripted", concurrency=concurrency, max_retries=2, backoff_s=0.01
        )
        client.image_format = "jpeg"  # the annotator's default transport
        ann = ReplayingAnnotator(
            a.backend,
            cfg.frame,
            Path(cfg.corpus),
            Path(cfg.out) / "cache",
            a.max_attempts,
            backend=client,
            outage_wait_s=a.outage_wait_s,
            outage_backoff_s=(0.05, 0.2),
        )
        ann.stages = Counter()
        ann.fence_rate = fence_rate
        made.append(ann)
        return ann

    return build


def config(corpus: Path, trajectories: Path, out: Path, concurrency: int, *extra: str):
    """The demo config against the endpoint: three answers per request, a seed to move on."""
    return load_config(
        DataGenConfig,
        DEMO,
        [
            f"corpus={corpus}",
            f"out={out}",
            f"trajectories={trajectories}",
            f"annotator.backend.concurrency={concurrency}",
            "annotator.max_attempts=3",
            "annotator.backend.sampling.seed=7",
            "export.audit_max_auc=1.0",
            *extra,
        ],
    )


def run_against(
    corpus: Path,
    trajectories: Path,
    out: Path,
    url: str,
    concurrency: int = 8,
    fence_rate: float = FENCE_RATE,
) -> tuple[dict[str, Any], ReplayingAnnotator]:
    """One run of ``data_gen`` against the endpoint at ``url``; its stats and annotator."""
    made: list[ReplayingAnnotator] = []
    real = run_module.build_annotator
    run_module.build_annotator = annotator_factory(url, concurrency, made, fence_rate)
    try:
        stats = run_module.run(config(corpus, trajectories, out, concurrency), None)
    finally:
        run_module.build_annotator = real  # later runs in this process build their own
    return stats, made[0]


if __name__ == "__main__":
    corpus, trajectories, out, url = sys.argv[1:5]
    concurrency = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    run_against(Path(corpus), Path(trajectories), Path(out), url, concurrency)
