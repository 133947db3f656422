"""Screenshot checks of ingest: cheap header sniffing and the suffix fallback."""

from __future__ import annotations

import os
import posixpath
import stat
import warnings
from collections import Counter
from pathlib import Path

from PIL import Image

HEAD_BYTES = 64 * 1024
"""Bytes read from the start of a JPEG to find its size (SOF may follow large EXIF/ICC data)."""
TAIL_BYTES = 64
"""Bytes read from the end of a file to find its end marker."""


def max_pixels() -> int:
    """Largest image area ingest accepts: Pillow's decompression-bomb limit.

    A header that announces more pixels than this is a decompression bomb (a small file that
    decodes into gigabytes); it is refused from the header, before anything decodes it.
    """
    return int(Image.MAX_IMAGE_PIXELS or 89_478_485)


def sniff_image(path: str | os.PathLike, mode: str) -> tuple[int, int] | tuple[str, str]:
    """(width, height) of an image, or (reason, message) when it is missing or corrupt.

    ``header`` reads the PNG/JPEG signature and size from the first bytes and checks the end
    marker (IEND / EOI), which catches truncated files without decoding; ``full`` decodes.
    Only regular files are read, and only a bounded number of bytes of them: the file is
    opened without blocking and checked with ``fstat`` before any read, so a FIFO or a device
    (``/dev/zero``) named as a screenshot can neither hang ingest nor exhaust its memory.
    """
    name = os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return "missing_image", f"no file {name}"
    except OSError as exc:
        return "missing_image", f"unreadable {name}: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "image_not_a_file", f"{name} is not a regular file"
        head = os.pread(fd, 32, 0)
        if head[:2] == b"\xff\xd8":
            head = os.pread(fd, HEAD_BYTES, 0)
        tail = os.pread(fd, TAIL_BYTES, max(0, st.st_size - TAIL_BYTES))
    except OSError as exc:
        return "missing_image", f"unreadable {name}: {exc.strerror}"
    finally:
        os.close(fd)
    dims = _png_size(head, tail) if head[:8] == b"\x89PNG\r\n\x1a\n" else _jpeg_size(head, tail)
    if isinstance(dims[0], str):
        return dims
    if dims[0] * dims[1] > max_pixels():  # type: ignore[operator]
        return "corrupt_image", f"{name} announces {dims[0]}x{dims[1]} pixels (decompression bomb)"
    if mode != "full":
        return dims
    return decode_check(path)


def decode_check(path: str | os.PathLike) -> tuple[int, int] | tuple[str, str]:
    """(width, height) when the image decodes completely, else ``("corrupt_image", why)``.

    Decompression-bomb warnings count as errors here: an image that passed the header check
    but decodes into more pixels than allowed is refused, never half-loaded.
    """
    name = os.path.basename(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()
                return im.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return "corrupt_image", f"{name} does not decode: {exc}"
    except Image.DecompressionBombWarning as exc:
        return "corrupt_image", f"{name} is a decompression bomb: {exc}"


def _png_size(head: bytes, tail: bytes) -> tuple[int, int] | tuple[str, str]:
    if len(head) < 24 or head[12:16] != b"IHDR":
        return "corrupt_image", "PNG without an IHDR header"
    if b"IEND" not in tail[-12:]:
        return "corrupt_image", "PNG truncated (no IEND chunk at the end)"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _jpeg_size(head: bytes, tail: bytes) -> tuple[int, int] | tuple[str, str]:
    if head[:2] != b"\xff\xd8":
        return "corrupt_image", "neither PNG nor JPEG signature"
    if b"\xff\xd9" not in tail:
        return "corrupt_image", "JPEG truncated (no end-of-image marker)"
    i = 2
    while i + 9 < len(head):
        if head[i] != 0xFF:
            return "corrupt_image", "JPEG marker stream broken"
        marker = head[i + 1]
        seg = int.from_bytes(head[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            return int.from_bytes(head[i + 7 : i + 9], "big"), int.from_bytes(
                head[i + 5 : i + 7], "big"
            )
        i += 2 + seg
    return "corrupt_image", "JPEG size not found in the first 64 KiB"


class ImageResolver:
    """Finds and checks screenshots, once per path, with the suffix fallback."""

    def __init__(self, root: Path, mode: str) -> None:
        self.root = root
        # Plain string joins: pathlib objects cost more than the header read itself.
        self._base = str(root)
        self._real = os.path.realpath(root)
        self.mode = mode
        self._checked: dict[str, tuple[str, tuple]] = {}
        self._suffix: dict[str, dict[str, str | None]] = {}
        self.stats: Counter[str] = Counter()

    def check(self, entry_root: str, image: str, size: tuple[int, int]) -> tuple[str, tuple]:
        """(corpus-relative path, result) where result is (w, h) or (reason, message)."""
        rel = posixpath.normpath(f"{entry_root}/{image}" if entry_root else image)
        if rel not in self._checked:
            self._checked[rel] = self._check(rel, entry_root, image)
        path, result = self._checked[rel]
        if isinstance(result[0], int) and tuple(result) != size:
            self.stats["size_mismatch"] += 1
        return path, result

    def _check(self, rel: str, entry_root: str, image: str) -> tuple[str, tuple]:
        if self.mode == "none":
            return rel, ("unchecked", "unchecked")  # type: ignore[return-value]
        result = self._sniff(rel)
        if result[0] == "missing_image":
            alt = self._by_suffix(entry_root, image)
            if alt is not None:
                self.stats["resolved_by_suffix"] += 1
                return alt, self._sniff(alt)
        self.stats[result[0] if isinstance(result[0], str) else "ok"] += 1
        return rel, result

    def _sniff(self, rel: str) -> tuple:
        """``sniff_image`` of a corpus-relative path that, symlinks resolved, stays inside."""
        full = os.path.join(self._base, rel)
        real = os.path.realpath(full)
        if os.path.lexists(full) and not (
            real == self._real or real.startswith(self._real + os.sep)
        ):
            return "image_outside_corpus", f"{posixpath.basename(rel)} leads out of the corpus"
        return sniff_image(full, self.mode)

    def _by_suffix(self, entry_root: str, image: str) -> str | None:
        # Index the batch folder (data/data_YYYYMMDD) by the last three path parts, once.
        batch = "/".join(entry_root.split("/")[:2])
        if batch not in self._suffix:
            index: dict[str, str | None] = {}
            base = self.root / batch
            if base.is_dir():
                for p in base.rglob("*"):
                    if p.is_file():
                        rel = p.relative_to(self.root).as_posix()
                        tail = "/".join(rel.split("/")[-3:])
                        index[tail] = None if tail in index else rel  # None marks a collision
            self._suffix[batch] = index
        return self._suffix[batch].get("/".join(image.split("/")[-3:]))
