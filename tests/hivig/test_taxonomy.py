"""The taxonomy module: exact names, order, flags and the tolerant-but-strict lookup."""

from __future__ import annotations

import ast
import importlib
import inspect

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

# The critic's training prompt lists them in this order.
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


# -------------------------------------------------------------------------------------------
# docstrings of the public API (taxonomy, prompts, contracts, records)

_DOCUMENTED_MODULES = (
    "hivig.taxonomy",
    "hivig.contracts",
    "hivig.records",
    "hivig.prompts._builders",
    "hivig.prompts._template",
    "hivig.profiles._profile",
    "hivig.vision._policy",
)


def _missing_sections(source: str) -> list[str]:
    """Public functions whose Google docstring lacks ``Args:`` (has params) or ``Returns:``."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node) or ""
        args = node.args
        params = [a.arg for a in args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
        if args.vararg or args.kwarg:
            params.append("*")
        is_property = any(getattr(d, "id", None) == "property" for d in node.decorator_list)
        returns = node.returns is not None and not (
            isinstance(node.returns, ast.Constant) and node.returns.value is None
        )
        if params and "Args:" not in doc:
            missing.append(f"{node.name}: Args")
        if returns and not is_property and "Returns:" not in doc:
            missing.append(f"{node.name}: Returns")
    return missing


@pytest.mark.parametrize("module", _DOCUMENTED_MODULES)
def test_public_functions_document_args_and_returns(module):
    source = inspect.getsource(importlib.import_module(module))
    assert _missing_sections(source) == []


def test_docstring_check_catches_a_missing_section():
    # Negative control: a function documented like the old ``dimension_by_key``.
    source = (
        'def f(key: str) -> int:\n    """Say what.\n\n    Raises:\n        KeyError: x.\n    """\n'
    )
    assert _missing_sections(source) == ["f: Args", "f: Returns"]
