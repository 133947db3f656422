"""The canonical frame: decode → RGB → smart_resize → markers, plus deterministic PNG bytes.

Every screenshot the model sees (data_gen, train, serve) goes through ``canonical_frame``, so the
pixels used for training and for serving cannot drift apart. Processors are then called with
``do_resize=False``.
"""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from hivig.logging import get_logger
from hivig.messages import ChatMessage, ImagePart, ImageRef, Mark, SizeClass
from hivig.vision._markers import draw_marks_inplace
from hivig.vision._policy import CANONICAL, FramePolicy, before_grid
from hivig.vision._resample import resize_bicubic_aa

try:
    import pyarrow as pa
except ImportError:  # a training-only image (the GPU check's) has none: the copying route
    pa = None

logger = get_logger(__name__)

MAX_ASPECT_RATIO = 200
"""Qwen-VL processors reject images whose long/short side ratio reaches this."""

# Resampling: antialiased bicubic (Keys a = -0.5, kernel widened by the scale factor when
# shrinking), computed on uint8 pixels by torch or by ``_resample`` (numpy), which give the same
# pixels bit for bit (see ``resize_kernel``). Bicubic is what the Qwen-VL image processors use
# when they resize, so our frames look like what the vision tower saw in pre-training; the widened
# kernel antialiases small UI text instead of aliasing it as NEAREST would, and LANCZOS rings
# around high-contrast glyph edges. Torch's uint8 kernel gives the same filter as Pillow's
# BICUBIC (within 2 grey levels) at about half the cost on one core, and its integer arithmetic
# gives identical output with and without SIMD on x86 (AVX-512 vs ATEN_CPU_CAPABILITY=default,
# checked bit for bit), so frames do not depend on the CPU that made them.
RESAMPLE = "bicubic"

ImageSource = str | os.PathLike | bytes | bytearray | Image.Image


class ImageError(ValueError):
    """An image cannot be loaded or prepared.

    Attributes:
        reason: Short stable code: ``not_found``, ``unreadable``, ``corrupt``, ``truncated``,
            ``too_large``, ``empty``, ``bad_type``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# --------------------------------------------------------------------------------------------
# Geometry


def smart_resize(
    height: int,
    width: int,
    factor: int = 32,
    min_pixels: int = 65_536,
    max_pixels: int = 1_048_576,
) -> tuple[int, int]:
    """Target ``(height, width)``: multiples of ``factor`` with area in [min, max] pixels.

    Rounds each side to the nearest multiple of ``factor``, then rescales both sides by one
    factor if the area leaves the budget (floor when shrinking, ceil when growing), keeping the
    aspect ratio as closely as the grid allows. Same arithmetic as the Qwen-VL processors:
    1920×1080 at 1,048,576 px gives 768×1344. Unlike
    transformers, a side never rounds to 0 (a 10 px side becomes ``factor``). Growing rounds up,
    so when ``min_pixels`` is close to ``max_pixels`` a small image may end slightly above
    ``max_pixels``, exactly as in transformers.

    Args:
        height: Source height in pixels.
        width: Source width in pixels.
        factor: Both sides become multiples of this (32 for Qwen3-VL: patch 16 × merge 2).
        min_pixels: Lower bound on the area, in pixels.
        max_pixels: Upper bound on the area, in pixels.

    Returns:
        ``(height, width)`` of the canonical frame.

    Raises:
        ValueError: A size or budget is not positive, ``min_pixels > max_pixels``, or the aspect
            ratio is 200 or more.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image sizes must be positive, got {width}x{height}")
    if factor <= 0 or min_pixels <= 0 or max_pixels <= 0:
        raise ValueError("factor, min_pixels and max_pixels must be positive")
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels ({min_pixels}) exceeds max_pixels ({max_pixels})")
    ratio = max(height, width) / min(height, width)
    if ratio >= MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio must be below {MAX_ASPECT_RATIO}, got {ratio:.1f}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# --------------------------------------------------------------------------------------------
# Decoding


def _open(src: ImageSource) -> Image.Image:
    if isinstance(src, Image.Image):
        return src
    if isinstance(src, (bytes, bytearray)):
        if not src:
            raise ImageError("empty", "zero-length image bytes")
        return Image.open(io.BytesIO(bytes(src)))
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if not path.is_file():
            raise ImageError("not_found", f"no image file at {path}")
        if path.stat().st_size == 0:
            raise ImageError("empty", f"zero-length image file {path}")
        return Image.open(path)
    raise ImageError("bad_type", f"expected a path, bytes or PIL image, got {type(src).__name__}")


def _to_rgb(img: Image.Image) -> Image.Image:
    # Transparent pixels have arbitrary colour underneath; flatten onto white so what the model
    # sees is what a viewer shows, and so identical-looking images get identical pixels.
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        flat = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        flat.alpha_composite(rgba)
        return flat.convert("RGB")
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit greyscale: scale to 8 bits instead of clipping at 255.
        img = img.point(lambda v: v / 256).convert("L")
    return img.convert("RGB") if img.mode != "RGB" else img


def _decode(src: ImageSource) -> Image.Image:
    """Decoded RGB image; may be ``src`` itself (unmodified) when it already is plain RGB."""
    try:
        img = _open(src)
        # Decode now so a truncated stream fails here, not later inside a collator.
        img.load()
        if img.width <= 0 or img.height <= 0:
            raise ImageError("empty", f"image has no pixels ({img.width}x{img.height})")
        return _to_rgb(img)
    except Image.DecompressionBombError as e:
        raise ImageError("too_large", str(e)) from e
    except UnidentifiedImageError as e:
        raise ImageError("corrupt", f"not a recognised image: {e}") from e
    except PermissionError as e:
        raise ImageError("unreadable", str(e)) from e
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, ImageError):
            raise
        reason = "truncated" if "truncated" in str(e).lower() else "corrupt"
        raise ImageError(reason, f"cannot decode image: {e}") from e


def load_image(src: ImageSource) -> Image.Image:
    """Decode ``src`` into an RGB PIL image with no metadata.

    EXIF orientation is deliberately not applied: screenshots are captured upright, and the grid
    coordinates of their actions refer to the stored pixel layout.

    Args:
        src: A file path, encoded image bytes, or a PIL image.

    Returns:
        A new, fully decoded RGB image (a PIL ``src`` is never modified or returned).

    Raises:
        ImageError: Missing, unreadable, empty, corrupt, truncated or oversized input, with
            ``reason`` set.
    """
    rgb = _decode(src)
    # Never hand back (and then strip) the caller's own object.
    rgb = rgb.copy() if rgb is src else rgb
    rgb.info = {}
    return rgb


# --------------------------------------------------------------------------------------------
# Canonical frame


def _resized(img: Image.Image, min_pixels: int, max_pixels: int, factor: int) -> Image.Image:
    """A new RGB image of the ``smart_resize`` size without metadata (``img`` is not touched)."""
    h, w = smart_resize(img.height, img.width, factor, min_pixels, max_pixels)
    if (w, h) == img.size:
        out = img.copy()
        out.info = {}
        return out
    return resize_rgb(img, w, h)


def _rgbx_storage(img: Image.Image) -> Any:
    """An RGB image's pixels as 4 bytes per pixel: a DLPack-capable view or a bytearray copy."""
    if pa is not None:
        try:
            # Zero-copy: Pillow's Arrow export of its own storage. Exporting row by row
            # (``tobytes``) costs more than a resize of the frame.
            return pa.array(img).values
        except (pa.ArrowException, TypeError, ValueError):
            pass
    # Images spread over several Pillow memory blocks (about > 16 MB, e.g. 4K) cannot be
    # exported in one piece, nor can any image on Pillow < 11.2 (or without pyarrow): take the
    # copying route.
    return bytearray(img.tobytes("raw", "RGBX"))


def rgbx_array(img: Image.Image) -> np.ndarray:
    """(H, W, 4) uint8 array of an RGB image's pixels in Pillow's 4-bytes-per-pixel layout.

    The fourth byte is padding with no defined value: read channels 0-2 only.

    Args:
        img: An RGB image (treat it as read-only while the array lives).

    Returns:
        A view of the image's own storage where Pillow can export it in one piece (no copy),
        otherwise a copy.
    """
    storage = _rgbx_storage(img)
    flat = (
        np.frombuffer(storage, np.uint8)
        if isinstance(storage, bytearray)
        else np.from_dlpack(storage)
    )
    return flat.reshape(img.height, img.width, 4)


def rgbx_tensor(img: Image.Image) -> Any:
    """``rgbx_array`` as a (H, W, 4) uint8 torch tensor (a view where the array is one)."""
    import torch

    storage = _rgbx_storage(img)
    if isinstance(storage, bytearray):
        flat = torch.frombuffer(storage, dtype=torch.uint8)
    else:
        flat = torch.from_dlpack(storage)
    return flat.view(img.height, img.width, 4)


def resize_rgb(img: Image.Image, width: int, height: int) -> Image.Image:
    """Resize an RGB image with the canonical filter (antialiased bicubic, see ``RESAMPLE``).

    Args:
        img: An RGB image.
        width: Target width in pixels.
        height: Target height in pixels.

    Returns:
        A new RGB image without metadata.
    """
    if resize_kernel() == "torch":
        packed = _resize_torch(img, width, height)
    else:
        packed = resize_bicubic_aa(rgbx_array(img), height, width)
    return Image.frombytes("RGB", (width, height), packed, "raw", "RGBX")


RESIZE_KERNELS = ("auto", "torch", "numpy")


def resize_kernel() -> str:
    """Which implementation resizes: ``torch`` or ``numpy`` (the same pixels, bit for bit).

    ``HIVIG_RESIZE_KERNEL`` chooses; ``auto`` (the default) takes torch when the process has
    already imported it (training, the in-process backend: about 5x faster) and numpy otherwise,
    so a gateway in front of a remote model or a runner never loads torch for a resize.
    """
    kernel = os.environ.get("HIVIG_RESIZE_KERNEL", "auto").strip().lower() or "auto"
    if kernel not in RESIZE_KERNELS:
        raise ValueError(f"HIVIG_RESIZE_KERNEL must be one of {RESIZE_KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return "torch" if "torch" in sys.modules else "numpy"
    if kernel == "torch" and "torch" not in sys.modules:
        # Chosen explicitly: import it at this check (the gateway's start-up calls it), not
        # inside the first request's resize, which would then take a second or more.
        import torch  # noqa: F401
    return kernel


def _resize_torch(img: Image.Image, width: int, height: int) -> np.ndarray:
    # (1, 4, H, W) channels-last view of the pixels; the pad channel is resampled and dropped
    # again on import (RGB results equal the 3-channel path), and the 4-channel layout is torch's
    # native uint8 kernel.
    import torch.nn.functional as F

    pixels = rgbx_tensor(img).unsqueeze(0).permute(0, 3, 1, 2)
    out = F.interpolate(pixels, size=(height, width), mode=RESAMPLE, antialias=True)
    return out[0].permute(1, 2, 0).contiguous().numpy()  # (height, width, 4)


def canonical_frame(
    image: ImageSource,
    *,
    min_pixels: int,
    max_pixels: int,
    factor: int = 32,
    marks: tuple[Mark, ...] | list[Mark] = (),
    size_class: SizeClass | None = None,
    policy: FramePolicy = CANONICAL,
) -> Image.Image:
    """Prepare a screenshot exactly as the model sees it: decode, RGB, resize, draw marks.

    Marks are drawn after resizing, so their size follows the frame, not the source screen. Marks
    outside [0, 1000] are skipped and logged; use ``draw_marks`` to get the count. A profile's
    ``policy`` may move the markers onto the original screenshot and add LlamaFactory's resize
    before the one to the grid (``hivig.vision.FramePolicy``).

    Args:
        image: A path, encoded bytes or a PIL image (never modified).
        min_pixels: Lower bound on the frame area, in pixels.
        max_pixels: Upper bound on the frame area, in pixels (1,048,576 ≈ 1,024 visual tokens).
        factor: Side multiple in pixels (32 for Qwen3-VL).
        marks: Point/arrow marks on the 0–1000 grid.
        size_class: Marker size class from the platform; ``None`` picks by aspect ratio.
        policy: The frame policy of the critic's profile; hivig's own by default.

    Returns:
        A new RGB image of the ``smart_resize`` size.

    Raises:
        ImageError: The image cannot be decoded.
        ValueError: Non-positive budget or an aspect ratio of 200 or more.
    """
    frame, skipped = _policy_frame(_decode(image), policy, marks, size_class, min_pixels,
                                   max_pixels, factor)  # fmt: skip
    if skipped:
        logger.warning("skipped %d of %d marks outside the 0-1000 grid", skipped, len(marks))
    return frame


def _policy_frame(
    image: Image.Image,
    policy: FramePolicy,
    marks: tuple[Mark, ...] | list[Mark],
    size_class: SizeClass | None,
    min_pixels: int,
    max_pixels: int,
    factor: int,
) -> tuple[Image.Image, int]:
    """The frame of a decoded screenshot under ``policy``, and the marks skipped."""
    start, skipped = before_grid(image, policy, marks, size_class)
    frame = _resized(start, min_pixels, max_pixels, factor)
    if policy.markers == "frame":
        skipped += draw_marks_inplace(frame, marks, policy.marker_class(size_class))
    return frame, skipped


def clean_frame_of(
    image: Image.Image, policy: FramePolicy, min_pixels: int, max_pixels: int, factor: int = 32
) -> Image.Image:
    """The unmarked frame of a decoded screenshot under ``policy`` (a new image)."""
    return _policy_frame(image, policy, (), None, min_pixels, max_pixels, factor)[0]


def marked_frame_of(
    image: Image.Image,
    clean: Image.Image,
    policy: FramePolicy,
    marks: tuple[Mark, ...] | list[Mark],
    size_class: SizeClass | None,
    min_pixels: int,
    max_pixels: int,
    factor: int = 32,
) -> tuple[Image.Image, int]:
    """The marked frame of ``image`` whose clean frame is ``clean``.

    Drawn on a copy of ``clean`` where the policy draws on the frame; made again from the
    original ``image`` where it draws before any resize.
    """
    if policy.markers == "frame":
        frame = clean.copy()
        return frame, draw_marks_inplace(frame, marks, policy.marker_class(size_class))
    return _policy_frame(image, policy, marks, size_class, min_pixels, max_pixels, factor)


def materialise(
    messages: list[ChatMessage],
    root: str | os.PathLike,
    *,
    min_pixels: int,
    max_pixels: int,
    factor: int = 32,
    policy: FramePolicy = CANONICAL,
) -> list[ChatMessage]:
    """Replace every ``ImagePart(ImageRef)`` with ``ImagePart(canonical frame with marks)``.

    The input messages are left untouched; image parts that already hold a PIL image are kept
    as they are. A screenshot referenced several times (with different marks) is decoded and
    resized once per call.

    Args:
        messages: Chat messages as built by the prompt builders.
        root: Directory that relative ``ImageRef.path`` values resolve against (corpus root).
        min_pixels: Lower bound on the frame area, in pixels.
        max_pixels: Upper bound on the frame area, in pixels.
        factor: Side multiple in pixels.
        policy: The frame policy of the critic's profile; hivig's own by default.

    Returns:
        New messages whose image parts are RGB PIL images.

    Raises:
        ImageError: A referenced image is missing or cannot be decoded.
    """
    base = Path(root)
    frames: dict[Path, tuple[Image.Image, Image.Image]] = {}
    out: list[ChatMessage] = []
    for message in messages:
        content: list[Any] = []
        for part in message.content:
            if isinstance(part, ImagePart) and isinstance(part.image, ImageRef):
                budget = (min_pixels, max_pixels, factor)
                content.append(ImagePart(_frame_for(part.image, base, frames, budget, policy)))
            else:
                content.append(part)
        out.append(ChatMessage(role=message.role, content=content))
    return out


def _frame_for(
    ref: ImageRef,
    root: Path,
    cache: dict[Path, tuple[Image.Image, Image.Image]],
    budget: tuple[int, int, int],
    policy: FramePolicy,
) -> Image.Image:
    path = Path(ref.path)
    path = path if path.is_absolute() else root / path
    if path not in cache:
        original = _decode(path)
        cache[path] = (original, clean_frame_of(original, policy, *budget))
    original, clean = cache[path]
    frame, skipped = marked_frame_of(original, clean, policy, ref.marks, ref.size_class, *budget)
    if skipped:
        logger.warning("%s: skipped %d marks outside the 0-1000 grid", ref.path, skipped)
    return frame


def reference_marked_image(
    image: ImageSource, marks: tuple[Mark, ...] | list[Mark]
) -> tuple[Image.Image, int]:
    """Compatibility mode for the public HiViG checkpoint: marks on the original resolution.

    Reproduces the reference release: nothing is resized before
    drawing, and the size class comes from the aspect ratio only (portrait → mobile).

    Args:
        image: A path, encoded bytes or a PIL image.
        marks: Point/arrow marks on the 0–1000 grid.

    Returns:
        ``(image, skipped)``: the marked original-size RGB image and the out-of-range count.

    Raises:
        ImageError: The image cannot be decoded.
    """
    img = load_image(image)
    skipped = draw_marks_inplace(img, marks, None)
    return img, skipped
