"""Antialiased bicubic resize of uint8 pixels in numpy, bit-identical to torch's uint8 kernel.

``resize_bicubic_aa(pixels, h, w)`` returns exactly what
``F.interpolate(t, size=(h, w), mode="bicubic", antialias=True)`` returns for a uint8 tensor on
CPU, so a process without torch (the serving gateway) makes the same frames as training did.
``tests/hivig/vision/test_vision_resample.py`` checks the equality against torch, pixel for pixel.

What torch does (``aten/src/ATen/native/cpu/UpSampleKernel.cpp``: ``_compute_index_ranges_weights``
and ``_compute_index_ranges_int16_weights``; the AVX2 route in ``UpSampleKernelAVXAntialias.h``
uses the same weights and integer sums), and so what this module does:

- Separable: a horizontal pass over every input row, its result rounded and clamped to uint8, then
  a vertical pass over that uint8 image. An axis whose size does not change is not resampled.
- Per axis, in float64: ``scale = in / out``; the support is ``2 * scale`` when shrinking (the Keys
  cubic, a = -0.5, widened by the scale) and 2 when growing; output ``i`` centres at
  ``scale * (i + 0.5)`` and covers input ``[xmin, xmin + size)``, clipped to the image; its
  weights are the cubic at ``(xmin + j - centre + 0.5) / max(scale, 1)``, divided by their sum.
- The weights become integers ``round_half_away(w * 2**p)``, with ``p`` the largest precision
  (at most 22) that keeps the largest weight of the axis below 2**15.
- Each output value is ``clamp((2**(p-1) + sum_j w_j * pixel_j) >> p, 0, 255)``: integer sums,
  so the order of the sum (and SIMD or not) cannot change a result.

Every float64 operation of the weight computation is done in torch's order, in the same IEEE
arithmetic (the sum of the weights included, which is why it is a loop and not ``np.sum``).

torch 2.14 on x86 runs its AVX kernel on AVX2 and AVX-512 CPUs alike, and its scalar fallback
without AVX2 (``ATEN_CPU_CAPABILITY=default``). Both equal this module, except that the fallback
repeats output row 0 down the whole column when the output is 1 pixel wide (a torch bug; frame
sizes are multiples of 32). ARM CPUs were not checked.

Speed: the horizontal pass gathers whole pixels as 4-byte words and sums taps with one integer
``einsum``; the vertical pass is one BLAS matrix-vector product per output row, exact in float
(see ``_vertical_gemv``). At 1920x1080 -> 1344x768 on one core this takes about 20 ms, like
Pillow's own bicubic, where torch's C kernel takes 2-4 ms.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

_KEYS_A = -0.5
"""Keys' cubic convolution parameter torch (and Pillow) use for antialiased bicubic."""
_MAX_PRECISION = 22
"""torch's cap on the fixed-point precision of the weights."""
_BLOCK_BYTES = 3 << 19
"""Working buffers per block of rows (1.5 MiB): they stay in a core's L2 (or near L3) cache."""
_GEMV_MIN_ROW = 1024
"""Values per row from which the vertical pass makes one BLAS call per output row."""


class _AxisTaps(NamedTuple):
    """Fixed-point weights of one axis, ``in_size -> out_size``.

    Attributes:
        start: (out,) int64 first input index of each output (torch's ``xmin``).
        weights: (out, taps) int32 weights scaled by ``2**precision``; 0 past an output's window.
        precision: Fixed-point bits of ``weights``.
        acc_dtype: int32 where no sum can overflow it (always, in practice), else int64.
        f32_exact: Every partial sum is an integer below 2**24, so float32 arithmetic on
            ``weights / 2**precision`` is exact in any order (with or without FMA).
    """

    start: np.ndarray
    weights: np.ndarray
    precision: int
    acc_dtype: type
    f32_exact: bool


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic at ``x``, with torch's operation order (``cubic_convolution1`` and ``2``)."""
    a = _KEYS_A
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@functools.lru_cache(maxsize=32)
def axis_taps(in_size: int, out_size: int) -> _AxisTaps:
    """Index ranges and fixed-point weights torch uses to resample one axis.

    Cached: the gateway resizes the same screen size at every step.

    Args:
        in_size: Input length along the axis, in pixels.
        out_size: Output length along the axis, in pixels.

    Returns:
        The axis' taps; the arrays are read-only.
    """
    scale = in_size / out_size  # (double)in / out, as torch without an explicit scale factor
    support = 2.0 * scale if scale >= 1.0 else 2.0
    max_taps = math.ceil(support) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0

    centre = scale * (np.arange(out_size) + 0.5)
    # static_cast<int64_t> truncates towards zero, as astype does.
    start = np.maximum((centre - support + 0.5).astype(np.int64), 0)
    size = np.minimum((centre + support + 0.5).astype(np.int64), in_size) - start
    size = np.clip(size, 0, max_taps)

    j = np.arange(max_taps)
    inside = j < size[:, None]
    w = _keys_cubic(((start[:, None] + j).astype(np.float64) - centre[:, None] + 0.5) * invscale)
    w = np.where(inside, w, 0.0)
    # torch sums the weights left to right; np.sum would pair them up (other rounding).
    total = np.zeros(out_size)
    for k in range(max_taps):
        total += w[:, k]
    normed = total != 0.0  # torch leaves an all-zero window's weights as they are
    w[normed] /= total[normed, None]
    wt_max = max(0.0, float(w[normed].max(initial=0.0)))

    precision = 0
    while precision < _MAX_PRECISION:
        if int(0.5 + wt_max * (1 << (precision + 1))) >= 1 << 15:
            break
        precision += 1
    v = w * (1 << precision)
    weights = np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int32)
    weights = weights[:, : max(1, int(size.max()))]  # columns past every window are all 0

    # No accumulator can overflow. For any uint8 pixels x, |2**(p-1) + sum_j w_j x_j| and every
    # partial sum of it (in any order) is at most bound = 2**(p-1) + 255 * max_i sum_j |w_ij|,
    # computed below from this very table, and int32 is used only when bound < 2**31. It always
    # is: 2**p * wt_max < 2**15 and p <= 22, and the negative lobes of the cubic keep
    # sum_j |w_ij| within ~1.33 * 2**p; over 2,741 axis pairs up to 20000 -> 1 the largest bound
    # is 0.58 * 2**31 (p = 22), and it is < 1 % of 2**31 for screen sizes. (torch sums in a
    # 32-bit int too; int64 would only guard a table where torch itself overflowed.) The same
    # bound below 2**24 makes float32 sums of ``w / 2**p`` exact (``f32_exact``).
    bound = (1 << (precision - 1)) + 255 * int(np.abs(weights).sum(axis=1).max())
    acc_dtype = np.int32 if bound < 2**31 else np.int64
    for arr in (start, weights):
        arr.flags.writeable = False
    return _AxisTaps(start, weights, precision, acc_dtype, bound < 2**24)


def _aligned_windows(taps: _AxisTaps, in_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Window starts kept inside the axis, with the weights shifted to match.

    Every output reads ``taps`` consecutive inputs from its start on; near the far edge the start
    moves back and the weights move right (a window's weights past ``in_size`` are 0).

    Returns:
        ``starts`` (out,) int64 and ``weights`` (out, taps), the dtype of ``taps.weights``.
    """
    n_taps = taps.weights.shape[1]
    starts = np.minimum(taps.start, in_size - n_taps)
    j = np.arange(n_taps) - (taps.start - starts)[:, None]  # tap of the original window
    weights = np.take_along_axis(taps.weights, np.maximum(j, 0), axis=1)
    return starts, np.where(j >= 0, weights, 0).astype(taps.weights.dtype)


@functools.lru_cache(maxsize=32)
def _row_plan(
    in_size: int, out_size: int, words: bool, item_stride: int, channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gather indices and per-byte weights of the horizontal pass.

    Args:
        in_size: Input width in pixels.
        out_size: Output width in pixels.
        words: The row holds one 4-byte word per pixel (``_pixel_words``), else bytes.
        item_stride: Bytes from one pixel to the next in a byte row (ignored for words).
        channels: Channels per pixel.

    Returns:
        ``cols`` (taps, items) indices into a row of what each tap gathers, and ``wts`` (taps,
        bytes) the weight of every gathered byte (0 for a word's padding bytes); read-only.
    """
    taps = axis_taps(in_size, out_size)
    starts, weights = _aligned_windows(taps, in_size)
    n_taps = weights.shape[1]
    pixel = starts[None, :] + np.arange(n_taps)[:, None]  # (taps, out) input pixel of each tap
    if words:
        cols, lanes = pixel, 4
    else:
        cols = (pixel[:, :, None] * item_stride + np.arange(channels)).reshape(n_taps, -1)
        lanes = channels
    used = np.arange(lanes) < channels
    wts = (weights.T[:, :, None].astype(taps.acc_dtype) * used).reshape(n_taps, -1)
    cols = cols.astype(np.intp)
    for arr in (cols, wts):
        arr.flags.writeable = False
    return cols, wts


def _pixel_words(pixels: np.ndarray) -> np.ndarray:
    """(H, W) uint32 array holding each pixel's 3 or 4 bytes in one word (the rest is padding).

    A view where the caller's memory already holds 4 aligned bytes per pixel (RGBX storage, or an
    RGB view of it), else a copy, which costs about 0.6 ms at 1920x1080 for contiguous RGB.
    """
    h, w, c = pixels.shape
    s0, s1, s2 = pixels.strides
    addr = pixels.__array_interface__["data"][0]
    if s1 == 4 and s2 == 1 and s0 > 0 and s0 % 4 == 0 and addr % 4 == 0:
        root = pixels
        while isinstance(root.base, np.ndarray):
            root = root.base
        try:
            # Fails (and we copy) unless ``root`` exports its buffer and holds every word whole.
            return np.ndarray(
                (h, w),
                np.uint32,
                buffer=root,
                offset=addr - root.__array_interface__["data"][0],
                strides=(s0, 4),
            )
        except (BufferError, TypeError, ValueError):
            pass
    words = np.empty((h, w), np.uint32)
    as_bytes = words.view(np.uint8).reshape(h, w, 4)
    if c == 3 and pixels.flags.c_contiguous and w > 1:
        # Word j is bytes 3j..3j+3 of the row; its 4th byte (the next pixel's red) is unused.
        shifted = np.ndarray((h, w - 1), np.uint32, buffer=pixels, strides=(3 * w, 3))
        np.copyto(words[:, :-1], shifted)
        as_bytes[:, -1, :3] = pixels[:, -1]
    else:
        as_bytes[..., :c] = pixels
    return words


def _byte_rows(pixels: np.ndarray) -> tuple[np.ndarray, int]:
    """(H, row bytes) uint8 view of each input row, and the bytes from one pixel to the next."""
    h, w, c = pixels.shape
    if pixels.strides[2] != 1 or pixels.strides[1] < c:
        pixels = np.ascontiguousarray(pixels)
    rows = np.lib.stride_tricks.as_strided(
        pixels,
        shape=(h, (w - 1) * pixels.strides[1] + c),
        strides=(pixels.strides[0], 1),
        writeable=False,
    )
    return rows, pixels.strides[1]


def _finish(acc: np.ndarray, precision: int, out: np.ndarray) -> None:
    """``out = clamp((acc + 2**(p-1)) >> p, 0, 255)`` in ``out``'s dtype; overwrites ``acc``.

    ``acc`` is (rows, pixels * lanes) and ``out`` (rows, pixels, channels): lanes past the
    channels (a word's padding byte) are dropped.
    """
    acc += 1 << (precision - 1)
    np.right_shift(acc, precision, out=acc)  # arithmetic shift: floor, as torch's >> on int
    np.clip(acc, 0, 255, out=acc)
    rows, pixels, channels = out.shape
    lanes = acc.reshape(rows, pixels, -1)
    if lanes.shape[2] == channels:
        np.copyto(out, lanes, casting="unsafe")
    else:
        for ch in range(channels):  # one long strided copy per channel: 3x faster than [..., :3]
            np.copyto(out[:, :, ch], lanes[:, :, ch], casting="unsafe")


def _horizontal(pixels: np.ndarray, out_w: int, dtype: type) -> np.ndarray:
    """(H, W, C) uint8 -> (H, out_w, C) ``dtype`` (integer values 0-255), resampled along W.

    A block of rows at a time (so the buffers stay in cache): one gather of every tap's pixel (a
    4-byte word each, or bytes for C not 3 or 4), then one integer multiply-accumulate over taps.
    """
    h, w, c = pixels.shape
    taps = axis_taps(w, out_w)
    words = c in (3, 4)
    if words:
        rows = _pixel_words(pixels)
        cols, wts = _row_plan(w, out_w, True, 1, c)
    else:
        rows, item_stride = _byte_rows(pixels)
        cols, wts = _row_plan(w, out_w, False, item_stride, c)
    out = np.empty((h, out_w, c), dtype)
    n_taps, n_items = cols.shape
    n_bytes = wts.shape[1]
    flat_cols = cols.reshape(-1)
    acc_size = np.dtype(taps.acc_dtype).itemsize
    block = max(1, _BLOCK_BYTES // (n_bytes * (n_taps + acc_size)))  # gathered bytes + sums
    acc_buf = np.empty((block, n_bytes), taps.acc_dtype)
    got_buf = np.empty((block, n_taps * n_items), rows.dtype)
    for r0 in range(0, h, block):
        r1 = min(r0 + block, h)
        got, acc = got_buf[: r1 - r0], acc_buf[: r1 - r0]
        # All taps of the block in one gather; mode="clip" writes into ``got`` unbuffered (every
        # index is in range).
        np.take(rows[r0:r1], flat_cols, axis=1, out=got, mode="clip")
        # (rows, taps, bytes) x (taps, bytes) summed over taps, in one fused integer loop.
        np.einsum("rkn,kn->rn", got.view(np.uint8).reshape(r1 - r0, n_taps, n_bytes), wts, out=acc)
        _finish(acc, taps.precision, out[r0:r1])
    return out.reshape(h, out_w * c)


@functools.lru_cache(maxsize=32)
def _gemv_plan(in_size: int, out_size: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Window starts and float weights ``w / 2**precision`` (exact: 15-bit integers) of an axis."""
    taps = axis_taps(in_size, out_size)
    starts, weights = _aligned_windows(taps, in_size)
    scaled = (weights * 2.0**-taps.precision).astype(dtype)
    for arr in (starts, scaled):
        arr.flags.writeable = False
    return starts, scaled


def _vertical_gemv(rows: np.ndarray, out_h: int) -> np.ndarray:
    """(H, N) float (integer values 0-255) -> (out_h, N) uint8, resampled along H.

    One BLAS matrix-vector product per output row over its window of consecutive input rows.
    Each product and partial sum is a multiple of 2**-p whose magnitude stays below 2**24 * 2**-p
    for float32 (``f32_exact``) and 2**53 * 2**-p for float64, so it is exact: the result is the
    integer sum divided by 2**p, whatever order or FMA the BLAS uses.
    """
    h, n = rows.shape
    starts, scaled = _gemv_plan(h, out_h, rows.dtype.type)
    n_taps = scaled.shape[1]
    out = np.empty((out_h, n), np.uint8)
    block = max(1, _BLOCK_BYTES // (n * rows.itemsize))
    acc_buf = np.empty((block, n), rows.dtype)
    for o0 in range(0, out_h, block):
        o1 = min(o0 + block, out_h)
        acc = acc_buf[: o1 - o0]
        for o in range(o0, o1):
            s = starts[o]
            np.matmul(scaled[o], rows[s : s + n_taps], out=acc[o - o0])
        acc += 0.5  # the 2**(p-1) rounding term, exact
        np.clip(acc, 0, 255, out=acc)
        np.copyto(out[o0:o1], acc, casting="unsafe")  # truncation: floor, as values are >= 0
    return out


def _vertical_taps(rows: np.ndarray, out_h: int) -> np.ndarray:
    """(H, N) uint8 -> (out_h, N) uint8, resampled along H with integer sums tap by tap.

    For short rows, where one BLAS call per output row would cost more in Python than it saves.
    """
    h, n = rows.shape
    taps = axis_taps(h, out_h)
    starts, weights = _aligned_windows(taps, h)
    weights = weights.astype(taps.acc_dtype)
    out = np.empty((out_h, n), np.uint8)
    block = max(1, _BLOCK_BYTES // (n * (1 + 2 * np.dtype(taps.acc_dtype).itemsize)))
    acc_buf = np.empty((block, n), taps.acc_dtype)
    tmp_buf = np.empty((block, n), taps.acc_dtype)
    got_buf = np.empty((block, n), np.uint8)
    for o0 in range(0, out_h, block):
        o1 = min(o0 + block, out_h)
        acc, tmp, got = acc_buf[: o1 - o0], tmp_buf[: o1 - o0], got_buf[: o1 - o0]
        for k in range(weights.shape[1]):
            np.take(rows, starts[o0:o1] + k, axis=0, out=got, mode="clip")
            if k == 0:
                np.multiply(got, weights[o0:o1, k, None], out=acc)
            else:
                np.multiply(got, weights[o0:o1, k, None], out=tmp)
                acc += tmp
        _finish(acc, taps.precision, out[o0:o1, :, None])
    return out


def resize_bicubic_aa(pixels: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Resize uint8 pixels exactly as torch's antialiased bicubic ``interpolate`` does.

    Equal, value for value, to ``F.interpolate(t, size=(out_h, out_w), mode="bicubic",
    antialias=True)`` on the (1, C, H, W) uint8 CPU tensor ``t`` of the same pixels, for
    shrinking and growing alike. Channels are resampled independently. RGBX storage
    (``rgbx_array(img)``, or its RGB view ``[..., :3]``) is read in place, without a copy.

    Args:
        pixels: (H, W, C) uint8 array, e.g. RGB; any strides.
        out_h: Output height in pixels.
        out_w: Output width in pixels.

    Returns:
        A new C-contiguous (out_h, out_w, C) uint8 array.

    Raises:
        ValueError: ``pixels`` is not a non-empty (H, W, C) uint8 array, or a size is not
            positive.
    """
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 3:
        raise ValueError(
            "pixels must be an (H, W, C) uint8 array, got "
            f"{getattr(pixels, 'dtype', type(pixels).__name__)} "
            f"of shape {getattr(pixels, 'shape', None)}"
        )
    h, w, c = pixels.shape
    if min(h, w, c) <= 0:
        raise ValueError(f"pixels must not be empty, got shape {pixels.shape}")
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"output sizes must be positive, got {out_w}x{out_h}")
    if (h, w) == (out_h, out_w):
        return pixels.copy(order="C")  # torch copies too: no pass runs at scale 1
    n = out_w * c
    # An axis whose size does not change is not resampled (torch skips that pass).
    gemv = h != out_h and n >= _GEMV_MIN_ROW
    mid = np.uint8
    if gemv:
        mid = np.float32 if axis_taps(h, out_h).f32_exact else np.float64
    if w != out_w:
        rows = _horizontal(pixels, out_w, mid)
    else:
        rows = pixels.astype(mid, order="C").reshape(h, n)
    if h != out_h:
        rows = _vertical_gemv(rows, out_h) if gemv else _vertical_taps(rows, out_h)
    return rows.reshape(out_h, out_w, c)
