"""CUADebug's two-level failure taxonomy and the mapping from the critic's 12 dimensions.

Root causes are reported with CUADebug's L1/L2 codes so results compare with CUAErrorBench. A
HiViG dimension maps to one L2 code (``hivig.taxonomy.Dimension.cuadebug_family``); system and
infeasibility causes (S1, S3-S7, O1) have no dimension and are reported with ``None``.
"""

from __future__ import annotations

from hivig.taxonomy import DIMENSIONS, Dimension

FAMILIES: dict[str, str] = {
    "P": "Perception",
    "G": "Grounding / interaction",
    "R": "Task reasoning & control",
    "S": "External / system",
    "O": "Others",
}
"""L1 code -> name."""

SUBTYPES: dict[str, str] = {
    "P1": "visual hallucination",
    "P2": "misrecognition/OCR",
    "P3": "cross-modal misbinding",
    "P4": "observation omission",
    "P5": "semantic misunderstanding",
    "G1": "coordinate/element grounding",
    "G2": "visibility/accessibility",
    "G3": "interaction mechanics",
    "G4": "distraction/adversarial misdirection",
    "R1": "constraint violation",
    "R2": "impossible plan/action",
    "R3": "decomposition failure",
    "R4": "inefficient/redundant strategy",
    "R5": "action-intent misalignment",
    "R6": "invalid/malformed action",
    "R7": "parameter/argument error",
    "R8": "context loss",
    "R9": "memory hallucination",
    "R10": "progress misjudgment",
    "R11": "outcome misinterpretation",
    "R12": "failed self-correction",
    "R13": "causal misattribution",
    "S1": "rendering/layout",
    "S2": "timing/race",
    "S3": "unexpected system behaviour",
    "S4": "step/resource limit",
    "S5": "tool/API failure",
    "S6": "environment instability",
    "S7": "benchmark/evaluation artifact",
    "O1": "infeasible task not recognised",
}
"""L2 code -> short name (CUADebug's 30 subtypes)."""


def error_label(dimension: Dimension | None, l2: str | None = None) -> dict[str, str | None]:
    """The result's ``error`` object for a dimension, or for an L2 code without one.

    Args:
        dimension: The critic dimension; its ``cuadebug_family`` gives the L2 code.
        l2: An L2 code to use when ``dimension`` is ``None`` (system causes such as ``S4``).

    Returns:
        ``{"l1", "l1_name", "l2", "l2_name", "hivig_dimension"}``; all ``None`` when neither
        argument names a cause.

    Raises:
        KeyError: ``l2`` is not one of CUADebug's codes.
    """
    code = dimension.cuadebug_family if dimension is not None else l2
    if code is None:
        return {"l1": None, "l1_name": None, "l2": None, "l2_name": None, "hivig_dimension": None}
    if code not in SUBTYPES:
        raise KeyError(f"unknown CUADebug code {code!r}")
    return {
        "l1": code[0],
        "l1_name": FAMILIES[code[0]],
        "l2": code,
        "l2_name": SUBTYPES[code],
        "hivig_dimension": dimension.name if dimension is not None else None,
    }


def check_mapping() -> None:
    """Fail loudly if a dimension maps to a code CUADebug does not have (import-time guard)."""
    bad = [d.name for d in DIMENSIONS if d.cuadebug_family not in SUBTYPES]
    if bad:
        raise ValueError(f"dimensions with unknown CUADebug codes: {bad}")


check_mapping()
