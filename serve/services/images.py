"""Screenshots as requests give them: inline, as an image object, or by reference; uploads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from serve.images import ImageStore, StoredImage
from serve.protocol import ImageObject, ImageStored, ImageUpload
from serve.services.answers import Versions

T = TypeVar("T")


class ImageService:
    """``POST /v1/images``, and the screenshots of the other routes' bodies (``ImageStore``)."""

    def __init__(self, store: ImageStore, wait_s: float, versions: Versions) -> None:
        """Screenshots in ``store``; a large one waits for a lane up to ``wait_s``."""
        self.store = store
        self.wait_s = wait_s
        self.versions = versions

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """Run image work (decode, resize, fingerprints, marks) on the image threads."""
        return await asyncio.get_running_loop().run_in_executor(self.store.pool, fn, *args)

    async def image(
        self, inline: str | ImageObject | None, ref: str | None = None
    ) -> StoredImage | None:
        """The screenshot a body gives inline (base64, or an image object) or by reference."""
        if isinstance(inline, ImageObject):
            inline, ref = inline.screenshot, inline.image_ref or ref
        if inline is not None:
            return await self.store.put_inline(inline, self.wait_s)
        if ref is not None:
            return await self.cpu(self.store.known, ref)
        return None

    async def upload(self, req: ImageUpload) -> ImageStored:
        """``POST /v1/images``."""
        start = time.perf_counter()
        stored = await self.store.put_inline(req.image, self.wait_s)
        return ImageStored.model_construct(
            image_ref=stored.ref,
            w=stored.width,
            h=stored.height,
            timing_ms={"total": round((time.perf_counter() - start) * 1000, 2)},
            **self.versions(),
        )
