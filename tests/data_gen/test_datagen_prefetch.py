"""Annotator request preparation: frames decoded and payloads encoded ahead of the request slots,
in the annotator's own threads, and requests named by the annotator's cache key."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import data_gen.annotator as annotator_mod
from data_gen.annotator import Annotator, AnnotatorRequest, cache_key, usable_cpus
from data_gen.config import DataGenConfig
from data_gen.resume import OPERATIONAL_FIELDS, resume_fingerprint
from data_gen.steps.work import LoopThread
from hivig.backends import Generation, PreparesImages, Sampling, Usage, request_hash
from hivig.backends.images import default_image_cache
from hivig.backends.openai_client import OpenAIClient
from hivig.config import BackendConfig, ConfigError, FrameConfig, load_config
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart
from tests.fakes.openai_server import Reply, ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


def _frame(path, **_kw) -> Image.Image:
    # Stands in for canonical_frame: a distinct small image per screenshot path.
    seed = sum(str(path).encode()) % 251
    return Image.new("RGB", (64, 48), (seed, 255 - seed, 7))


class _SlowBackend:
    """Records, per generate call, whether its images were prepared before it took a slot."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.prepared: set[int] = set()
        self.prepare_threads: set[str] = set()
        self.ready_at_send: list[bool] = []
        self.hashes: list[str | None] = []
        self.in_flight = 0
        self.peak = 0
        self.prepared_requests = 0
        self.ahead_while_full = 0
        self.digests_asked: bool | None = None
        self.waiting_peak = 0  # prepared requests not yet sent, at most
        self._lock = threading.Lock()

    def prepare_images(self, messages, *, digests=True) -> None:
        with self._lock:
            self.digests_asked = digests
            self.prepare_threads.add(threading.current_thread().name)
            for m in messages:
                for p in m.content:
                    if isinstance(p, ImagePart):
                        self.prepared.add(id(p.image))
            self.prepared_requests += 1
            waiting = self.prepared_requests - len(self.hashes)
            self.waiting_peak = max(self.waiting_peak, waiting)
            if self.in_flight == 2:  # readied while every slot was busy
                self.ahead_while_full += 1

    async def generate(self, messages, sampling, *, request_hash=None) -> Generation:
        images = [id(p.image) for m in messages for p in m.content if isinstance(p, ImagePart)]
        with self._lock:
            self.ready_at_send.append(all(i in self.prepared for i in images))
            self.hashes.append(request_hash)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.latency_s)
        self.in_flight -= 1
        return Generation("ok", None, Usage(1, 1), "stop", "m", sampling, request_hash or "", 0.0)


def _annotator(tmp_path, backend, **kw) -> Annotator:
    cfg = BackendConfig(kind="openai", base_url="http://127.0.0.1:1", model="m", concurrency=2)
    return Annotator(cfg, FrameConfig(), tmp_path, None, 1, backend=backend, **kw)


def _request(i: int) -> AnnotatorRequest:
    refs = [ImageRef(f"shot_{i}.png"), ImageRef(f"shot_{i + 1}.png")]
    content = [*(ImagePart(r) for r in refs), TextPart(f"step {i}")]
    return AnnotatorRequest("transitions", [ChatMessage("user", content)])


def _annotate_all(ann: Annotator, n: int, threads: list | None = None) -> list:
    results: list = []

    async def one(i: int) -> None:
        results.append(await ann.annotate(_request(i), lambda text, _r: text))

    loop = LoopThread()
    try:
        loop.run_all([one(i) for i in range(n)], limit=ann.jobs_in_flight)
    finally:
        loop.close()
        if threads is not None and ann._preparer is not None:
            threads.extend(ann._preparer._threads)
        ann.close()
    return results


def test_requests_are_prepared_ahead_of_their_slot_in_the_annotators_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(annotator_mod, "canonical_frame", _frame)
    backend = _SlowBackend(latency_s=0.05)
    ann = _annotator(tmp_path, backend, prefetch=3, prepare_threads=2)
    assert ann.jobs_in_flight == 5
    results = _annotate_all(ann, 20, keep_threads := [])
    assert len(results) == 20 and all(r.ok for r in results)
    # Every request went out with its images already encoded, never more than `concurrency`
    # at once; while the slots were busy other requests were readied, never more than the
    # stage's coroutines allow.
    assert backend.ready_at_send == [True] * 20
    assert backend.peak == 2
    assert backend.ahead_while_full >= 1
    assert backend.waiting_peak <= ann.jobs_in_flight
    assert backend.digests_asked is False  # named by the cache key: no pixel digests
    assert backend.prepare_threads and all(
        n.startswith("hivig-prepare") for n in backend.prepare_threads
    )
    # close() stopped this annotator's threads.
    assert keep_threads and not any(t.is_alive() for t in keep_threads)


def test_endpoint_answers_are_named_by_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.setattr(annotator_mod, "canonical_frame", _frame)
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / f"shot_{i}.png")
    backend = _SlowBackend(latency_s=0.0)
    ann = _annotator(tmp_path, backend)
    (result,) = _annotate_all(ann, 1)
    key = cache_key("m", ann.sampling.to_json(), ann.frame, _request(0), 0, ann.digest)
    # The backend was handed the key (so it hashes no pixels) and the record carries it: the
    # same name the on-disk cache files the answer under, as for offline answers.
    assert backend.hashes == [key] and result.request_hashes == [key]


def test_prefetch_and_threads_are_validated_and_do_not_change_outputs(tmp_path):
    with pytest.raises(ValueError, match="prefetch"):
        _annotator(tmp_path, _SlowBackend(0.0), prefetch=-1)
    with pytest.raises(ValueError, match="prepare_threads"):
        _annotator(tmp_path, _SlowBackend(0.0), prepare_threads=-1)
    assert _annotator(tmp_path, _SlowBackend(0.0)).prepare_threads == usable_cpus() >= 1
    base = [f"corpus={tmp_path}", f"out={tmp_path / 'o'}"]
    with pytest.raises(ConfigError, match="prefetch"):
        load_config(DataGenConfig, DEMO, [*base, "annotator.prefetch=-2"])
    a = load_config(DataGenConfig, DEMO, base)
    b = load_config(
        DataGenConfig, DEMO, [*base, "annotator.prefetch=64", "annotator.prepare_threads=3"]
    )
    assert {"annotator.prefetch", "annotator.prepare_threads"} <= set(OPERATIONAL_FIELDS)
    assert resume_fingerprint(a) == resume_fingerprint(b)


def test_client_prepares_images_and_takes_a_given_request_hash():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), np.uint8))
    msgs = [ChatMessage("user", [TextPart("Describe"), ImagePart(img)])]
    sampling = Sampling(temperature=0.0, max_tokens=8)
    client = OpenAIClient("http://127.0.0.1:1/v1", "m", image_format="jpeg")
    assert isinstance(client, PreparesImages)
    cache = default_image_cache()
    client.prepare_images(msgs, digests=False)
    assert cache.has_part(img, "jpeg", 95) and not cache.has_part(img, "png")
    assert not cache.has_digest(img)

    async def ask(c: OpenAIClient, **kw) -> Generation:
        try:
            return await c.generate(msgs, sampling, **kw)
        finally:
            await c.aclose()

    with ScriptedServer(default=Reply(content="ok"), model="m") as server:
        digests = cache.stats.digests
        given = asyncio.run(
            ask(OpenAIClient(server.base_url, "m", image_format="jpeg"), request_hash="abc")
        )
        # A named JPEG request never reads the pixels out for a digest.
        assert given.request_hash == "abc" and cache.stats.digests == digests
        own = asyncio.run(ask(OpenAIClient(server.base_url, "m", image_format="jpeg")))
    assert own.request_hash == request_hash("m", msgs, sampling) and cache.has_digest(img)
    twin = Image.fromarray(np.asarray(img))
    client.prepare_images([ChatMessage("user", [ImagePart(twin)])])  # digests by default
    assert cache.has_digest(twin)


def test_new_screenshots_are_hashed_off_the_event_loop(tmp_path):
    for name, colour in (("a.png", (1, 2, 3)), ("b.png", (4, 5, 6))):
        Image.new("RGB", (8, 8), colour).save(tmp_path / name)
    ann = _annotator(tmp_path, _SlowBackend(0.0))
    threads: list[str] = []
    real = ann.digest.__class__.__call__

    class Recording(ann.digest.__class__):
        def __call__(self, path: str) -> str:
            if not self.known(path):
                threads.append(threading.current_thread().name)
            return real(self, path)

    ann.digest.__class__ = Recording
    Image.new("RGB", (8, 8), (7, 8, 9)).save(tmp_path / "c.png")
    request = AnnotatorRequest("grounding", [ChatMessage("user", [ImagePart(ImageRef("c.png"))])])
    loop = LoopThread()
    try:
        first = loop.run(ann.file_digests("a.png", "b.png", "absent.png"))
        again = loop.run(ann.file_digests("b.png", "a.png"))
        # Any stage's first request for a screenshot (grounding sees them first) hashes it in
        # the pool too, before the cache key is built.
        loop.run(ann.annotate(request, lambda text, _r: text))
    finally:
        loop.close()
        ann.close()
    assert first[:2] == again[::-1] and first[0] != first[1]
    assert first[2] == "missing:absent.png"
    assert len(threads) == 4 and all(t.startswith("hivig-prepare") for t in threads)


def test_a_cache_hit_is_named_by_its_key(tmp_path, monkeypatch):
    monkeypatch.setattr(annotator_mod, "canonical_frame", _frame)
    cfg = BackendConfig(kind="openai", base_url="http://127.0.0.1:1", model="m")
    ann = Annotator(cfg, FrameConfig(), tmp_path, tmp_path / "cache", 1, backend=_SlowBackend(0))
    request = _request(0)
    key = cache_key("m", ann.sampling.to_json(), ann.frame, request, 0, ann.digest)
    # An entry as an older version wrote it: named by the client's pixel hash.
    ann.cache.put(
        key, {"text": "cached", "reasoning": None, "request_hash": "pixels", "model": "m"}
    )
    loop = LoopThread()
    try:
        result = loop.run(ann.annotate(request, lambda text, _r: text))
    finally:
        loop.close()
        ann.close()
    assert result.value == "cached" and result.request_hashes == [key]
    assert ann.counts["cache_hits"] == 1 and ann.backend.hashes == []
