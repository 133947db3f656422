"""Coordinate scale of ScaleCUA records: detection per record and reconciliation per file.

ScaleCUA trajectory coordinates are expected as [0, 1] floats, but derived copies use the 0–1000
grid or screen pixels. The scale is detected, never assumed: per record from
the largest magnitude, with the file's tally breaking the two known ties (all-0/1 records, pixel
records below 1000). Contradictions, and records that mix fractions with larger values, are
reported as ``ambiguous_scale`` so the caller quarantines them; nothing is silently truncated.
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


def _magnitudes(values: list[float]) -> list[float]:
    return [abs(v) for v in values if is_number(v)]


def _mixed(magnitudes: list[float]) -> bool:
    """A fraction strictly between 0 and 1 beside a value above the unit range.

    No single scale explains such a record: ``click(x=1000, y=0.5)`` read as grid truncates
    0.5 to the screen edge, read as unit puts 1000 off screen. It is quarantined, never guessed.
    """
    top = max(magnitudes, default=0.0)
    return top > 1.0 + CLAMP_FRACTION and any(0.0 < m < 1.0 for m in magnitudes)


def detect_scale(values: list[float]) -> Scale | None:
    """Per-record scale, by the largest magnitude.

    * all ``|v| <= 1 + CLAMP_FRACTION`` -> ``"unit"`` (overshoot up to the clamp is still unit);
    * else all ``|v| <= 1000`` -> ``"grid"``;
    * else -> ``"pixel"``.

    A record that mixes a fraction in (0, 1) with values beyond the unit range has no scale:
    ``resolve_scale`` reports it as ``ambiguous_scale``.

    Args:
        values: A step's coordinate values (see ``coordinate_values``).

    Returns:
        ``"unit"``, ``"grid"`` or ``"pixel"``; ``None`` when the values decide nothing (no
        values, or an ambiguous mix), so the record casts no vote in a per-file tally.
    """
    return _detect(_magnitudes(values))


def _detect(magnitudes: list[float]) -> Scale | None:
    if not magnitudes or _mixed(magnitudes):
        return None
    top = max(magnitudes)
    if top <= 1.0 + CLAMP_FRACTION:
        return "unit"
    return "grid" if top <= GRID_MAX else "pixel"


def resolve_scale(values: list[float], scale: str | None) -> Scale | None | ActionError:
    """Reconcile a record's own scale with the file's decision.

    The file's decision explains two look-alikes: records of only 0/1 values (unit-looking in any
    file) and pixel records with values up to 1000 (grid-looking). Every other contradiction is
    ``ambiguous_scale``: a fraction in a grid or pixel file, values beyond the clamp in a unit
    file, values beyond the grid (plus the clamp) in a grid file, and any record mixing a
    fraction in (0, 1) with values above 1, whatever the file.

    Args:
        values: The record's coordinate values.
        scale: The file's scale decision, or ``None`` to use the record's own.

    Returns:
        The scale to convert with (``None`` when neither gives one), or ``ambiguous_scale``;
        ``bad_argument`` for an unknown ``scale``.
    """
    if scale is not None and scale not in SCALES:
        return ActionError("bad_argument", f"scale must be one of {SCALES}, got {scale!r}")
    magnitudes = _magnitudes(values)
    if _mixed(magnitudes):
        return ActionError("ambiguous_scale", f"fractions beside larger coordinates: {values}")
    record = _detect(magnitudes)
    if scale is None or record is None or record == scale:
        return scale if scale is not None else record  # type: ignore[return-value]
    if all(m in (0.0, 1.0) for m in magnitudes):
        return scale  # type: ignore[return-value]
    if record == "unit":
        return ActionError("ambiguous_scale", f"fractional coordinates {values} in a {scale} file")
    if scale == "unit":
        return ActionError("ambiguous_scale", f"coordinates {values} exceed a unit-scale file")
    if scale == "grid" and max(magnitudes) > GRID_MAX * (1.0 + CLAMP_FRACTION):
        return ActionError("ambiguous_scale", f"pixel-size coordinates {values} in a grid file")
    # Grid-looking values in a pixel file are pixels; grid overshoot within the clamp is clamped.
    return scale  # type: ignore[return-value]
