"""Coordinate scale of ScaleCUA records: detection per record and reconciliation per file.

ScaleCUA trajectory coordinates are expected as [0, 1] floats, but derived copies use the 0–1000
grid or screen pixels. The scale is detected, never assumed (scalecua_format §7.2): per record from
the largest magnitude, with the file's tally breaking the two known ties (all-0/1 records, pixel
records below 1000) and contradictions reported as ``ambiguous_scale``.
"""

from __future__ import annotations

from typing import Literal

from hivig.actions._calls import RawCall
from hivig.actions.model import (
    GRID_MAX,
    ActionError,
    is_number,
)

Scale = Literal["unit", "grid", "pixel"]
SCALES: tuple[Scale, ...] = ("unit", "grid", "pixel")

CLAMP_FRACTION = 0.005
"""Overshoot beyond [0, 1] (as a fraction of the side) that is clamped rather than rejected."""


def coordinate_values(calls: list[RawCall]) -> list[float]:
    """Every coordinate value of a step (``x``, ``y``, ``from_coord``, ``to_coord``)."""
    values: list[float] = []
    for call in calls:
        for axis in ("x", "y"):
            value = call.kwargs.get(axis)
            if is_number(value):
                values.append(float(value))
        for key in ("from_coord", "to_coord"):
            pair = call.kwargs.get(key)
            if isinstance(pair, (list, tuple)):
                values.extend(float(v) for v in pair if is_number(v))
    return values


def detect_scale(values: list[float]) -> Scale | None:
    """Per-record scale: all |v| <= 1 -> unit, all <= 1000 -> grid, else pixel.

    Args:
        values: A step's coordinate values (see ``coordinate_values``).

    Returns:
        ``"unit"``, ``"grid"`` or ``"pixel"``; ``None`` when there are no values (nothing to
        convert, and nothing for a per-file tally to count).
    """
    magnitudes = [abs(v) for v in values if is_number(v)]
    if not magnitudes:
        return None
    top = max(magnitudes)
    if top <= 1.0:
        return "unit"
    return "grid" if top <= GRID_MAX else "pixel"


def resolve_scale(values: list[float], scale: str | None) -> Scale | None | ActionError:
    """Reconcile the record's own scale with an explicit (per-file) one (format notes §7.2)."""
    record = detect_scale(values)
    if scale is None:
        return record
    if scale not in SCALES:
        return ActionError("bad_argument", f"scale must be one of {SCALES}, got {scale!r}")
    if record is None:
        return scale  # type: ignore[return-value]
    # All-0/1 records look like unit scale in any file: the file's decision explains them.
    binary = all(v in (0.0, 1.0) for v in values)
    if record == "unit" and scale != "unit" and not binary:
        return ActionError("ambiguous_scale", f"fractional coordinates {values} in a {scale} file")
    if scale == "unit" and max(abs(v) for v in values) > 1.0 + CLAMP_FRACTION:
        return ActionError("ambiguous_scale", f"coordinates {values} exceed a unit-scale file")
    # A grid-looking record in a pixel file is pixels; grid overshoot is a range question.
    return scale  # type: ignore[return-value]
