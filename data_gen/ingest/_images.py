"""Screenshot checks of ingest: cheap header sniffing and the suffix fallback (§2.2)."""

from __future__ import annotations

import os
import posixpath
from collections import Counter
from pathlib import Path

from PIL import Image


def sniff_image(path: str | os.PathLike, mode: str) -> tuple[int, int] | tuple[str, str]:
    """(width, height) of an image, or (reason, message) when it is missing or corrupt.

    ``header`` reads the PNG/JPEG signature and size from the first bytes and checks the end
    marker (IEND / EOI), which catches truncated files without decoding; ``full`` decodes.
    """
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            # A PNG's size is in its first 24 bytes; a JPEG's SOF marker may come after large
            # EXIF/ICC segments, so JPEGs get a longer look.
            head = f.read(32)
            if head[:2] == b"\xff\xd8":
                head += f.read(64 * 1024 - 32)
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64))
            tail = f.read()
    except FileNotFoundError:
        return "missing_image", f"no file {name}"
    except OSError as exc:
        return "missing_image", f"unreadable {name}: {exc.strerror}"
    dims = _png_size(head, tail) if head[:8] == b"\x89PNG\r\n\x1a\n" else _jpeg_size(head, tail)
    if isinstance(dims[0], str) or mode != "full":
        return dims
    try:
        with Image.open(path) as im:
            im.load()
            return im.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return "corrupt_image", f"{name} does not decode: {exc}"


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
    """Finds and checks screenshots, once per path, with the suffix fallback of §2.2."""

    def __init__(self, root: Path, mode: str) -> None:
        self.root = root
        # Plain string joins: pathlib objects cost more than the header read itself.
        self._base = str(root)
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
        result = sniff_image(os.path.join(self._base, rel), self.mode)
        if result[0] == "missing_image":
            alt = self._by_suffix(entry_root, image)
            if alt is not None:
                self.stats["resolved_by_suffix"] += 1
                return alt, sniff_image(os.path.join(self._base, alt), self.mode)
        self.stats[result[0] if isinstance(result[0], str) else "ok"] += 1
        return rel, result

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
