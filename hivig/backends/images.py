"""Per-image payload cache: transport form (PNG or JPEG) and pixel digest, once per PIL image.

Callers reuse one decoded frame object for every request that shows the same screenshot, so
encoding it again per request (tens of ms of CPU for a 1 MP frame) is pure waste. The cache keys
on the image *object*: PIL images are mutable and unhashable, so the key is ``id(image)`` and a
weak reference evicts the entry when the image dies (before its id can be reused). No wrapper type
is needed and callers keep passing plain PIL images.

Contract: an image handed to a backend is treated as immutable from then on. A change of size or
mode is noticed and re-encoded, but an in-place pixel edit (``ImageDraw`` on the same object) is
not; draw on a copy instead (``hivig.vision.draw_marks`` already does).

Memory: an entry holds the image's encoded part (about 4/3 of its PNG size) and lives exactly as
long as the image itself, which is always larger, so the cache needs no bound of its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import simplejpeg
from PIL import Image

from hivig.vision import FAST_PNG_LEVEL, encode_png, rgbx_array

ImageFormat = Literal["png", "jpeg"]
IMAGE_FORMATS: tuple[str, ...] = ("png", "jpeg")
"""Transport formats: ``png`` is lossless (the critic path); ``jpeg`` is lossy and several times
cheaper to encode, for senders that only need the model to read the screen (the annotator)."""


def _require_image(image: object) -> Image.Image:
    if not isinstance(image, Image.Image):
        raise TypeError(
            f"image parts must hold PIL images (materialise ImageRef first), got {type(image)!r}"
        )
    return image


def _digest(image: Image.Image, raw: bytes) -> str:
    h = hashlib.sha256()
    h.update(f"{image.mode}:{image.width}x{image.height}:".encode())
    h.update(raw)
    return h.hexdigest()


def _jpeg(image: Image.Image, quality: int) -> bytes:
    # libjpeg-turbo through simplejpeg, straight from the image's own storage: Pillow's JPEG
    # writer holds the GIL for the whole encode, so frames prepared in several threads encoded
    # one at a time; simplejpeg releases it and reads Pillow's 4-byte pixels without a copy.
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    # 4:4:4 keeps the colour of thin text and markers as sharp as the luma.
    return simplejpeg.encode_jpeg(
        rgbx_array(rgb), quality=quality, colorspace="RGBX", colorsubsampling="444"
    )


def _image_part_json(data: bytes, mime: str = "image/png") -> bytes:
    # Base64 is JSON-safe ASCII, so the part is spliced into request bodies without escaping.
    return (
        b'{"type":"image_url","image_url":{"url":"data:'
        + mime.encode()
        + b";base64,"
        + base64.b64encode(data)
        + b'"}}'
    )


def check_transport(image_format: str, jpeg_quality: int) -> None:
    """Validate a transport format and JPEG quality.

    Raises:
        ValueError: Unknown format or quality outside 1..100.
    """
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format must be one of {IMAGE_FORMATS}, got {image_format!r}")
    if not 1 <= jpeg_quality <= 100:
        raise ValueError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")


class _Entry:
    __slots__ = ("digest", "lock", "parts", "ref", "shape")

    def __init__(self, ref: weakref.ref[Image.Image], shape: tuple[str, int, int]) -> None:
        self.ref = ref
        self.shape = shape
        self.lock = threading.Lock()
        self.digest: str | None = None
        # One part per transport (``("png", 0)`` or ``("jpeg", quality)``).
        self.parts: dict[tuple[str, int], bytes] = {}


@dataclass
class ImageCacheStats:
    """Counters of an ``ImagePayloadCache``.

    Attributes:
        encodes: Transport encodings performed (PNG or JPEG).
        digests: Pixel digests computed.
        hits: Lookups answered from the cache.
    """

    encodes: int = 0
    digests: int = 0
    hits: int = 0


class ImagePayloadCache:
    """Thread-safe cache of each live PIL image's pixel digest and OpenAI image part.

    Both are computed lazily (an in-process backend needs only the digest) and at most once per
    image object, even when several threads ask for the same image at once.
    """

    def __init__(self, png_level: int = FAST_PNG_LEVEL) -> None:
        """Create an empty cache.

        Args:
            png_level: zlib level of the transport PNG (0-9).

        Raises:
            ValueError: ``png_level`` is out of range.
        """
        if not 0 <= png_level <= 9:
            raise ValueError(f"png_level must be in 0..9, got {png_level}")
        self.png_level = png_level
        self.stats = ImageCacheStats()
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def digest(self, image: Image.Image) -> str:
        """SHA-256 of the image's mode, size and raw pixels (``hivig.backends.image_digest``).

        Raises:
            TypeError: ``image`` is not a PIL image.
        """
        entry = self._entry(_require_image(image))
        with entry.lock:
            if entry.digest is None:
                entry.digest = _digest(image, image.tobytes())
                self._count("digests")
            else:
                self._count("hits")
            return entry.digest

    def image_part(
        self, image: Image.Image, image_format: ImageFormat = "png", jpeg_quality: int = 95
    ) -> bytes:
        """The OpenAI ``image_url`` content part of the image, as UTF-8 JSON bytes.

        Args:
            image: The image.
            image_format: ``png`` (lossless, default) or ``jpeg``.
            jpeg_quality: JPEG quality (1-100), used for ``jpeg`` only.

        Raises:
            TypeError: ``image`` is not a PIL image.
            ValueError: Unknown format or quality out of range.
        """
        check_transport(image_format, jpeg_quality)
        key = _transport_key(image_format, jpeg_quality)
        entry = self._entry(_require_image(image))
        with entry.lock:
            part = entry.parts.get(key)
            if part is None:
                # No pixel digest here: ``digest`` computes it on demand, and a caller that
                # names its requests itself never asks for one.
                if image_format == "jpeg":
                    part = _image_part_json(_jpeg(image, jpeg_quality), "image/jpeg")
                else:
                    part = _image_part_json(encode_png(image, self.png_level))
                entry.parts[key] = part
                self._count("encodes")
            else:
                self._count("hits")
            return part

    def prime_png(self, image: Image.Image, png: bytes, level: int) -> bool:
        """Adopt ``png``, the caller's ``encode_png(image, level)``, as the image's PNG part.

        For a caller that encodes the frame anyway (the gateway names screens by their PNG), so
        the transport does not encode it a second time. Nothing is stored when ``level`` is not
        this cache's level (the bytes would differ from what it sends) or a part is already
        there.

        Returns:
            Whether the part was stored.

        Raises:
            TypeError: ``image`` is not a PIL image.
        """
        if level != self.png_level:
            return False
        key = _transport_key("png", 0)
        entry = self._entry(_require_image(image))
        with entry.lock:
            if key in entry.parts:
                return False
            entry.parts[key] = _image_part_json(png)
        return True

    def data_url(
        self, image: Image.Image, image_format: ImageFormat = "png", jpeg_quality: int = 95
    ) -> str:
        """The ``data:image/...;base64,...`` URL the image is sent as.

        Raises:
            TypeError: ``image`` is not a PIL image.
            ValueError: Unknown format or quality out of range.
        """
        part = json.loads(self.image_part(image, image_format, jpeg_quality))
        return str(part["image_url"]["url"])

    def has_part(
        self, image: object, image_format: ImageFormat = "png", jpeg_quality: int = 95
    ) -> bool:
        """Whether ``image``'s part in this transport is ready (no encoding needed)."""
        entry = self._entries.get(id(image))
        return (
            entry is not None
            and _transport_key(image_format, jpeg_quality) in entry.parts
            and entry.ref() is image
            and entry.shape == _shape(image)  # type: ignore[arg-type]
        )

    def has_digest(self, image: object) -> bool:
        """Whether ``image``'s pixel digest is ready (no pixels to read)."""
        entry = self._entries.get(id(image))
        return (
            entry is not None
            and entry.digest is not None
            and entry.ref() is image
            and entry.shape == _shape(image)  # type: ignore[arg-type]
        )

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _entry(self, image: Image.Image) -> _Entry:
        key, shape = id(image), _shape(image)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.ref() is not image or entry.shape != shape:
                entry = _Entry(weakref.ref(image, self._evictor(key)), shape)
                self._entries[key] = entry
            return entry

    def _evictor(self, key: int) -> Callable[[weakref.ref[Image.Image]], None]:
        entries = self._entries

        def evict(ref: weakref.ref[Image.Image]) -> None:
            # Runs while the image is being freed, possibly inside a garbage collection that
            # interrupted this cache's own locked section, so it takes no lock: two atomic dict
            # operations suffice, because no live image can hold this id until the dead one is
            # gone. The check skips an entry already replaced (size or mode changed).
            entry = entries.get(key)
            if entry is not None and entry.ref is ref:
                entries.pop(key, None)

        return evict


def _transport_key(image_format: str, jpeg_quality: int) -> tuple[str, int]:
    return (image_format, jpeg_quality if image_format == "jpeg" else 0)


def _shape(image: Image.Image) -> tuple[str, int, int]:
    return image.mode, image.width, image.height


_DEFAULT = ImagePayloadCache()


def default_image_cache() -> ImagePayloadCache:
    """The process-wide cache the backends and ``request_hash`` use."""
    return _DEFAULT
