"""Image transport format: JPEG for the annotator, lossless PNG for everyone else."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageChops, ImageDraw, ImageStat

from data_gen.config import DataGenConfig
from data_gen.run import build_annotator
from hivig.backends import Sampling
from hivig.backends.base import request_hash
from hivig.backends.images import ImagePayloadCache
from hivig.backends.openai_client import OpenAIClient, chat_request_body
from hivig.config import ConfigError, load_config
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.vision import rgbx_array
from tests.fakes.openai_server import Reply, ScriptedServer, request_images

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "data_gen" / "default.yaml"


def _frame() -> Image.Image:
    img = Image.new("RGB", (672, 384), "white")
    draw = ImageDraw.Draw(img)
    for y in range(0, 384, 16):
        draw.text((8, y), "Total: 42 units  File  Edit  Report", fill="black")
    draw.ellipse((300, 150, 340, 190), outline="red", width=4)  # a marker
    return img


def _decoded(part: bytes) -> tuple[str, Image.Image]:
    url = json.loads(part)["image_url"]["url"]
    head, data = url.split(",", 1)
    return head, Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def test_jpeg_part_is_close_and_png_part_is_exact():
    img, cache = _frame(), ImagePayloadCache()
    head, png = _decoded(cache.image_part(img))
    assert head == "data:image/png;base64" and ImageChops.difference(png, img).getbbox() is None
    head, jpeg = _decoded(cache.image_part(img, "jpeg", 95))
    assert head == "data:image/jpeg;base64" and jpeg.size == img.size
    diff = ImageChops.difference(jpeg, img).convert("L")
    assert diff.getbbox() is not None  # lossy ...
    assert diff.getextrema()[1] < 128 and ImageStat.Stat(diff).mean[0] < 3
    # The marker keeps its colour: the centre of the ring's stroke is still red.
    r, g, b = jpeg.getpixel((320, 151))
    assert r > 180 and g < 90 and b < 90


def test_each_transport_is_encoded_once_per_image():
    img, cache = _frame(), ImagePayloadCache()
    cache.image_part(img, "jpeg", 95)
    cache.image_part(img, "jpeg", 95)
    cache.image_part(img, "png")
    cache.image_part(img, "jpeg", 80)
    assert cache.stats.encodes == 3 and cache.stats.hits == 1
    assert cache.has_part(img, "jpeg", 95) and not cache.has_part(img, "jpeg", 50)
    with pytest.raises(ValueError, match="image_format"):
        cache.image_part(img, "gif")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jpeg_quality"):
        cache.image_part(img, "jpeg", 0)


def test_request_body_carries_the_format_and_the_hash_ignores_it():
    msgs = [ChatMessage("user", [TextPart("Describe"), ImagePart(_frame())])]
    s = Sampling(temperature=0.0, max_tokens=8)
    png = chat_request_body("m", msgs, s)
    jpeg = chat_request_body("m", msgs, s, None, "jpeg", 95)
    assert png != jpeg and b"image/jpeg" in jpeg and b"image/jpeg" not in png
    # The hash is over pixels: a copy of the frame (another object, never encoded) hashes the
    # same, so a cache written with PNG transport answers JPEG requests and vice versa.
    copy = [ChatMessage("user", [TextPart("Describe"), ImagePart(_frame())])]
    assert request_hash("m", msgs, s) == request_hash("m", copy, s)


def test_client_sends_its_configured_format():
    msgs = [ChatMessage("user", [TextPart("Describe"), ImagePart(_frame())])]
    seen: list[bytes] = []

    def respond(body: dict) -> Reply:
        seen.extend(request_images(body))
        return Reply(content="ok")

    async def ask(client: OpenAIClient) -> None:
        await client.generate(msgs, Sampling(temperature=0.0, max_tokens=8))
        await client.aclose()

    with ScriptedServer(respond=respond, model="m") as server:
        asyncio.run(ask(OpenAIClient(server.base_url, "m")))
        asyncio.run(ask(OpenAIClient(server.base_url, "m", image_format="jpeg")))
    assert seen[0].startswith(b"\x89PNG") and seen[1].startswith(b"\xff\xd8")
    with pytest.raises(ValueError):
        OpenAIClient("http://x/v1", "m", image_format="webp")  # type: ignore[arg-type]


def test_annotator_defaults_to_jpeg_and_the_critic_client_to_png(tmp_path):
    cfg = load_config(
        DataGenConfig,
        DEFAULT,
        [f"corpus={tmp_path}", f"out={tmp_path / 'o'}", "annotator.backend.base_url=http://x/v1"],
    )
    assert cfg.annotator.image_format == "jpeg" and cfg.annotator.jpeg_quality == 95
    backend = build_annotator(cfg).backend
    assert isinstance(backend, OpenAIClient) and backend.image_format == "jpeg"
    assert OpenAIClient("http://x/v1", "m").image_format == "png"
    with pytest.raises(ConfigError, match="image_format"):
        load_config(DataGenConfig, DEFAULT, ["annotator.image_format=gif"])


def test_jpeg_part_depends_on_pixels_only_and_takes_any_mode():
    img = _frame()
    twin = img.copy()
    twin.info = {"comment": b"from the source file", "dpi": (300, 300)}
    assert ImagePayloadCache().image_part(img, "jpeg", 95) == ImagePayloadCache().image_part(
        twin, "jpeg", 95
    )
    for mode in ("L", "RGBA", "P"):
        other = img.convert(mode)
        _, got = _decoded(ImagePayloadCache().image_part(other, "jpeg", 95))
        diff = ImageChops.difference(got, other.convert("RGB")).convert("L")
        assert got.size == img.size and ImageStat.Stat(diff).mean[0] < 3, mode


@pytest.mark.parametrize("size", [(97, 61), (2600, 1800)])  # one memory block, and several
def test_rgbx_array_holds_the_rgb_pixels(size):
    rng = np.random.default_rng(size[0])
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    pixels = rgbx_array(img)
    assert pixels.shape == (size[1], size[0], 4) and pixels.dtype == np.uint8
    assert np.array_equal(pixels[..., :3], np.asarray(img))
