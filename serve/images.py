"""Screenshots by reference: decoded once, stored once, canonical frames cached, marks drawn.

``ImageStore`` is the one owner of a screen's way from the bytes a client sent to the bytes a
model is sent: clean canonical frame -> marked frame (``marked_frame``, ``annotated_image``)
-> PNG payload handed to the transport's cache.

A screenshot arrives inline (base64 PNG/JPEG) or as an ``image_ref`` from an earlier upload. Its
reference names the frame the critic sees: the SHA-256 of the screenshot's size and of its
canonical PNG (the canonical frame, encoded once at ``FAST_PNG_LEVEL`` in bands of rows,
``BandedPng``), so the same screen sent twice, in any encoding, is one reference, and two
screenshots whose canonical frames are equal pixel for pixel (a difference the resize averages
away) are one screen to the critic and one reference (the file kept is the first one sent).
Naming a screen costs a hash over its compressed bytes, not over its megabytes of pixels. A
backend that sends PNGs (the OpenAI transport) is handed that PNG, and a critique's marked copy
re-compresses only the bands under its marks. The bytes, and so the references, depend on the
deflate library: every gateway sharing a state folder runs the same image.

The screenshot itself is stored as a lossless PNG under ``images/<hex>.png`` (traces and
``diagnose`` read it there; a restarted gateway finds it again). The clean canonical frame of
recent screenshots stays in memory, so a critique after its observe only draws markers.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import logging
import math
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from hivig.backends.images import ImagePayloadCache
from hivig.config import FrameConfig
from hivig.files import write_atomic
from hivig.messages import ImageRef, Mark
from hivig.vision import (
    CANONICAL,
    FAST_PNG_LEVEL,
    BandedPng,
    FrameCache,
    FramePolicy,
    ImageError,
    canonical_frame,
    clean_frame_of,
    draw_marks,
    encode_png,
    load_image,
    marked_frame_of,
    marked_rows,
    size_class_for_platform,
)
from serve.errors import ApiError

logger = logging.getLogger(__name__)

REF_PREFIX = "sha256:"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"
FORMATS = ("PNG", "JPEG")
"""The screenshot formats served. Pillow would decode dozens more (TIFF, BMP, ICO, WebP, JPEG
2000, EPS through Ghostscript...): each a parser the gateway need not expose."""


@dataclass(frozen=True)
class StoredImage:
    """A screenshot the gateway holds: its reference, size and path on disk."""

    ref: str
    width: int
    height: int
    path: Path


def decode_base64(data: str) -> bytes:
    """Bytes of a base64 string, with or without a ``data:image/...;base64,`` prefix."""
    if data.startswith("data:"):
        _, _, data = data.partition(",")
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, "bad_image", f"screenshot is not valid base64: {e}") from None


def frame_ref(size: tuple[int, int], canonical_png: bytes) -> str:
    """The reference of a screenshot of ``size`` (width, height) whose canonical frame encodes
    to ``canonical_png`` (``BandedPng.encode(frame, FAST_PNG_LEVEL).png()``).

    The size is part of it because coordinates are read in the screenshot's own pixels: two
    screens of different sizes never share a reference, even where their frames are equal.
    The PNG's bytes depend only on the pixels (for one deflate library), so equal frames give
    equal references.
    """
    h = hashlib.sha256(f"{size[0]}x{size[1]}:".encode())
    h.update(canonical_png)
    return REF_PREFIX + h.hexdigest()


class ImageStore:
    """Decoded screenshots on disk plus an LRU of their clean canonical frames.

    Thread-safe: requests decode and write in worker threads.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        frame: FrameConfig,
        *,
        max_bytes: int,
        max_pixels: int,
        cache_size: int = 256,
        large_pixels: int | None = None,
        large_lanes: int = 1,
        payloads: ImagePayloadCache | None = None,
        policy: FramePolicy = CANONICAL,
    ) -> None:
        """Store under ``root`` (created); frames follow ``frame``'s pixel budget; screenshots
        over ``large_pixels`` are decoded ``large_lanes`` at a time (``put_inline``).

        ``payloads`` is the payload cache of a backend that sends frames as PNGs at
        ``FAST_PNG_LEVEL`` (the OpenAI transport's, ``default_image_cache()``): each new
        frame's PNG and each marked copy's are handed to it, so that backend encodes nothing
        again. ``None`` (an in-process model, a JPEG transport), or a cache at another PNG
        level: nothing is handed over, and no bands are kept.

        ``policy`` is the frame policy of the profile served (``hivig.vision.FramePolicy``):
        the clean frames are made under it.
        """
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.frame = frame
        self.policy = policy
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.large_pixels = max_pixels if large_pixels is None else large_pixels
        self._large_lanes = asyncio.Semaphore(large_lanes)
        self.write_errors = 0
        """Screenshots that could not be written to disk (kept in memory only)."""
        # Only a cache that sends PNGs at this level can take the PNGs made here.
        fits = payloads is not None and payloads.png_level == FAST_PNG_LEVEL
        self._payloads = payloads if fits else None
        self._frames = FrameCache(max_items=cache_size)
        # The clean frames' PNGs in bands (compressed bytes only), for their marked copies.
        self._bands: OrderedDict[str, BandedPng] = OrderedDict()
        self._sizes: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # Image work has threads of its own, so decoding a screenshot never waits behind model
        # calls an in-process backend runs in the default executor.
        self.pool = ThreadPoolExecutor(
            max_workers=os.cpu_count() or 2, thread_name_prefix="hivig-img"
        )

    # -- writing -------------------------------------------------------------------------------

    def put_bytes(self, data: bytes) -> StoredImage:
        """Decode, check and store an encoded screenshot; returns its reference.

        Raises:
            ApiError: 413 ``image_too_large``, 415 ``bad_image`` (neither PNG nor JPEG) or
                400 ``bad_image`` (empty, not decodable, or past the size checks).
        """
        if len(data) > self.max_bytes:
            raise ApiError(
                413, "image_too_large", f"screenshot is {len(data)} bytes (max {self.max_bytes})"
            )
        if not data:
            raise ApiError(400, "bad_image", "screenshot is empty")
        require_png_or_jpeg(data)
        image = self._decode(data)
        frame = self._canonical(image)
        banded = BandedPng.encode(frame, FAST_PNG_LEVEL)
        png = banded.png()
        ref = frame_ref(image.size, png)
        path = self.path_of(ref)
        if not path.exists():
            # PNG input is stored as sent (lossless already): no re-encode on the request path.
            payload = data if data.startswith(_PNG_MAGIC) else encode_png(image, FAST_PNG_LEVEL)
            self._write(path, payload)
        self._remember_size(ref, image.size)
        if self._payloads is not None:
            self._payloads.prime_png(frame, png, FAST_PNG_LEVEL)
            with self._lock:
                self._bands[ref] = banded
                self._bands.move_to_end(ref)
                while len(self._bands) > self._cache_size:
                    self._bands.popitem(last=False)
        self._frames.put(ref, frame)
        return StoredImage(ref, image.width, image.height, path)

    def prime_marked(self, ref: str, marked: Image.Image, rows: tuple[int, int]) -> bool:
        """Hand the transport the PNG of ``marked``, the clean frame of ``ref`` with marks drawn
        only in ``rows`` (``marked_rows``), from the clean frame's bands: only the bands the
        marks touch are compressed.

        Returns:
            Whether it was handed over: not without a payload cache, nor once the bands of
            ``ref`` are gone from their LRU (the transport then encodes the whole marked frame
            itself).
        """
        if self._payloads is None:
            return False
        with self._lock:
            banded = self._bands.get(ref)
            if banded is not None:
                self._bands.move_to_end(ref)  # as recently used as its frame
        if banded is None or marked.size != (banded.width, banded.height):
            return False
        return self._payloads.prime_png(marked, banded.patched(marked, *rows), banded.level)

    def put_base64(self, data: str) -> StoredImage:
        """``put_bytes`` of a base64 string."""
        return self.put_bytes(decode_base64(data))

    async def put_inline(self, data: str, wait_s: float) -> StoredImage:
        """``put_base64`` on the image threads, a large screenshot in its own lane.

        A screenshot over ``large_pixels`` waits for a free lane up to ``wait_s`` (then 429
        ``overloaded``), so a client sending huge images delays only itself: at least one image
        thread stays free for ordinary screens.
        """
        loop = asyncio.get_running_loop()
        stored, raw, pixels = await loop.run_in_executor(self.pool, self._put_unless_large, data)
        if stored is not None:
            return stored
        try:
            await asyncio.wait_for(self._large_lanes.acquire(), wait_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise ApiError(
                429,
                "overloaded",
                f"large screenshots ({pixels} px) are decoded a few at a time; retry later",
                {"Retry-After": str(max(1, math.ceil(wait_s)))},
            ) from None
        try:
            return await loop.run_in_executor(self.pool, self.put_bytes, raw)
        finally:
            self._large_lanes.release()

    def _put_unless_large(self, data: str) -> tuple[StoredImage | None, bytes, int]:
        """``put_base64`` in this thread (one hop for an ordinary screen), or, for a large
        screenshot, only its bytes and area: it waits for a lane first."""
        raw, pixels = _decoded_and_area(data)
        # Over the limit is refused at once (400), never after waiting for a lane.
        if pixels <= self.large_pixels or pixels > self.max_pixels:
            return self.put_bytes(raw), raw, pixels
        return None, raw, pixels

    def _write(self, path: Path, payload: bytes) -> None:
        # A screenshot that cannot be written (a read-only or full disk) is still served from
        # memory: the step goes on, only a later diagnosis lacks its picture.
        try:
            # Not synced: a screenshot lost to a crash is sent again by the runner's next step.
            write_atomic(path, payload, durable=False, mkdir=False)
        except OSError as e:
            with self._lock:
                self.write_errors += 1
                first = self.write_errors == 1
            (logger.error if first else logger.debug)(
                "screenshot not stored (%s): %s; served from memory", path.name, e.strerror or e
            )

    def _decode(self, data: bytes) -> Image.Image:
        try:
            with Image.open(io.BytesIO(data), formats=FORMATS) as probe:
                w, h = probe.size
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            raise ApiError(400, "bad_image", f"screenshot cannot be decoded: {_clean(e)}") from None
        if w * h > self.max_pixels:
            raise ApiError(400, "bad_image", f"screenshot is {w}x{h} (max {self.max_pixels} px)")
        try:
            image = load_image(data)
        except (ImageError, ValueError) as e:
            raise ApiError(400, "bad_image", f"screenshot cannot be decoded: {_clean(e)}") from None
        if min(image.size) < 1 or max(image.size) / min(image.size) >= 200:
            raise ApiError(400, "bad_image", f"screenshot size {w}x{h} is unusable")
        return image

    def _canonical(self, image: Image.Image) -> Image.Image:
        if not self.policy.is_canonical:
            f = self.frame
            return clean_frame_of(image, self.policy, f.min_pixels, f.max_pixels, f.factor)
        return canonical_frame(
            image,
            min_pixels=self.frame.min_pixels,
            max_pixels=self.frame.max_pixels,
            factor=self.frame.factor,
        )

    def original(self, ref: str) -> Image.Image:
        """The stored screenshot of ``ref`` at its own resolution, decoded (read from disk)."""
        return load_image(self.require(ref))

    def _remember_size(self, ref: str, size: tuple[int, int]) -> None:
        with self._lock:
            self._sizes[ref] = size
            self._sizes.move_to_end(ref)
            while len(self._sizes) > 16 * self._cache_size:
                self._sizes.popitem(last=False)

    def close(self) -> None:
        """Stop the image threads."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- reading -------------------------------------------------------------------------------

    def path_of(self, ref: str) -> Path:
        """Where a reference's PNG lives (it may not exist)."""
        return self.root / f"{_hex(ref)}.png"

    def has(self, ref: str) -> bool:
        """Whether the reference is known (in memory or on disk)."""
        return ref in self._frames or (_valid(ref) and self.path_of(ref).exists())

    def known(self, ref: str) -> StoredImage:
        """The stored screenshot of ``ref`` (in memory or on disk), or 404 ``unknown_image_ref``."""
        with self._lock:
            size = self._sizes.get(ref)
        if size is None or ref not in self._frames:
            self.require(ref)
            size = self.size(ref)
        return StoredImage(ref, size[0], size[1], self.path_of(ref))

    def size(self, ref: str) -> tuple[int, int]:
        """``(width, height)`` of the original screenshot."""
        with self._lock:
            if ref in self._sizes:
                return self._sizes[ref]
        with Image.open(self.require(ref)) as im:
            return im.size

    def require(self, ref: str) -> Path:
        """The stored file of ``ref``, or 404 ``unknown_image_ref``."""
        if not _valid(ref) or not self.path_of(ref).exists():
            raise ApiError(404, "unknown_image_ref", f"no screenshot {ref!r}; send it inline")
        return self.path_of(ref)

    def cached_frame(self, ref: str) -> Image.Image | None:
        """The clean canonical frame of ``ref`` if it is in memory (nothing is read from disk)."""
        return self._frames.peek(ref)

    def clean_frame(self, ref: str) -> Image.Image:
        """The clean canonical frame of ``ref`` (shared: callers must not draw on it)."""
        return self._frames.get(ref, lambda: self._from_disk(ref))

    # -- marked frames: what the model and the caller see -------------------------------------

    def marked_frame(self, ref: ImageRef) -> Image.Image:
        """The frame of a prompt's image: the clean frame of ``ref.path`` with ``ref.marks``.

        A frame without marks is the cached object itself (nobody draws on it): the transport's
        payload cache then encodes each screen once, not once per prompt it appears in (the
        "after" of one step is the next "before"). A marked copy's PNG is handed to the
        transport from the clean frame's bands (``prime_marked``).
        """
        clean = self.clean_frame(ref.path)
        policy = self.policy
        if ref.marks and not policy.is_canonical:
            # Markers drawn before a resize (a LlamaFactory-trained profile) need the original.
            f = self.frame
            original = self.original(ref.path) if policy.markers == "original" else clean
            return marked_frame_of(
                original,
                clean,
                policy,
                ref.marks,
                ref.size_class,
                f.min_pixels,
                f.max_pixels,
                f.factor,
            )[0]
        if not ref.marks:
            return clean
        marked = draw_marks(clean, ref.marks, ref.size_class).image
        rows = marked_rows(ref.marks, *marked.size, ref.size_class)
        self.prime_marked(ref.path, marked, rows)
        return marked

    def annotated_image(self, ref: str, marks: list[Mark], platform: str) -> str:
        """``annotated_image`` of a verdict: the frame of ``ref`` with ``marks``, as a PNG data
        URL (what ``return_image`` asks for)."""
        image = draw_marks(self.clean_frame(ref), marks, size_class_for_platform(platform)).image
        png = encode_png(image, FAST_PNG_LEVEL)
        return "data:image/png;base64," + base64.b64encode(png).decode()

    def _from_disk(self, ref: str) -> Image.Image:
        image = load_image(self.require(ref))
        self._remember_size(ref, image.size)
        return self._canonical(image)


def _valid(ref: str) -> bool:
    hexpart = ref[len(REF_PREFIX) :] if ref.startswith(REF_PREFIX) else ""
    return len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart)


def _hex(ref: str) -> str:
    if not _valid(ref):
        raise ApiError(404, "unknown_image_ref", f"malformed image_ref {ref!r}")
    return ref[len(REF_PREFIX) :]


def _decoded_and_area(data: str) -> tuple[bytes, int]:
    """The bytes of a base64 screenshot and its area from the header (nothing decoded yet)."""
    raw = decode_base64(data)
    if not _png_or_jpeg(raw):
        return raw, 0  # put_bytes refuses it before Pillow sees it
    try:
        with Image.open(io.BytesIO(raw), formats=FORMATS) as probe:
            w, h = probe.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return raw, 0  # put_bytes reports it, in the ordinary lane
    return raw, w * h


def _png_or_jpeg(data: bytes) -> bool:
    return data.startswith((_PNG_MAGIC, _JPEG_MAGIC))


def require_png_or_jpeg(data: bytes) -> None:
    """Refuse a screenshot that is not PNG or JPEG by its first bytes (415 ``bad_image``),
    before any image parser reads it."""
    if not _png_or_jpeg(data):
        raise ApiError(
            415, "bad_image", "screenshot is neither PNG nor JPEG; send it as PNG or JPEG"
        )


_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def _clean(error: Exception) -> str:
    """An error's text without object reprs (Pillow names its ``BytesIO`` by memory address)."""
    return _OBJECT_REPR.sub("", str(error)).strip() or type(error).__name__
