"""OpenAIClient over real HTTP against the loopback ScriptedServer, plus the shared types."""

from __future__ import annotations

import asyncio
import io
import random
import time

import pytest
from PIL import Image

from hivig.backends import (
    BackendBadResponse,
    BackendError,
    BackendHTTPError,
    BackendTimeout,
    BackendTransportError,
    Generation,
    InferenceBackend,
    OpenAIClient,
    RetriesExhausted,
    Sampling,
    SyncBackend,
    build_backend,
    request_hash,
    sampling_from_config,
    split_reasoning,
)
from hivig.backends.openai_client import parse_retry_after
from hivig.config import BackendConfig, ConfigError, SamplingConfig
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart
from tests.fakes.openai_server import Reply, ScriptedServer, request_images, request_text

pytestmark = pytest.mark.timeout(30)

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}


def _image(colour: str = "red", size: tuple[int, int] = (64, 32)) -> Image.Image:
    return Image.new("RGB", size, colour)


def _messages(text: str = "Is the click correct?", image: Image.Image | None = None):
    user: list[TextPart | ImagePart] = [TextPart(text)]
    if image is not None:
        user.insert(0, ImagePart(image))
    return [ChatMessage("system", [TextPart("You are a critic.")]), ChatMessage("user", user)]


def _run(coro):
    return asyncio.run(coro)


async def _generate(client: OpenAIClient, messages=None, sampling: Sampling | None = None):
    try:
        return await client.generate(messages or _messages(), sampling or Sampling(max_tokens=32))
    finally:
        await client.aclose()


# --------------------------------------------------------------------------------------------
# Shared types


@pytest.mark.parametrize(
    ("raw", "reasoning", "text"),
    [
        (
            "<think>look at the marker</think>\n\n<summary>ok</summary>",
            "look at the marker",
            "<summary>ok</summary>",
        ),
        ("  <think>\nA\n</think>B", "A", "B"),
        ("pre-filled reasoning\n</think>\n\nanswer", "pre-filled reasoning", "answer"),
        ("<think>cut off mid-thought", "cut off mid-thought", ""),
        ("no reasoning at all", None, "no reasoning at all"),
        ("", None, ""),
    ],
)
def test_split_reasoning(raw, reasoning, text):
    assert split_reasoning(raw) == (reasoning, text)


def test_request_hash_is_a_content_address():
    base = request_hash("m", _messages(image=_image("red")), Sampling())
    assert base == request_hash("m", _messages(image=_image("red")), Sampling())
    # Negative controls: every hashed ingredient changes the address.
    variants = [
        request_hash("other", _messages(image=_image("red")), Sampling()),
        request_hash("m", _messages(image=_image("blue")), Sampling()),
        request_hash("m", _messages("other text", image=_image("red")), Sampling()),
        request_hash("m", _messages(image=_image("red")), Sampling(temperature=0.7)),
        request_hash("m", _messages(image=_image("red")), Sampling(seed=3)),
        request_hash("m", _messages(), Sampling()),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_one_pixel_changes_the_request_hash():
    a, b = _image(), _image()
    b.putpixel((5, 5), (0, 0, 0))
    assert request_hash("m", _messages(image=a), Sampling()) != request_hash(
        "m", _messages(image=b), Sampling()
    )


def test_unmaterialised_image_is_a_type_error():
    with pytest.raises(TypeError, match="materialise"):
        request_hash("m", [ChatMessage("user", [ImagePart(ImageRef("a.png"))])], Sampling())


def test_backend_errors_survive_pickling():
    import pickle

    last = BackendHTTPError("HTTP 503", attempts=3, status=503, retry_after_s=1.5)
    err = pickle.loads(pickle.dumps(RetriesExhausted(last, attempts=3)))
    assert isinstance(err, RetriesExhausted) and isinstance(err.last, BackendHTTPError)
    assert (err.reason, err.root_reason, err.attempts, err.status) == (
        "retries_exhausted",
        "http_status",
        3,
        503,
    )
    assert err.last.retry_after_s == 1.5 and str(err) == str(RetriesExhausted(last, attempts=3))


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -0.1}, {"top_p": 0.0}, {"max_tokens": 0}, {"extra": {"temperature": 1.0}}],
)
def test_sampling_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        Sampling(**kwargs)


def test_sampling_from_config():
    s = sampling_from_config(SamplingConfig(temperature=0.5, top_p=0.9, max_tokens=7, seed=1))
    assert s == Sampling(temperature=0.5, top_p=0.9, max_tokens=7, seed=1)


def test_build_backend_from_config(monkeypatch):
    monkeypatch.setenv("HIVIG_TEST_KEY", "sk-test")
    cfg = BackendConfig(
        base_url="http://h:1/v1/",
        model="m",
        api_key_env="HIVIG_TEST_KEY",
        concurrency=3,
        timeout_s=9.0,
        max_retries=2,
        backoff_s=0.25,
    )
    client = build_backend(cfg)
    assert isinstance(client, OpenAIClient) and isinstance(client, InferenceBackend)
    assert (client.base_url, client.model, client.concurrency) == ("http://h:1/v1", "m", 3)
    assert (client.timeout_s, client.max_retries, client.backoff_s) == (9.0, 2, 0.25)
    assert client._headers["authorization"] == "Bearer sk-test"


def test_build_backend_errors_name_the_field():
    with pytest.raises(ConfigError, match="backend.base_url"):
        build_backend(BackendConfig(kind="openai", model="m"))
    with pytest.raises(ConfigError, match="offline"):
        build_backend(BackendConfig(kind="offline"))
    sentinel = OpenAIClient("http://h/v1", "m")
    assert build_backend(BackendConfig(kind="offline"), offline=sentinel) is sentinel


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("2", 2.0),
        ("0.5", 0.5),
        ("-3", 0.0),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


def test_client_rejects_bad_limits():
    with pytest.raises(ValueError, match="concurrency"):
        OpenAIClient("http://h/v1", "m", concurrency=0)
    with pytest.raises(ValueError, match="base_url"):
        OpenAIClient("", "m")


# --------------------------------------------------------------------------------------------
# Success paths


def test_success_sends_images_and_sampling_and_records_everything():
    image = _image("green", (48, 40))
    messages = _messages(image=image)
    sampling = Sampling(
        temperature=0.3,
        top_p=0.9,
        max_tokens=17,
        seed=5,
        stop=("</x>",),
        extra={"chat_template_kwargs": {"enable_thinking": False}},
    )
    reply = Reply(content="Good", prompt_tokens=123, completion_tokens=4)
    with ScriptedServer([reply], model="served-name") as server:
        gen = _run(_generate(OpenAIClient(server.base_url, "critic", **FAST), messages, sampling))
        body = server.requests[0]
    assert isinstance(gen, Generation)
    assert (gen.text, gen.reasoning, gen.finish_reason, gen.model) == (
        "Good",
        None,
        "stop",
        "served-name",
    )
    assert (gen.usage.prompt_tokens, gen.usage.completion_tokens, gen.attempts) == (123, 4, 1)
    assert gen.sampling is sampling
    assert gen.request_hash == request_hash("critic", messages, sampling)
    # What went over the wire.
    assert body["model"] == "critic"
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (
        0.3,
        0.9,
        17,
        5,
    )
    assert body["stop"] == ["</x>"]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"][0] == {"role": "system", "content": "You are a critic."}
    parts = body["messages"][1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    (png,) = request_images(body)
    sent = Image.open(io.BytesIO(png))
    assert sent.format == "PNG" and sent.tobytes() == image.tobytes()
    assert request_text(body) == "You are a critic.\nIs the click correct?"


@pytest.mark.parametrize(
    ("reply", "reasoning", "text"),
    [
        (
            Reply(content="answer", reasoning="why", reasoning_field="reasoning_content"),
            "why",
            "answer",
        ),
        (Reply(content="answer", reasoning="why", reasoning_field="reasoning"), "why", "answer"),
        (Reply(content="<think>why</think>\n\nanswer"), "why", "answer"),
        (Reply(content="why</think>answer"), "why", "answer"),
        (Reply(content="answer"), None, "answer"),
        (Reply(content=None, reasoning="ran out", finish_reason="length"), "ran out", ""),
    ],
)
def test_reasoning_variants(reply, reasoning, text):
    with ScriptedServer([reply]) as server:
        gen = _run(_generate(OpenAIClient(server.base_url, "m", **FAST)))
    assert (gen.reasoning, gen.text) == (reasoning, text)
    assert gen.truncated == (reply.finish_reason == "length")


def test_injected_latency_is_measured():
    with ScriptedServer(latency_s=0.3) as server:
        gen = _run(_generate(OpenAIClient(server.base_url, "m", **FAST)))
    assert 0.3 <= gen.latency_s < 2.0


def test_respond_function_answers_from_the_prompt():
    def respond(body):
        return "Bad" if "delete" in request_text(body) else Reply(content="Good")

    async def both(client):
        out = await client.generate_many(
            [(_messages("delete all files"), Sampling()), (_messages("open the menu"), Sampling())]
        )
        await client.aclose()
        return out

    with ScriptedServer(respond=respond) as server:
        bad, good = _run(both(OpenAIClient(server.base_url, "m", **FAST)))
    assert (bad.text, good.text) == ("Bad", "Good")


def test_respond_errors_become_500_and_are_recorded():
    def respond(body):
        raise KeyError("missing field")

    with ScriptedServer(respond=respond) as server:
        with pytest.raises(BackendHTTPError) as info:
            _run(_generate(OpenAIClient(server.base_url, "m", max_retries=0)))
        assert info.value.status == 500
        assert server.respond_errors == ["KeyError: 'missing field'"]


# --------------------------------------------------------------------------------------------
# Failure paths


def test_timeout_is_typed_and_prompt():
    with ScriptedServer([Reply(delay_s=5.0)]) as server:
        start = time.perf_counter()
        with pytest.raises(BackendTimeout) as info:
            _run(_generate(OpenAIClient(server.base_url, "m", timeout_s=0.3, max_retries=0)))
        elapsed = time.perf_counter() - start
    assert info.value.reason == "timeout" and info.value.attempts == 1
    assert elapsed < 2.0


def test_timeout_then_success_is_retried():
    with ScriptedServer([Reply(delay_s=5.0), Reply(content="late but fine")]) as server:
        client = OpenAIClient(server.base_url, "m", timeout_s=0.3, max_retries=2, **FAST)
        gen = _run(_generate(client))
        assert server.request_count == 2
    assert gen.text == "late but fine" and gen.attempts == 2
    assert client.stats.retries == 1


def test_429_and_500_then_success_counts_retries():
    replies = [Reply(status=429), Reply(status=500), Reply(content="finally")]
    with ScriptedServer(replies) as server:
        client = OpenAIClient(server.base_url, "m", max_retries=3, **FAST)
        gen = _run(_generate(client))
        assert server.request_count == 3
    assert gen.text == "finally" and gen.attempts == 3
    stats = client.stats
    assert (stats.requests, stats.succeeded, stats.failed) == (1, 1, 0)
    assert (stats.attempts, stats.retries) == (3, 2)


@pytest.mark.parametrize("max_retries", [1, 3])
def test_persistent_500_exhausts_exactly_max_retries_plus_one(max_retries):
    with ScriptedServer(default=Reply(status=500)) as server:
        client = OpenAIClient(server.base_url, "m", max_retries=max_retries, **FAST)
        with pytest.raises(RetriesExhausted) as info:
            _run(_generate(client))
        assert server.request_count == max_retries + 1
    err = info.value
    assert err.reason == "retries_exhausted" and err.root_reason == "http_status"
    assert err.attempts == max_retries + 1 and err.status == 500
    assert client.stats.failures == {"retries_exhausted": 1}


def test_no_retries_configured_raises_the_failure_itself():
    with ScriptedServer(default=Reply(status=503)) as server:
        with pytest.raises(BackendHTTPError) as info:
            _run(_generate(OpenAIClient(server.base_url, "m", max_retries=0)))
        assert server.request_count == 1
    assert info.value.status == 503 and info.value.root_reason == "http_status"


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_not_retried(status):
    with ScriptedServer(default=Reply(status=status)) as server:
        with pytest.raises(BackendHTTPError) as info:
            _run(_generate(OpenAIClient(server.base_url, "m", max_retries=3, **FAST)))
        assert server.request_count == 1
    assert info.value.status == status and info.value.attempts == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"\xff\xfe\x00",
        b"[1, 2]",
        b'{"choices": []}',
        b'{"choices": [{"finish_reason": "stop"}]}',
        b'{"choices": [{"message": {"content": 5}}]}',
    ],
)
def test_malformed_bodies_are_bad_responses_without_retry(raw):
    # A 200 carrying an error object is retried instead (see the test after this one).
    with ScriptedServer([Reply(raw_body=raw)], default=Reply(content="never")) as server:
        client = OpenAIClient(server.base_url, "m", max_retries=3, **FAST)
        with pytest.raises(BackendBadResponse) as info:
            _run(_generate(client))
        assert server.request_count == 1
    assert info.value.reason == "bad_response" and info.value.attempts == 1
    assert client.stats.failures == {"bad_response": 1}


def test_dropped_connection_is_a_retried_transport_error():
    with ScriptedServer([Reply(drop_connection=True), Reply(content="ok")]) as server:
        gen = _run(_generate(OpenAIClient(server.base_url, "m", max_retries=2, **FAST)))
    assert gen.text == "ok" and gen.attempts == 2


def test_refused_connection_exhausts_retries_as_transport():
    server = ScriptedServer().start()
    url = server.base_url
    server.stop()
    with pytest.raises(RetriesExhausted) as info:
        _run(_generate(OpenAIClient(url, "m", max_retries=2, **FAST)))
    assert info.value.root_reason == "transport" and info.value.attempts == 3
    assert isinstance(info.value.last, BackendTransportError)


def test_retry_after_is_honoured_and_capped():
    with ScriptedServer([Reply(status=429, headers={"Retry-After": "0.4"}), "ok"]) as server:
        start = time.perf_counter()
        _run(_generate(OpenAIClient(server.base_url, "m", max_retries=1, **FAST)))
        assert time.perf_counter() - start >= 0.4
    with ScriptedServer([Reply(status=503, headers={"Retry-After": "120"}), "ok"]) as server:
        start = time.perf_counter()
        client = OpenAIClient(server.base_url, "m", max_retries=1, max_retry_after_s=0.1)
        _run(_generate(client))
        assert time.perf_counter() - start < 2.0


class _EdgeRandom(random.Random):
    """Jitter source pinned to one end of the interval; records each interval it is asked for."""

    def __init__(self, high: bool) -> None:
        super().__init__()
        self.high = high
        self.intervals: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.intervals.append((a, b))
        return b if self.high else a


def _time_exhausting_retries(rng: random.Random) -> float:
    with ScriptedServer(default=Reply(status=500)) as server:
        client = OpenAIClient(server.base_url, "m", max_retries=2, backoff_s=0.2, rng=rng)
        start = time.perf_counter()
        with pytest.raises(RetriesExhausted):
            _run(_generate(client))
        return time.perf_counter() - start


def test_backoff_is_exponential_with_full_jitter():
    # Caps are 0.2 s then 0.4 s, and the sleep is drawn from [0, cap]: the intervals asked of the
    # jitter source prove both; wall time only proves the drawn sleeps are really slept. The
    # low-jitter run is not timed against the high one: on a loaded machine the three scripted
    # round trips alone can take longer than the 0.5 s of sleep that separates them.
    high, low = _EdgeRandom(high=True), _EdgeRandom(high=False)
    assert _time_exhausting_retries(high) >= 0.6
    _time_exhausting_retries(low)
    assert high.intervals == low.intervals == [(0.0, 0.2), (0.0, 0.4)]


def test_generate_many_keeps_failures_in_place():
    def respond(body):
        return Reply(status=400) if "bad" in request_text(body) else "fine"

    async def go(client):
        requests = [(_messages(t), Sampling()) for t in ("a", "bad", "c")]
        try:
            return await client.generate_many(requests, return_exceptions=True)
        finally:
            await client.aclose()

    with ScriptedServer(respond=respond) as server:
        a, bad, c = _run(go(OpenAIClient(server.base_url, "m", **FAST)))
    assert (a.text, c.text) == ("fine", "fine")
    assert isinstance(bad, BackendError) and bad.status == 400


def test_generate_many_raises_first_failure_without_return_exceptions():
    with ScriptedServer(default=Reply(status=400)) as server:
        client = OpenAIClient(server.base_url, "m", **FAST)
        with pytest.raises(BackendHTTPError):
            _run(client.generate_many([(_messages(), Sampling())] * 3))


# --------------------------------------------------------------------------------------------
# Concurrency, loops and the server itself


@pytest.mark.parametrize("concurrency", [4, 12])
def test_concurrency_bound_is_what_the_server_sees(concurrency):
    async def go(client):
        try:
            return await client.generate_many([(_messages(), Sampling())] * 12)
        finally:
            await client.aclose()

    with ScriptedServer(latency_s=0.25) as server:
        results = _run(go(OpenAIClient(server.base_url, "m", concurrency=concurrency)))
        assert server.max_in_flight == concurrency
    assert len(results) == 12


def test_server_sustains_32_concurrent_slow_requests():
    async def go(client):
        try:
            return await client.generate_many([(_messages(), Sampling())] * 32)
        finally:
            await client.aclose()

    with ScriptedServer(latency_s=0.5) as server:
        start = time.perf_counter()
        results = _run(go(OpenAIClient(server.base_url, "m", concurrency=32)))
        elapsed = time.perf_counter() - start
        assert server.max_in_flight == 32 and server.request_count == 32
    assert all(r.text == "ok" for r in results)
    # Serial handling would take 16 s; concurrent handling one latency plus overhead.
    assert elapsed < 4.0


def test_client_survives_a_new_event_loop():
    with ScriptedServer() as server:
        client = OpenAIClient(server.base_url, "m", **FAST)
        first = _run(client.generate(_messages(), Sampling()))
        second = _run(client.generate(_messages(), Sampling()))
        _run(client.aclose())
    assert first.text == second.text == "ok"
    assert client.stats.succeeded == 2


def test_sync_backend_from_plain_code():
    with ScriptedServer(["one", "two"]) as server:
        with SyncBackend(OpenAIClient(server.base_url, "m", **FAST)) as backend:
            gen = backend.generate(_messages(), Sampling())
            more = backend.generate_many([(_messages(), Sampling())])
        assert server.request_count == 2
    assert gen.text == "one" and more[0].text == "two"
    with pytest.raises(RuntimeError, match="closed"):
        backend.generate(_messages(), Sampling())


def test_server_stops_itself_after_its_lifetime():
    server = ScriptedServer(lifetime_s=0.2).start()
    url = server.base_url
    time.sleep(0.6)
    with pytest.raises(BackendError) as info:
        _run(_generate(OpenAIClient(url, "m", max_retries=0, timeout_s=2.0)))
    assert info.value.reason in ("transport", "timeout")
    server.stop()


def test_stopping_the_server_cuts_scripted_sleeps_short():
    server = ScriptedServer([Reply(delay_s=30.0)]).start()

    async def go():
        client = OpenAIClient(server.base_url, "m", max_retries=0, timeout_s=20.0)
        task = asyncio.ensure_future(client.generate(_messages(), Sampling()))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.stop)
        try:
            return await task
        finally:
            await client.aclose()

    start = time.perf_counter()
    with pytest.raises(BackendTransportError):
        _run(go())
    assert time.perf_counter() - start < 5.0


def test_server_routes_and_bad_requests():
    import httpx

    with ScriptedServer(model="served", respond=lambda body: 42) as server:
        root = f"http://127.0.0.1:{server.port}"
        with httpx.Client() as http:
            assert http.get(f"{root}/v1/models").json()["data"][0]["id"] == "served"
            assert http.get(f"{root}/health").status_code == 200
            assert http.get(f"{root}/nowhere").status_code == 404
            chat = f"{server.base_url}/chat/completions"
            assert http.post(chat, content=b"{oops").status_code == 400
            # A respond() answer that is neither Reply nor str is recorded and answered 500.
            assert http.post(chat, json={"messages": []}).status_code == 500
            server.push("pushed")
            answer = http.post(chat, json={"messages": []}, headers={"Connection": "close"})
            assert answer.json()["choices"][0]["message"]["content"] == "pushed"
        assert server.request_count == 3
        assert server.requests[0] == {} and server.requests[1] == {"messages": []}
        assert server.respond_errors == [
            "TypeError: a scripted answer must be a Reply or a str, got int"
        ]


def test_a_200_error_body_is_retried_by_the_client():
    body = b'{"error": {"message": "The server is overloaded", "type": "server_error"}}'
    with ScriptedServer([Reply(raw_body=body), "ok"]) as server:
        gen = _run(_generate(OpenAIClient(server.base_url, "m", max_retries=1, **FAST)))
    assert gen.text == "ok" and gen.attempts == 2
    with (
        ScriptedServer(default=Reply(raw_body=body)) as server,
        pytest.raises(RetriesExhausted) as info,
    ):
        _run(_generate(OpenAIClient(server.base_url, "m", max_retries=1, **FAST)))
    assert info.value.root_reason == "bad_response" and info.value.attempts == 2


def test_an_answer_nested_past_the_parsers_depth_is_a_bad_response():
    server = ScriptedServer([Reply(raw_body=b"[" * 200_000)])
    with server, pytest.raises(BackendBadResponse):
        _run(_generate(OpenAIClient(server.base_url, "m", max_retries=0, **FAST)))
