"""The taxonomy module: exact names, order, flags and the tolerant-but-strict lookup."""

from __future__ import annotations

import pytest

from hivig.taxonomy import DIMENSIONS, dimension_by_key, lookup_dimension

PAPER_NAMES = {
    "Grounding/Spatial Error",
    "Visual Hallucination",
    "Observation Neglect",
    "Parameter Vector Miscalibration",
    "Action-Operation Misalignment",
    "Termination Misjudgment",
    "Procedural Prerequisite Neglect",
    "Semantic Error",
    "Constraint Neglect",
    "Action Formulation Error",
    "Suboptimal Path",
    "Timing and Latency Neglect",
}

# The critic's training prompt lists them in this order (reference_pipeline.md §6).
TRAINING_ORDER = [
    "Grounding/Spatial Error",
    "Procedural Prerequisite Neglect",
    "Semantic Error",
    "Termination Misjudgment",
    "Constraint Neglect",
    "Action Formulation Error",
    "Observation Neglect",
    "Suboptimal Path",
    "Parameter Vector Miscalibration",
    "Visual Hallucination",
    "Timing and Latency Neglect",
    "Action-Operation Misalignment",
]


def test_names_and_order():
    assert [d.name for d in DIMENSIONS] == TRAINING_ORDER
    assert set(TRAINING_ORDER) == PAPER_NAMES
    assert len({d.key for d in DIMENSIONS}) == 12


def test_groups_follow_appendix_b():
    visual = {d.name for d in DIMENSIONS if d.group == "visual_spatial"}
    assert visual == {
        "Grounding/Spatial Error",
        "Visual Hallucination",
        "Observation Neglect",
        "Parameter Vector Miscalibration",
        "Action-Operation Misalignment",
    }
    assert all(d.group in ("visual_spatial", "cognitive") for d in DIMENSIONS)


def test_intent_and_masking_flags():
    needs_intent = [d.name for d in DIMENSIONS if d.requires_intent]
    assert needs_intent == ["Action-Operation Misalignment"]
    # Nothing that needs the intent may be masked.
    assert all(not d.maskable for d in DIMENSIONS if d.requires_intent)
    unmaskable = {d.name for d in DIMENSIONS if not d.maskable}
    assert unmaskable == {"Action-Operation Misalignment", "Visual Hallucination"}


def test_generators_cover_every_dimension():
    annotator_only = {d.name for d in DIMENSIONS if d.generators == ("annotator",)}
    assert annotator_only == {
        "Semantic Error",
        "Constraint Neglect",
        "Observation Neglect",
        "Suboptimal Path",
    }
    for d in DIMENSIONS:
        assert d.generators and set(d.generators) <= {"programmatic", "annotator"}
        assert d.definition and d.consequence


def test_cuadebug_mapping():
    codes = {d.name: d.cuadebug_family for d in DIMENSIONS}
    assert codes["Grounding/Spatial Error"] == "G1"
    assert codes["Action-Operation Misalignment"] == "R5"
    assert codes["Timing and Latency Neglect"] == "S2"
    assert all(c[0] in "PGRSO" and c[1:].isdigit() for c in codes.values())


@pytest.mark.parametrize("dim", DIMENSIONS, ids=lambda d: d.key)
def test_lookup_variants(dim):
    variants = [
        dim.name,
        dim.name.upper(),
        dim.name.lower(),
        f"**{dim.name}**",
        f"  {dim.name}.  ",
        f"`{dim.name}`",
        f'"{dim.name}"',
        dim.name.replace(" ", "  "),
        dim.key,
    ]
    for text in variants:
        assert lookup_dimension(text) is dim, text


@pytest.mark.parametrize(
    "text",
    [
        "Grounding Error",
        "Spatial Error",
        "Memory & State Tracking Error",
        "Memory and State Tracking Error",
        "Semantic",
        "Semantic Errors",
        "Timing Neglect",
        "Action Misalignment",
        "Invalid",
        "",
        "Semantic Error: the agent clicked Sign Up",
        "1. Semantic Error",
    ],
)
def test_lookup_near_misses_are_none(text):
    assert lookup_dimension(text) is None


def test_lookup_separator_tolerance():
    assert lookup_dimension("grounding / spatial error").key == "grounding_spatial_error"
    assert lookup_dimension("Action Operation Misalignment").key == "action_operation_misalignment"
    assert lookup_dimension("Timing & Latency Neglect").key == "timing_and_latency_neglect"
    assert lookup_dimension(None) is None  # type: ignore[arg-type]


def test_dimension_by_key():
    assert dimension_by_key("semantic_error").name == "Semantic Error"
    with pytest.raises(KeyError):
        dimension_by_key("memory_state_tracking_error")
