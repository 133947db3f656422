"""Canonical frames, set-of-mark markers and screen fingerprints.

One code path prepares every screenshot the model sees, at data-gen, train and serve time::

    frame = canonical_frame("shot.png", min_pixels=65_536, max_pixels=1_048_576,
                            marks=(PointMark(500, 554),), size_class="desktop")

``materialise`` applies it to the ``ImageRef`` parts of prompt messages; ``encode_png`` gives
deterministic bytes for storage or an HTTP backend.
"""

from hivig.vision._cache import FrameCache, frame_nbytes
from hivig.vision._fingerprint import (
    GridBox,
    apply_masks,
    array_fingerprint,
    dhash_array,
    exact_fingerprint,
    grid_box_px,
    hamming,
    mask_array,
    perceptual_hash,
    screen_thumbnail,
)
from hivig.vision._frame import (
    MAX_ASPECT_RATIO,
    RESAMPLE,
    RESIZE_KERNELS,
    ImageError,
    canonical_frame,
    clean_frame_of,
    load_image,
    marked_frame_of,
    materialise,
    reference_marked_image,
    resize_kernel,
    rgbx_array,
    rgbx_tensor,
    smart_resize,
)
from hivig.vision._markers import (
    ARROW_COLOUR,
    POINT_COLOUR,
    DrawResult,
    MarkerGeometry,
    draw_marks,
    marked_rows,
    marker_geometry,
    size_class_for,
    size_class_for_platform,
)
from hivig.vision._png import FAST_PNG_LEVEL, PNG_BAND_ROWS, BandedPng, deflate, encode_png
from hivig.vision._policy import CANONICAL, FramePolicy, before_grid, llamafactory_resize

__all__ = [
    "CANONICAL",
    "FramePolicy",
    "before_grid",
    "clean_frame_of",
    "llamafactory_resize",
    "marked_frame_of",
    "FrameCache",
    "frame_nbytes",
    "FAST_PNG_LEVEL",
    "ARROW_COLOUR",
    "BandedPng",
    "MAX_ASPECT_RATIO",
    "POINT_COLOUR",
    "RESAMPLE",
    "RESIZE_KERNELS",
    "DrawResult",
    "GridBox",
    "ImageError",
    "MarkerGeometry",
    "PNG_BAND_ROWS",
    "apply_masks",
    "array_fingerprint",
    "canonical_frame",
    "deflate",
    "dhash_array",
    "draw_marks",
    "marked_rows",
    "encode_png",
    "exact_fingerprint",
    "grid_box_px",
    "hamming",
    "load_image",
    "marker_geometry",
    "mask_array",
    "materialise",
    "perceptual_hash",
    "reference_marked_image",
    "resize_kernel",
    "rgbx_array",
    "rgbx_tensor",
    "screen_thumbnail",
    "size_class_for",
    "size_class_for_platform",
    "smart_resize",
]
