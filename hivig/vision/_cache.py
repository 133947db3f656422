"""One cache of prepared frames for every stage: the annotator's, the export's and the gateway's.

A frame (decoded, resized, maybe marked) is the costly part of every request that shows a
screenshot, so each is prepared once: concurrent requests for a frame being prepared wait for it
instead of decoding it again, and every user gets the *same* PIL object (a client that caches
its encoded payload per frame then encodes each one once). Callers must not draw on a frame they
got from the cache.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from PIL import Image


def frame_nbytes(image: Image.Image) -> int:
    """Memory Pillow holds for ``image``: every multi-band 8-bit mode (RGB too) takes 4 bytes."""
    per_pixel = 1 if image.mode in ("1", "L", "P") else 4
    return image.width * image.height * per_pixel


class FrameCache:
    """A thread-safe LRU of frames, bounded by memory and/or count, preparing each key once.

    Args:
        max_bytes: Memory bound (``frame_nbytes``); ``None`` for none.
        max_items: Count bound; ``None`` for none. At least one frame is always kept.
    """

    def __init__(self, max_bytes: int | None = None, max_items: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_items = max_items
        self._frames: OrderedDict[Hashable, Image.Image] = OrderedDict()
        self._pending: dict[Hashable, Future[Image.Image]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        """``frames_prepared`` (a preparation ran) and ``frames_evicted``."""

    def get(self, key: Hashable, prepare: Callable[[], Image.Image]) -> Image.Image:
        """The frame stored under ``key``, prepared by ``prepare()`` on its first use.

        Raises:
            Whatever ``prepare`` raises; a failed preparation is not stored, so a later call
            tries again.
        """
        with self._lock:
            frame = self._frames.get(key)
            if frame is not None:
                self._frames.move_to_end(key)
                return frame
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
        if not owner:
            return pending.result()
        try:
            frame = prepare()
        except BaseException as e:
            with self._lock:
                del self._pending[key]
            pending.set_exception(e)
            raise
        with self._lock:
            del self._pending[key]
            self.counts["frames_prepared"] += 1
            self._insert(key, frame)
        pending.set_result(frame)
        return frame

    def peek(self, key: Hashable) -> Image.Image | None:
        """The frame stored under ``key`` (counted as a use), or ``None``: nothing is prepared."""
        with self._lock:
            frame = self._frames.get(key)
            if frame is not None:
                self._frames.move_to_end(key)
            return frame

    def put(self, key: Hashable, frame: Image.Image) -> None:
        """Store a frame prepared elsewhere (it replaces one stored under ``key``)."""
        with self._lock:
            old = self._frames.pop(key, None)
            if old is not None:
                self._bytes -= frame_nbytes(old)
            self._insert(key, frame)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._frames

    def __len__(self) -> int:
        return len(self._frames)

    def clear(self) -> None:
        """Release every frame."""
        with self._lock:
            self._frames.clear()
            self._bytes = 0

    def _insert(self, key: Hashable, frame: Image.Image) -> None:
        self._frames[key] = frame
        self._bytes += frame_nbytes(frame)
        while len(self._frames) > 1 and (
            (self.max_bytes is not None and self._bytes > self.max_bytes)
            or (self.max_items is not None and len(self._frames) > self.max_items)
        ):
            _, old = self._frames.popitem(last=False)
            self._bytes -= frame_nbytes(old)
            self.counts["frames_evicted"] += 1
