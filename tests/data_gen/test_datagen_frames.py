"""Frames handed to the annotator client (prepared once per screenshot, one object per frame) and
the export's image deduplication."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from PIL import Image

import data_gen.annotator as annotator_mod
import data_gen.export as export_mod
from data_gen.annotator import Annotator
from data_gen.config import DataGenConfig
from data_gen.run import run
from data_gen.sample_corpus import SampleConfig, make_sample
from hivig.config import BackendConfig, FrameConfig, load_config
from hivig.messages import ChatMessage, ImagePart, ImageRef, PointMark, TextPart
from hivig.vision import FrameCache, ImageError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


class _CountingFrames:
    """Stands in for ``canonical_frame``: a small solid image per path, counted per path."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: dict[str, int] = {}
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def __call__(self, path, **_kw):
        with self._lock:
            self.calls[str(path)] = self.calls.get(str(path), 0) + 1
        time.sleep(self.delay_s)
        return Image.new("RGB", (64, 48), (len(str(path)) % 255, 0, 0))


def _annotator(tmp_path, **kw) -> Annotator:
    cfg = BackendConfig(kind="openai", base_url="http://127.0.0.1:1", model="m")
    return Annotator(cfg, FrameConfig(), tmp_path, None, 1, backend=object(), **kw)


def _messages(*refs: ImageRef) -> list[ChatMessage]:
    return [ChatMessage("user", [*(ImagePart(r) for r in refs), TextPart("step")])]


def _images(messages: list[ChatMessage]) -> list[Image.Image]:
    return [p.image for m in messages for p in m.content if isinstance(p, ImagePart)]


def test_every_request_gets_the_same_frame_object(tmp_path, monkeypatch):
    frames = _CountingFrames()
    monkeypatch.setattr(annotator_mod, "canonical_frame", frames)
    ann = _annotator(tmp_path)
    mark = (PointMark(500, 500),)
    # More screenshots than the old 48-frame LRU held, each used by two stages.
    paths = [f"shot_{i:03d}.png" for i in range(80)]
    first = [_images(ann._materialise(_messages(ImageRef(p), ImageRef(p, mark)))) for p in paths]
    again = [_images(ann._materialise(_messages(ImageRef(p, mark), ImageRef(p)))) for p in paths]
    for (plain, marked), (marked2, plain2) in zip(first, again, strict=True):
        assert plain is plain2  # the unmarked frame
        assert marked is marked2  # the marked frame, drawn once
        assert marked is not plain and marked.tobytes() != plain.tobytes()
    assert frames.calls == {str(tmp_path / p): 1 for p in paths}
    assert ann.frames.counts["frames_prepared"] == 2 * len(paths)


def test_concurrent_requests_wait_for_one_preparation(tmp_path, monkeypatch):
    frames = _CountingFrames(delay_s=0.05)
    monkeypatch.setattr(annotator_mod, "canonical_frame", frames)
    ann = _annotator(tmp_path)
    got: list[Image.Image] = []

    def one() -> None:
        got.extend(_images(ann._materialise(_messages(ImageRef("a.png")))))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert frames.calls == {str(tmp_path / "a.png"): 1}
    assert len(got) == 8 and all(g is got[0] for g in got)


def test_frame_store_budget_and_failures():
    # Pillow holds an RGB pixel in 4 bytes: the budget counts those, not 3 per pixel.
    store = FrameCache(max_bytes=3 * 64 * 48 * 4)
    img = lambda: Image.new("RGB", (64, 48))  # noqa: E731
    for key in "abcd":
        store.get(key, img)
    assert len(store) == 3 and store.counts["frames_evicted"] == 1
    tight = FrameCache(max_bytes=3 * 64 * 48 * 3)
    for key in "abc":
        tight.get(key, img)
    assert len(tight) == 2
    kept = store.get("d", img)
    assert store.get("d", img) is kept  # a hit, not a new preparation
    assert store.counts["frames_prepared"] == 4

    def broken():
        raise ImageError("corrupt", "cannot decode")

    with pytest.raises(ImageError):
        store.get("x", broken)
    assert store.get("x", img).size == (64, 48)  # a failure is not stored
    store.clear()
    assert len(store) == 0


def test_missing_screenshot_is_a_typed_drop_not_a_crash(tmp_path):
    ann = _annotator(tmp_path)
    with pytest.raises(ImageError):
        ann._materialise(_messages(ImageRef("absent.png")))


# ---------------------------------------------------------------------------------------------
# Export: report cards reuse the ShareGPT frames


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("frames")
    make_sample(root / "c", SampleConfig(trajectories=3, seed=11), progress=False)
    return root


def _count_card_renders(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = export_mod.canonical_frame

    def counting(path, **kw):
        calls.append(repr((str(path), kw.get("marks"), kw.get("size_class"))))
        return real(path, **kw)

    monkeypatch.setattr(export_mod, "canonical_frame", counting)
    return calls


def test_report_cards_link_the_sharegpt_frames(small_corpus, monkeypatch):
    calls = _count_card_renders(monkeypatch)
    out = small_corpus / "with"
    cfg = load_config(DataGenConfig, DEMO, [f"corpus={small_corpus / 'c'}", f"out={out}"])
    run(cfg, None)
    page = (out / "dataset" / "report.html").read_text()
    assert "sharegpt/images/" in page and "report_images/" not in page
    assert calls == []  # nothing rendered twice for the report


def test_report_cards_without_sharegpt_render_each_frame_once(small_corpus, monkeypatch):
    calls = _count_card_renders(monkeypatch)
    out = small_corpus / "without"
    cfg = load_config(
        DataGenConfig,
        DEMO,
        [f"corpus={small_corpus / 'c'}", f"out={out}", "export.sharegpt=false"],
    )
    run(cfg, None)
    page = (out / "dataset" / "report.html").read_text()
    links = page.count("<img src='report_images/")
    assert links > len(calls) > 0  # history cards share screenshots
    # Every rendered (screenshot, marks, size class) is distinct: no frame rendered twice.
    assert len(set(calls)) == len(calls)


def test_stage_coroutines_run_in_slots():
    import asyncio

    from data_gen.steps.work import LoopThread

    running, peak, done = 0, 0, []

    async def job(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        running -= 1
        done.append(i)

    loop = LoopThread()
    try:
        loop.run_all([job(i) for i in range(20)], limit=3)
        assert peak == 3 and sorted(done) == list(range(20))
        peak = 0
        loop.run_all([job(i) for i in range(20)])  # no limit: all start at once
        assert peak == 20
    finally:
        loop.close()
