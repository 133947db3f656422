"""The per-image payload cache, the spliced request body and the canonical reasoning split."""

from __future__ import annotations

import asyncio
import base64
import gc
import io
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from hivig.backends import Sampling, request_hash, split_reasoning
from hivig.backends.images import ImagePayloadCache, default_image_cache
from hivig.backends.openai_client import chat_request_body
from hivig.contracts import ContractError, split_think
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.tiny import synthetic_screenshot

pytestmark = pytest.mark.timeout(60)


def _screen(seed: int = 0) -> Image.Image:
    return synthetic_screenshot(160, 96, seed=seed)


def _png_of(part: bytes) -> Image.Image:
    url = json.loads(part)["image_url"]["url"]
    header, _, payload = url.partition(",")
    assert header == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(payload)))


def test_same_object_is_encoded_once():
    cache, image = ImagePayloadCache(), _screen()
    first = cache.image_part(image)
    assert cache.image_part(image) is first
    assert cache.digest(image) == cache.digest(image)
    # Encoding does not hash: the first digest() computes it, the second is a hit.
    assert (cache.stats.encodes, cache.stats.digests, cache.stats.hits) == (1, 1, 2)
    assert _png_of(first).tobytes() == image.tobytes()


def test_digest_alone_does_not_encode():
    cache, image = ImagePayloadCache(), _screen()
    cache.digest(image)
    assert (cache.stats.encodes, cache.stats.digests) == (0, 1)
    cache.image_part(image)  # reuses the digest, encodes once
    assert (cache.stats.encodes, cache.stats.digests) == (1, 1)


def test_entry_is_evicted_when_the_image_dies():
    cache, image = ImagePayloadCache(), _screen()
    cache.image_part(image)
    keep = _screen(1)
    cache.image_part(keep)
    assert len(cache) == 2
    del image
    gc.collect()
    assert len(cache) == 1
    assert cache.has_part(keep)


def test_equal_pixels_in_different_objects_give_equal_hashes():
    cache = ImagePayloadCache()
    a, b = _screen(), _screen()
    assert a is not b
    assert cache.digest(a) == cache.digest(b)
    assert cache.stats.digests == 2  # per object, not per pixels
    messages = [ChatMessage("user", [ImagePart(a), TextPart("q")])]
    twin = [ChatMessage("user", [ImagePart(b), TextPart("q")])]
    assert request_hash("m", messages, Sampling()) == request_hash("m", twin, Sampling())
    # Negative control: other pixels, other digest.
    assert cache.digest(_screen(2)) != cache.digest(a)


def test_size_or_mode_change_is_re_encoded():
    cache, image = ImagePayloadCache(), _screen()
    before = cache.digest(image)
    image.thumbnail((80, 48))  # resizes the same object in place
    after = cache.digest(image)
    assert after != before and cache.stats.digests == 2
    assert _png_of(cache.image_part(image)).size == image.size


def test_concurrent_first_use_encodes_once():
    cache, image = ImagePayloadCache(), synthetic_screenshot(640, 400)
    barrier = threading.Barrier(8)

    def use(_: int) -> tuple[bytes, str]:
        barrier.wait()
        return cache.image_part(image), cache.digest(image)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(use, range(8)))
    assert len({id(part) for part, _ in results}) == 1
    assert len({digest for _, digest in results}) == 1
    assert (cache.stats.encodes, cache.stats.digests, cache.stats.hits) == (1, 1, 14)


def test_many_threads_many_images_stay_consistent():
    cache = ImagePayloadCache()
    images = [_screen(i) for i in range(6)]
    expected = [ImagePayloadCache().digest(im) for im in images]

    def use(i: int) -> str:
        image = images[i % len(images)]
        cache.image_part(image)
        # Short-lived images come and go meanwhile (their entries are evicted under load).
        cache.digest(_screen(100 + i))
        return cache.digest(image)

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(use, range(60)))
    assert got == [expected[i % len(images)] for i in range(60)]
    assert cache.stats.encodes == len(images)
    gc.collect()
    assert len(cache) == len(images)


def test_non_images_are_type_errors():
    with pytest.raises(TypeError, match="materialise"):
        ImagePayloadCache().image_part("a.png")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ImagePayloadCache(png_level=10)


def test_spliced_body_is_the_json_a_dict_would_give():
    image = _screen()
    messages = [
        ChatMessage("system", [TextPart('Say "hi" \\ ünïcode')]),
        ChatMessage("user", [ImagePart(image), TextPart("q")]),
    ]
    sampling = Sampling(seed=3, stop=("</x>",), extra={"chat_template_kwargs": {"a": 1}})
    body = json.loads(chat_request_body("m", messages, sampling))
    url = default_image_cache().data_url(image)
    assert body == {
        "messages": [
            {"role": "system", "content": 'Say "hi" \\ ünïcode'},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "q"},
                ],
            },
        ],
        "chat_template_kwargs": {"a": 1},
        "model": "m",
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 2048,
        "seed": 3,
        "stop": ["</x>"],
    }


@pytest.mark.parametrize(
    "raw",
    [
        "<think>a</think>\n\n<summary>ok</summary>",
        "pre-filled</think>answer",
        "<think>the format is <think>x</think> then y</think>\n<summary>ok</summary>",
        "<THINK>upper</THINK>answer",
        "plain answer",
    ],
)
def test_split_reasoning_agrees_with_the_contract_splitter(raw):
    think, rest = split_think(raw)  # type: ignore[misc]
    assert split_reasoning(raw) == (think, rest.lstrip() if think is not None else raw)


@pytest.mark.parametrize(
    "raw",
    [
        "<think>a</think>b<think>c</think>d",
        "preamble <think>a</think>b",
        "<think>a</think>b<think>",
    ],
)
def test_malformed_reasoning_is_left_for_the_contract_parser(raw):
    assert isinstance(split_think(raw), ContractError)
    assert split_reasoning(raw) == (None, raw)


def test_truncated_reasoning_is_all_reasoning():
    assert split_reasoning("  <think>\ncut off") == ("cut off", "")


def test_client_encodes_a_shared_frame_once_across_requests():
    from hivig.backends import OpenAIClient
    from tests.fakes.openai_server import ScriptedServer, request_images

    cache, frame = default_image_cache(), _screen(7)
    requests = [
        ([ChatMessage("user", [ImagePart(frame), TextPart(f"step {i}")])], Sampling(seed=i))
        for i in range(6)
    ]

    async def go(url: str) -> list:
        async with OpenAIClient(url, "m", concurrency=3) as client:
            return await client.generate_many(requests)

    before = cache.stats.encodes
    with ScriptedServer() as server:
        gens = asyncio.run(go(server.base_url))
        bodies = server.requests
    assert cache.stats.encodes - before == 1
    assert len({g.request_hash for g in gens}) == 6  # the text differs per request
    sent = {png for body in bodies for png in request_images(body)}
    assert len(sent) == 1
    assert Image.open(io.BytesIO(sent.pop())).tobytes() == frame.tobytes()
