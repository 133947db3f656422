"""The annotator against an endpoint that behaves like a real, imperfect LLM service.

Each fault is scripted on a loopback OpenAI-compatible server and the annotator is driven
through the real HTTP client: an outage shorter than the wait limit, an answer cut at
``max_tokens`` that still parses, a server that honours ``seed`` and so repeats a refused
answer, a 200 carrying an error body, and the server's token usage.
"""

from __future__ import annotations

import asyncio
import time

from data_gen.annotator import TRANSIENT_REASONS, Annotator, AnnotatorRequest
from data_gen.steps.history import validate_history
from hivig.backends import OpenAIClient
from hivig.config import BackendConfig, FrameConfig, SamplingConfig
from hivig.messages import ChatMessage, TextPart
from tests.fakes.openai_server import Reply, ScriptedServer

GOOD = (
    "<think>Compared the two screens.</think>\n<summary>\nProgress Summary: Opened the menu.\n"
    "Last Action Result: The menu is open.\n</summary>"
)
REQUEST = AnnotatorRequest("history", [ChatMessage("user", [TextPart("summarise")])])


def _annotate(server, tmp_path, *, attempts=3, seed=None, outage_wait_s=0.0, max_retries=0):
    cfg = BackendConfig(base_url=server.base_url, model="scripted", sampling=SamplingConfig())
    client = OpenAIClient(server.base_url, "scripted", max_retries=max_retries, backoff_s=0.01)
    ann = Annotator(
        cfg,
        FrameConfig(),
        tmp_path,
        None,
        attempts,
        backend=client,
        outage_wait_s=outage_wait_s,
        outage_backoff_s=(0.1, 0.4),
    )
    if seed is not None:
        ann.sampling = type(ann.sampling)(max_tokens=64, seed=seed)
    result = asyncio.run(ann.annotate(REQUEST, validate_history))
    ann.close()
    return ann, result


def test_an_outage_shorter_than_the_wait_limit_is_waited_out(tmp_path):
    up_at = time.monotonic() + 1.0

    def respond(body):
        return Reply(status=503) if time.monotonic() < up_at else GOOD

    with ScriptedServer(respond=respond) as server:
        ann, result = _annotate(server, tmp_path, outage_wait_s=10.0)
    assert result.ok, result.reason
    assert ann.counts["outage_waits"] >= 2
    # Past the limit the request is given up as a failure that may pass (the stage stays
    # uncommitted and a rerun retries it), never as a permanent drop.
    with ScriptedServer(default=Reply(status=503)) as server:
        ann, result = _annotate(server, tmp_path, outage_wait_s=0.5)
    assert not result.ok and result.reason in TRANSIENT_REASONS


def test_an_answer_cut_at_max_tokens_is_refused_even_when_it_parses(tmp_path):
    replies = [Reply(content=GOOD, finish_reason="length"), GOOD]
    with ScriptedServer(replies) as server:
        ann, result = _annotate(server, tmp_path)
    assert result.ok and result.attempts == 2
    assert ann.counts["truncated"] == 1
    with ScriptedServer(default=Reply(content=GOOD, finish_reason="length")) as server:
        _, result = _annotate(server, tmp_path)
    assert not result.ok and result.reason == "contract_truncated"


def test_a_retry_moves_the_seed_on_so_a_seeded_server_can_answer_differently(tmp_path):
    seeds: list[int | None] = []

    def respond(body):
        seeds.append(body.get("seed"))
        return "no tags at all" if body.get("seed") == 7 else GOOD

    with ScriptedServer(respond=respond) as server:
        _, result = _annotate(server, tmp_path, seed=7)
    assert result.ok and seeds == [7, 8]


def test_the_servers_token_usage_is_summed(tmp_path):
    replies = [
        Reply(content="no tags", prompt_tokens=100, completion_tokens=5),
        Reply(content=GOOD, prompt_tokens=100, completion_tokens=30),
    ]
    with ScriptedServer(replies) as server:
        ann, result = _annotate(server, tmp_path)
    assert result.ok
    assert (ann.counts["prompt_tokens"], ann.counts["completion_tokens"]) == (200, 35)


def test_a_200_error_body_is_a_failure_that_may_pass(tmp_path):
    body = b'{"error": {"message": "The server is overloaded", "type": "server_error"}}'
    with ScriptedServer(default=Reply(raw_body=body)) as server:
        _, result = _annotate(server, tmp_path)
    assert not result.ok and result.reason in TRANSIENT_REASONS
    served = iter([Reply(raw_body=body), Reply(raw_body=body)])

    def respond(_):
        return next(served, GOOD)

    with ScriptedServer(respond=respond) as server:
        ann, result = _annotate(server, tmp_path, outage_wait_s=5.0)
    assert result.ok and ann.counts["outage_waits"] == 2


def test_outage_log_records_keep_no_error_object(tmp_path, caplog):
    """A handler that keeps records (a test's log capture) kept every failed request's body and
    frames through the error's traceback: in the full test tier one process grew past 23 GB.
    The records carry the error's text."""
    with ScriptedServer(default=Reply(status=503)) as server:
        _annotate(server, tmp_path, outage_wait_s=0.5, max_retries=1)
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warned
    for record in warned:
        assert not any(isinstance(a, BaseException) for a in record.args or ()), record.msg
