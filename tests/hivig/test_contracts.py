"""Output contracts: tolerant parsing, strict content, exact round trips."""

from __future__ import annotations

import inspect
import json
import random
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivig import contracts
from hivig.contracts import (
    ContractError,
    CritiqueOutput,
    HistoryOutput,
    JudgeOutput,
    PerturbationOutput,
    TransitionOutput,
    parse_critique,
    parse_history,
    parse_judge,
    parse_next_state,
    parse_perturbation,
    render_critique_target,
    render_history_target,
    split_think,
)
from hivig.taxonomy import DIMENSIONS, lookup_dimension

GOOD = """<think>
Action String Check: <tool_call>{"name": "computer_use"}</tool_call> - Syntax is Valid.

The menu will open.

This advances the goal.
</think>
<criticism>
Overall Grading: Good
Explanation: The File menu will drop down; menus open on a single click.
</criticism>"""

BAD = """<think>reasoning</think>
<criticism>
Overall Grading: Bad
Error Dimension: Visual Hallucination
Explanation: The click will land on empty canvas.
Nothing on this screen offers a Rename entry.
</criticism>"""


def _err(result, reason):
    assert isinstance(result, ContractError), result
    assert result.reason == reason, result
    assert result.message


# -------------------------------------------------------------------------------------------
# <think>


def test_split_think_forms():
    assert split_think("<think> a </think>rest") == ("a", "rest")
    assert split_think("a\n</think>\nrest") == ("a", "\nrest")  # pre-filled opening tag
    assert split_think("no reasoning") == (None, "no reasoning")
    assert split_think("<THINK>x</Think>y") == ("x", "y")
    _err(split_think(""), "empty")
    _err(split_think("  \n "), "empty")
    _err(split_think("<think>truncated"), "unclosed_think")
    _err(split_think("</think>x<think>"), "unclosed_think")
    _err(split_think("<think>a</think><think>b</think>"), "duplicate_think")
    _err(split_think("preamble <think>a</think>b"), "text_before_think")


# -------------------------------------------------------------------------------------------
# critique


def test_critique_good_and_bad():
    good = parse_critique(GOOD)
    assert isinstance(good, CritiqueOutput)
    assert good.verdict == "Good" and good.dimension is None
    assert good.explanation.startswith("The File menu")
    assert good.think.startswith("Action String Check:")
    bad = parse_critique(BAD)
    assert bad.verdict == "Bad"
    assert bad.dimension is lookup_dimension("Visual Hallucination")
    # Multi-line explanation kept whole.
    assert bad.explanation.endswith("Rename entry.")


def test_critique_sloppy_formatting():
    text = """</think>
<Criticism>
**Overall Grading:** good
- **Error Dimension**: N/A
* Explanation: __The dialog will close.__
</criticism>
"""
    out = parse_critique(text)
    assert out == CritiqueOutput("", "Good", None, "The dialog will close.")


@pytest.mark.parametrize("dim", DIMENSIONS, ids=lambda d: d.key)
@pytest.mark.parametrize(
    "style",
    ["{name}", "**{name}**", "{upper}", "{lower}", "`{name}`.", "{key}"],
)
def test_critique_every_dimension(dim, style):
    shown = style.format(name=dim.name, upper=dim.name.upper(), lower=dim.name.lower(), key=dim.key)
    text = (
        "<think>t</think>\n<criticism>\nOverall Grading: **BAD**\n"
        f"Error Dimension: {shown}\nExplanation: e\n</criticism>"
    )
    out = parse_critique(text)
    assert isinstance(out, CritiqueOutput), out
    assert out.dimension is dim


@pytest.mark.parametrize(
    "name",
    ["Grounding Error", "Memory & State Tracking Error", "Semantic", "Visual Hallucinations"],
)
def test_critique_near_miss_dimension_fails(name):
    text = (
        "<think>t</think><criticism>\nOverall Grading: Bad\n"
        f"Error Dimension: {name}\nExplanation: e\n</criticism>"
    )
    _err(parse_critique(text), "unknown_dimension")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<think>t</think> Overall Grading: Good\nExplanation: e", "missing_tag"),
        ("<think>t</think><criticism>Overall Grading: Good\nExplanation: e", "missing_tag"),
        (
            "<think>t</think><criticism>Overall Grading: Good\nExplanation: e</criticism>"
            "<criticism>Overall Grading: Bad</criticism>",
            "duplicate_tag",
        ),
        (
            "<think>t</think><criticism>Overall Grading: Fine\nExplanation: e</criticism>",
            "bad_verdict",
        ),
        (
            "<think>t</think><criticism>Overall Grading: Good or Bad\nExplanation: e</criticism>",
            "bad_verdict",
        ),
        ("<think>t</think><criticism>Explanation: e</criticism>", "missing_field"),
        ("<think>t</think><criticism>Overall Grading: Good</criticism>", "missing_field"),
        (
            "<think>t</think><criticism>Overall Grading: Good\nExplanation:</criticism>",
            "missing_field",
        ),
        (
            "<think>t</think><criticism>Overall Grading: Bad\nExplanation: e</criticism>",
            "missing_field",
        ),
        (
            "<think>t</think><criticism>Overall Grading: Good\nError Dimension: Semantic Error\n"
            "Explanation: e</criticism>",
            "unexpected_dimension",
        ),
        (
            "<think>t</think><criticism>Overall Grading: Good\nOverall Grading: Bad\n"
            "Explanation: e</criticism>",
            "duplicate_field",
        ),
        ("<think>t</think><think>u</think><criticism>x</criticism>", "duplicate_think"),
        ("", "empty"),
    ],
)
def test_critique_failures(text, reason):
    _err(parse_critique(text), reason)


def test_critique_label_inside_text_is_not_a_field():
    # A label mentioned mid-line is content, not a second field.
    text = (
        "<think>t</think><criticism>\nOverall Grading: Good\n"
        "Explanation: the Overall Grading: label is only a line start\n</criticism>"
    )
    assert parse_critique(text).explanation == "the Overall Grading: label is only a line start"


@pytest.mark.parametrize(
    "junk",
    [None, 3, "<criticism>", "</think></think>", "{", "<think><criticism></criticism></think>"],
)
def test_parsers_are_total(junk):
    for parse in (parse_critique, parse_history, parse_next_state, parse_perturbation, parse_judge):
        assert isinstance(parse(junk), ContractError)


# -------------------------------------------------------------------------------------------
# history


def test_history_well_formed_and_sloppy():
    text = (
        "<think>diff</think>\n<summary>\nProgress Summary: Opened the inbox.\n"
        "Last Action Result: The compose window opened.\n</summary>"
    )
    out = parse_history(text)
    assert out == HistoryOutput("diff", "Opened the inbox.", "The compose window opened.")
    assert out.summary.startswith("Progress Summary: Opened")
    sloppy = (
        "diff</think><SUMMARY>\n**progress summary:** Signed in.\nStill on page 1.\n"
        "- **Last Action Result**: Nothing changed (silent failure).</summary>"
    )
    out = parse_history(sloppy)
    assert out.progress == "Signed in.\nStill on page 1."
    assert out.last_result == "Nothing changed (silent failure)."


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<think>x</think>Progress Summary: a\nLast Action Result: b", "missing_tag"),
        ("<think>x</think><summary>Progress Summary: a</summary>", "missing_field"),
        ("<think>x</think><summary>Last Action Result: b</summary>", "missing_field"),
        (
            "<think>x</think><summary>Progress Summary:\nLast Action Result: b</summary>",
            "missing_field",
        ),
        (
            "<think>x</think><summary>Progress Summary: a\nProgress Summary: c\n"
            "Last Action Result: b</summary>",
            "duplicate_field",
        ),
    ],
)
def test_history_failures(text, reason):
    _err(parse_history(text), reason)


# -------------------------------------------------------------------------------------------
# next_state


def test_next_state_with_parts():
    text = (
        "<think>\n[Action Mechanism]: The step clicks the File menu.\n"
        "**Structural Effect** A dropdown list appears under the menu bar.\n</think>\n"
        "<next_state>A dropdown will open below the menu bar.</next_state>"
    )
    out = parse_next_state(text)
    assert out == TransitionOutput(
        think=out.think,
        next_state="A dropdown will open below the menu bar.",
        mechanism="The step clicks the File menu.",
        effect="A dropdown list appears under the menu bar.",
    )
    plain = parse_next_state("<next_state> X will appear. </next_state>")
    assert plain.mechanism is None and plain.effect is None and plain.think is None
    _err(parse_next_state("<think>a</think><next_state> </next_state>"), "missing_field")
    _err(parse_next_state("<think>a</think>A dropdown will open."), "missing_tag")


# -------------------------------------------------------------------------------------------
# perturbation


def _perturbation(**over):
    obj = {
        "dimension_violated": "**Suboptimal Path**",
        "rejected_thought": "The field is visible; I will delete characters one by one.",
        "rejected_proposed_step": 'Action: press backspace\n<tool_call>\n{"name": "computer_use", '
        '"arguments": {"action": "key", "keys": ["backspace"]}}\n</tool_call>',
    }
    obj.update(over)
    return obj


def test_perturbation_fenced_json_after_think():
    body = json.dumps(_perturbation(), indent=2)
    text = (
        '<think>Chosen: {"action": "type"} vs rejected {"action": "key"}</think>\n'
        f"```json\n{body}\n```\n"
    )
    out = parse_perturbation(text)
    assert isinstance(out, PerturbationOutput)
    assert out.dimension is lookup_dimension("Suboptimal Path")
    assert out.rejected_proposed_step.startswith("Action: press backspace")


def test_perturbation_without_think_uses_last_object():
    # Untagged reasoning quoting tool-call JSON comes before the answer object.
    text = 'Divergence: {"action": "type"} differs.\n' + json.dumps(_perturbation())
    assert isinstance(parse_perturbation(text), PerturbationOutput)


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (_perturbation(dimension_violated="Memory & State Tracking Error"), "unknown_dimension"),
        (_perturbation(dimension_violated="Grounding Error"), "unknown_dimension"),
        (_perturbation(rejected_thought=""), "bad_value"),
        (_perturbation(rejected_thought=3), "bad_value"),
        (_perturbation(rejected_proposed_step="Action: click"), "bad_value"),
        ({"dimension_violated": "Semantic Error", "rejected_thought": "t"}, "missing_key"),
    ],
)
def test_perturbation_failures(obj, reason):
    _err(parse_perturbation("<think>r</think>" + json.dumps(obj)), reason)


def test_perturbation_bad_json():
    _err(parse_perturbation("<think>r</think>{'dimension_violated': 'Semantic Error'}"), "bad_json")
    _err(parse_perturbation("<think>r</think>no json here"), "bad_json")


# -------------------------------------------------------------------------------------------
# judge


def _judge(candidate="B", dim="Constraint Neglect"):
    return json.dumps(
        {
            "better_candidate": candidate,
            "predicted_error_dimension": dim,
            "reasoning_summary": "A picks the wrong author.",
        }
    )


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [("A", "A"), ("b", "B"), (" B ", "B"), ("Candidate B", "B"), ("**A**", "A"), ("'B'", "B")],
)
def test_judge_candidates(candidate, expected):
    out = parse_judge("<think>Action A Raw: `x` - Syntax: Valid</think>" + _judge(candidate))
    assert isinstance(out, JudgeOutput)
    assert out.better_candidate == expected
    assert out.dimension is lookup_dimension("Constraint Neglect")


def test_judge_invalid_and_failures():
    out = parse_judge(f"```\n{_judge(dim='Invalid')}\n```")
    assert out.dimension is None and out.better_candidate == "B"
    _err(parse_judge(_judge(candidate="AB")), "bad_value")
    _err(parse_judge(_judge(candidate="C")), "bad_value")
    _err(parse_judge(_judge(candidate="Candidate A or B")), "bad_value")
    _err(parse_judge(_judge(dim="Memory & State Tracking Error")), "unknown_dimension")
    _err(parse_judge('{"better_candidate": "A"}'), "missing_key")


# -------------------------------------------------------------------------------------------
# renderers


@pytest.mark.parametrize("dim", [None, *DIMENSIONS], ids=lambda d: d.key if d else "good")
def test_critique_round_trip(dim):
    verdict = "Good" if dim is None else "Bad"
    think = "Action String Check: <tool_call>{}</tool_call> - Syntax is Valid.\n\nP2\n\nP3"
    explanation = "The list will scroll.\nLists move with the wheel."
    text = render_critique_target(think, verdict, dim, explanation)
    assert parse_critique(text) == CritiqueOutput(think, verdict, dim, explanation)


def test_critique_render_exact_format():
    dim = lookup_dimension("Visual Hallucination")
    assert render_critique_target(" t ", "Bad", dim.name, "e") == (
        "<think>\nt\n</think>\n<criticism>\nOverall Grading: Bad\n"
        "Error Dimension: Visual Hallucination\nExplanation: e\n</criticism>"
    )


def test_history_round_trip_and_format():
    text = render_history_target("diff", "Opened settings.", "The Wi-Fi page opened.")
    assert text == (
        "<think>\ndiff\n</think>\n<summary>\nProgress Summary: Opened settings.\n"
        "Last Action Result: The Wi-Fi page opened.\n</summary>"
    )
    assert parse_history(text) == HistoryOutput(
        "diff", "Opened settings.", "The Wi-Fi page opened."
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: render_critique_target("t", "Good", "Semantic Error", "e"),
        lambda: render_critique_target("t", "Bad", None, "e"),
        lambda: render_critique_target("t", "Bad", "Grounding Error", "e"),
        lambda: render_critique_target("t", "Meh", None, "e"),  # type: ignore[arg-type]
        lambda: render_critique_target("t", "Good", None, ""),
        lambda: render_critique_target("a </think> b", "Good", None, "e"),
        lambda: render_critique_target("t", "Good", None, "e\nOverall Grading: Bad"),
        lambda: render_history_target("t", "p\nLast Action Result: x", "y"),
        lambda: render_history_target("t", "p", "</summary>"),
        lambda: render_history_target("t", "", "y"),
    ],
)
def test_renderers_refuse_what_would_not_round_trip(call):
    with pytest.raises(ValueError):
        call()


# -------------------------------------------------------------------------------------------
# properties

# Fragments that form (and break) tags, labels and JSON, joined at random.
_TEXT = st.lists(
    st.sampled_from(
        ["a", " ", "\n", "<", ">", "/", "{", "}", '"', "*", ":", "think", "summary", "criticism"]
        + ["next_state", "Overall Grading", "Error Dimension", "Explanation", "Bad", "Good"]
    ),
    max_size=40,
).map("".join)
# Arbitrary bytes as a server might decode them; surrogateescape keeps lone surrogates in the str.
_DECODED = st.binary(max_size=200).map(lambda b: b.decode("utf-8", errors="surrogateescape"))
# Every public parser, read from ``__all__`` so that a new one is covered without a test edit.
_PARSERS = tuple(
    getattr(contracts, name) for name in contracts.__all__ if name.startswith(("parse_", "split_"))
)


def test_every_public_function_is_a_parser_or_a_renderer():
    # A public parser named otherwise would slip past the never-raise tests.
    functions = [n for n in contracts.__all__ if inspect.isfunction(getattr(contracts, n))]
    assert all(n.startswith(("parse_", "split_", "render_")) for n in functions), functions
    assert {split_think, parse_critique, contracts.parse_grounding} <= set(_PARSERS)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_TEXT, _DECODED))
def test_parsers_never_raise(text):
    for parse in _PARSERS:
        parse(text)


def _random_text(seed: int, encoding: str, errors: str = "strict") -> str:
    return random.Random(seed).randbytes(65_536).decode(encoding, errors=errors)


# Far beyond what any max_tokens cap lets a model emit (characters; tags: repeats). Shapes that
# cost quadratic time in the parsers (long runs of spaces in a block, many ``{``) are kept small.
_HUGE = 1_000_000
_MANY_TAGS = 20_000
_HOSTILE: dict[str, object] = {
    "empty": "",
    "blank": " \n\t\r\x0b\x0c\u00a0\u3000",
    "nul": "\x00" * 64,
    "none": None,
    "int": 3,
    "nan": float("nan"),
    "bytes": b"<think>t</think><criticism>Overall Grading: Good</criticism>",
    "list": ["<criticism>"],
    "dict": {"better_candidate": "A"},
    "huge_plain": "a" * _HUGE,
    "huge_newlines": "\n" * _HUGE,
    "huge_open_think": "<think>" * _MANY_TAGS,
    "huge_close_think": "</think>" * _MANY_TAGS,
    "huge_answer_tags": "<criticism></criticism>" * _MANY_TAGS,
    "huge_field": GOOD.replace("Explanation: ", "Explanation: " + "word " * (_HUGE // 5)),
    "huge_json_string": json.dumps({"label": "x" * _HUGE, "role": "button", "box": [1, 2, 3, 4]}),
    "many_braces": "{" * 2_000,
    "deep_json_array": '{"a": ' + "[" * 100_000,
    "deep_json_objects": '{"a": ' * 3_000 + "1" + "}" * 3_000,
    "unicode": (
        "<think>理由 🙂 \u202eevil\u202c</think><criticism>\nOverall Grading: Ｇｏｏｄ\n"
        "Explanation: é\u0301\u200b\n</criticism>"
    ),
    "unicode_labels": (
        "<think>t</think><criticism>\nＯverall Grading: Good\nExplanation: e\n</criticism>"
    ),
    "fullwidth_tags": "＜think＞t＜/think＞＜criticism＞Overall Grading: Good＜/criticism＞",
    "lone_surrogates": "<think>\ud800</think><summary>Progress Summary: \udfff\n</summary>",
    "unclosed_think": "<think>the reasoning is cut off by the token cap",
    "unclosed_answer": "<think>t</think><criticism>\nOverall Grading: Bad\nError Dimension:",
    "unclosed_tag_bracket": "<think>t</think><criticism\nOverall Grading: Good",
    "unclosed_json": '<think>t</think>{"better_candidate": "A", "predicted_error_dimension": ',
    "nested_think": (
        "<think><think><think>t</think></think></think>"
        "<summary>Progress Summary: p\nLast Action Result: r</summary>"
    ),
    "nested_answer": (
        "<think>t</think><criticism><criticism>Overall Grading: Good\nExplanation: e"
        "</criticism></criticism>"
    ),
    "answer_inside_think": "<think><criticism>Overall Grading: Good</criticism>",
    "interleaved": "<think><criticism></think></criticism><summary></think></summary>",
    "random_utf8": _random_text(0, "utf-8", "replace"),
    "random_surrogateescape": _random_text(1, "utf-8", "surrogateescape"),
    "random_latin1": _random_text(2, "latin-1"),
    "random_utf16": _random_text(3, "utf-16", "replace"),
}


def _declared_results(parse) -> tuple[type, ...]:
    """The classes a parser's return annotation names (``tuple[...]`` as ``tuple``)."""
    hint = typing.get_type_hints(parse)["return"]
    return tuple(typing.get_origin(t) or t for t in typing.get_args(hint))


@pytest.mark.parametrize("name", sorted(_HOSTILE))
def test_parsers_never_raise_on_hostile_inputs(name):
    value = _HOSTILE[name]
    for parse in _PARSERS:
        params = inspect.signature(parse).parameters
        results = [parse(value)]
        if "reasoning" in params:
            # Hostile separate reasoning, beside a well-formed answer and beside itself.
            results += [parse(GOOD, value), parse(value, value)]
        if "require_think" in params:
            results.append(parse(value, require_think=True))
        for result in results:
            assert isinstance(result, _declared_results(parse)), (parse.__name__, result)


_FREE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(_FREE, _FREE, st.sampled_from([None, *DIMENSIONS]))
def test_render_either_round_trips_or_refuses(think, explanation, dim):
    verdict = "Good" if dim is None else "Bad"
    try:
        text = render_critique_target(think, verdict, dim, explanation)
    except ValueError:
        return
    out = parse_critique(text)
    assert out == CritiqueOutput(think.strip(), verdict, dim, explanation.strip())


_PROSE = st.text(st.sampled_from(list("abcXYZ019 .,;'()-\n")), max_size=80).filter(
    lambda s: any(c.isalnum() for c in s)
)


@settings(max_examples=150, deadline=None)
@given(_PROSE, _PROSE, _PROSE)
def test_plain_prose_always_round_trips(think, progress, last):
    # Ordinary prose must never be refused: the renderer only rejects text that would break tags.
    text = render_history_target(think, progress, last)
    assert parse_history(text) == HistoryOutput(think.strip(), progress.strip(), last.strip())
    crit = render_critique_target(think, "Bad", DIMENSIONS[0], last)
    assert parse_critique(crit).explanation == last.strip()


# -------------------------------------------------------------------------------------------
# reasoning: quoted tags, separate reasoning, required reasoning

QUOTING = (
    "<think>\nThe target format is <think>reasoning</think> then the block, so I reason first.\n"
    "</think>\n<criticism>\nOverall Grading: Good\nExplanation: e\n</criticism>"
)


def test_split_think_tolerates_quoted_tags_in_the_first_block():
    assert split_think("<think>a <think> b</think>rest") == ("a <think> b", "rest")
    assert split_think("<think>x <think>y</think> z</think>rest") == (
        "x <think>y</think> z",
        "rest",
    )
    # Pre-filled opening tag, reasoning that quotes both tags.
    assert split_think("uses <think> and </think> tags</think>rest") == (
        "uses <think> and </think> tags",
        "rest",
    )
    out = parse_critique(QUOTING)
    assert isinstance(out, CritiqueOutput), out
    assert out.think.startswith("The target format is <think>reasoning</think> then")
    # </think> inside the answer is split off as reasoning by no one, and refused as markup in a
    # block: it must never become part of an explanation (or of a training target).
    text = "<think>t</think><criticism>Overall Grading: Good\nExplanation: a </think> b</criticism>"
    assert parse_critique(text).reason == "stray_markup"
    no_think = "<criticism>Overall Grading: Good\nExplanation: a </think> b</criticism>"
    assert parse_critique(no_think).reason == "stray_markup"
    # The reasoning may mention the answer tag; the last one starts the answer.
    mention = (
        "<think>I end with <criticism>.</think><criticism>Overall Grading: Good\nExplanation: e"
    )
    assert parse_critique(mention + "</criticism>").think == "I end with <criticism>."
    _err(parse_critique("<think>I end with <criticism>.</think>"), "missing_tag")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<think>a</think><think>b</think>", "duplicate_think"),
        ("<think>a</think> x <think>b</think>", "duplicate_think"),
        ("<think>a</think><think>b</think><criticism>x</criticism>", "duplicate_think"),
        ("preamble <think>a</think>b", "text_before_think"),
        ("<think>a</think>b<think>", "unclosed_think"),
        ("</think>x<think>", "unclosed_think"),
        ("<think>a <think> b", "unclosed_think"),
    ],
)
def test_split_think_still_rejects_malformed_structure(text, reason):
    _err(parse_critique(text) if "criticism" in text else split_think(text), reason)


def test_separate_reasoning_is_used_and_never_scanned():
    answer = "<criticism>\nOverall Grading: Good\nExplanation: e\n</criticism>"
    reasoning = "It should close with </think>, never open <think> again."
    out = parse_critique(answer, reasoning)
    assert out == CritiqueOutput(reasoning, "Good", None, "e")
    assert out.has_think
    # The same reasoning inline is malformed (a second block opens after the first closed).
    _err(parse_critique(f"<think>{reasoning}</think>{answer}"), "duplicate_think")
    hist = parse_history("<summary>Progress Summary: p\nLast Action Result: r</summary>", " why ")
    assert hist.think == "why"
    state = parse_next_state("<next_state>n</next_state>", "[Action Mechanism]: m")
    assert state.think == "[Action Mechanism]: m" and state.mechanism == "m"
    judge = parse_judge(_judge(), 'quotes {"better_candidate": "A"} </think>')
    assert judge.better_candidate == "B" and judge.think.startswith("quotes")
    pert = parse_perturbation(json.dumps(_perturbation()), "<think> mentioned")
    assert pert.think == "<think> mentioned"
    # Blank separate reasoning counts as absent: inline reasoning in the text still counts.
    assert parse_critique(f"<think>t</think>{answer}", "  ").think == "t"
    _err(parse_critique("", "reasoning"), "empty")
    _err(parse_critique(answer, 3), "empty")  # type: ignore[arg-type]


_EMPTY_THINK = [
    "<criticism>\nOverall Grading: Good\nExplanation: e\n</criticism>",
    "<think> \n </think><criticism>\nOverall Grading: Good\nExplanation: e\n</criticism>",
]


@pytest.mark.parametrize("text", _EMPTY_THINK)
def test_require_think_rejects_missing_or_blank_reasoning(text):
    out = parse_critique(text)
    assert isinstance(out, CritiqueOutput) and not out.has_think
    _err(parse_critique(text, require_think=True), "missing_think")
    _err(parse_critique(text, "  ", require_think=True), "missing_think")
    assert parse_critique(text, "why", require_think=True).has_think


def test_require_think_on_every_parser():
    cases = [
        (parse_history, "<summary>Progress Summary: p\nLast Action Result: r</summary>"),
        (parse_next_state, "<next_state>n</next_state>"),
        (parse_perturbation, json.dumps(_perturbation())),
        (parse_judge, _judge()),
    ]
    for parse, answer in cases:
        assert not parse(answer).has_think
        _err(parse(answer, require_think=True), "missing_think")
        _err(parse("<think></think>" + answer, require_think=True), "missing_think")
        assert parse("<think>r</think>" + answer, require_think=True).think == "r"


@pytest.mark.parametrize("think", ["", "   ", "\n\t"])
def test_renderers_refuse_blank_reasoning(think):
    with pytest.raises(ValueError, match="reasoning"):
        render_history_target(think, "p", "r")
    with pytest.raises(ValueError, match="reasoning"):
        render_critique_target(think, "Good", None, "e")


@pytest.mark.parametrize("think", ["a <think> b", "a </THINK> b"])
def test_renderers_refuse_think_tags_in_reasoning(think):
    with pytest.raises(ValueError, match="think tags"):
        render_history_target(think, "p", "r")
    with pytest.raises(ValueError, match="think tags"):
        render_critique_target(think, "Bad", DIMENSIONS[0], "e")


# -------------------------------------------------------------------------------------------
# emphasis


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("Explanation: **Save** closes **dialog**", "**Save** closes **dialog**"),
        ("Explanation: *a* and *b*", "*a* and *b*"),
        ("**Explanation:** **Save** closes **dialog**", "**Save** closes **dialog**"),
        ("**Explanation**: __x__ and __y__", "__x__ and __y__"),
        ("Explanation: **The dialog closes.**", "The dialog closes."),
        ("**Explanation:** _The dialog closes._", "The dialog closes."),
        ("Explanation: snake_case_name stays", "snake_case_name stays"),
        ("Explanation: **bold start** then text", "**bold start** then text"),
    ],
)
def test_emphasis_is_stripped_only_when_it_wraps_the_whole_value(line, expected):
    text = f"<think>t</think><criticism>\nOverall Grading: **Good**\n{line}\n</criticism>"
    out = parse_critique(text)
    assert isinstance(out, CritiqueOutput), out
    assert out.explanation == expected


# -------------------------------------------------------------------------------------------
# JSON extraction


def test_stray_brace_in_prose_before_the_answer():
    text = "<think>r</think>The set {A, B is open. Answer:\n" + json.dumps(_perturbation())
    assert isinstance(parse_perturbation(text), PerturbationOutput)
    judge = "Note: a { without its partner.\n" + _judge()
    assert parse_judge(judge).better_candidate == "B"


def test_tool_call_json_after_the_answer_does_not_win():
    call = '{"name": "computer_use", "arguments": {"action": "key", "keys": ["enter"]}}'
    text = f"<think>r</think>{json.dumps(_perturbation())}\n<tool_call>\n{call}\n</tool_call>"
    assert isinstance(parse_perturbation(text), PerturbationOutput)
    assert parse_judge(f"{_judge()}\n{call}").better_candidate == "B"


def test_last_complete_object_wins_and_partial_objects_report_missing_keys():
    first = _judge(candidate="A")
    assert parse_judge(f"{first}\n{_judge(candidate='B')}").better_candidate == "B"
    _err(parse_judge('{"better_candidate": "A", "reasoning_summary": "s"} {"x": 1}'), "missing_key")
    _err(parse_judge("[1, 2] {not json}"), "bad_json")


def test_grounding_answer_is_the_last_object_with_its_keys():
    from hivig.contracts import GroundingOutput, parse_grounding

    text = (
        '<think>The click {x: 0.4} lands on a button {"label": "draft"}.</think>\n'
        '{"label": "Save", "role": "button", "box": [400, 410, 480, 440]}'
    )
    got = parse_grounding(text)
    assert isinstance(got, GroundingOutput) and got.box == (400, 410, 480, 440)
    assert (got.label, got.role) == ("Save", "button") and got.has_think
    # Braces in separately returned reasoning are never scanned.
    answer = '{"label": "OK", "role": "button", "box": [1, 2, 3, 4]}'
    assert parse_grounding(answer, "see {label: x}").label == "OK"
    for bad, reason in [
        ('{"label": "OK", "role": "button"}', "missing_key"),
        ('{"label": "", "role": "button", "box": [1, 2, 3, 4]}', "bad_value"),
        ('{"label": "OK", "role": "button", "box": [5, 2, 5, 4]}', "bad_value"),
        ('{"label": "OK", "role": "button", "box": [1, 2, 3, 1001]}', "bad_value"),
        ('{"label": "OK", "role": "button", "box": [1, 2, 3, true]}', "bad_value"),
        ('{"label": "OK", "role": "button", "box": [1.5, 2, 3, 4]}', "bad_value"),
        ("no json here", "bad_json"),
    ]:
        result = parse_grounding(bad)
        assert isinstance(result, ContractError) and result.reason == reason, bad


def test_a_long_blank_run_in_an_answer_is_parsed_in_linear_time():
    # Two optional blank runs side by side once split a long run every possible way (8 s here).
    import time

    blank = " " * 32_000
    text = f"<think>x</think><criticism>{blank}y\nOverall Grading:{blank}Good\n</criticism>"
    start = time.perf_counter()
    for parse in (parse_critique, parse_history):
        parse(text)
    assert time.perf_counter() - start < 0.5


# --- Fences and stray markup inside an answer block (a real annotator's habits) ------------------

_FENCES = ("```", "```text", "~~~", "  ```markdown  ")


@pytest.mark.parametrize("fence", _FENCES)
def test_a_fence_inside_the_criticism_block_never_reaches_the_explanation(fence):
    text = (
        "<think>r</think>\n<criticism>\n"
        f"{fence}\nOverall Grading: Good\nExplanation: The click opens the menu.\n"
        f"{fence.strip()[:3]}\n</criticism>"
    )
    out = parse_critique(text)
    assert isinstance(out, CritiqueOutput), out
    assert out.explanation == "The click opens the menu."


@pytest.mark.parametrize("fence", _FENCES)
def test_a_fence_inside_the_summary_block_never_reaches_the_summary(fence):
    text = (
        f"<think>r</think>\n<summary>\n{fence}\nProgress Summary: Opened the menu.\n"
        f"Last Action Result: The menu is open.\n{fence.strip()[:3]}\n</summary>"
    )
    out = parse_history(text)
    assert isinstance(out, HistoryOutput), out
    assert (out.progress, out.last_result) == ("Opened the menu.", "The menu is open.")


@pytest.mark.parametrize("fence", _FENCES)
def test_a_fence_inside_the_next_state_block_never_reaches_the_state(fence):
    text = f"<think>r</think>\n<next_state>\n{fence}\nThe menu is open.\n```\n</next_state>"
    out = parse_next_state(text)
    assert isinstance(out, TransitionOutput), out
    assert out.next_state == "The menu is open."


def test_a_fence_inside_a_json_value_is_layout_not_content():
    body = json.dumps(
        {
            "dimension_violated": "Visual Hallucination",
            "rejected_thought": "```\nI will click Save.\n```",
            "rejected_proposed_step": '<tool_call>{"name": "click"}</tool_call>',
        }
    )
    out = parse_perturbation(f"<think>r</think>{body}")
    assert isinstance(out, PerturbationOutput), out
    assert out.rejected_thought == "I will click Save."
    only_fence = body.replace("```\\nI will click Save.\\n```", "```\\n```")
    out = parse_perturbation(f"<think>r</think>{only_fence}")
    assert isinstance(out, ContractError) and out.reason == "bad_value"


@pytest.mark.parametrize("junk", ["<|im_end|>", "<|endoftext|>", "<think>", "</THINK>"])
def test_stray_markup_inside_a_block_is_refused_not_kept(junk):
    critique = f"<criticism>Overall Grading: Good\nExplanation: ok {junk}\n</criticism>"
    history = f"<summary>Progress Summary: a {junk}\nLast Action Result: b</summary>"
    for out in (parse_critique(critique), parse_history(history)):
        assert isinstance(out, ContractError) and out.reason in {"stray_markup", "duplicate_tag"}, (
            junk,
            out,
        )
    judge = json.dumps(
        {"better_candidate": "A", "predicted_error_dimension": "Invalid", "reasoning_summary": junk}
    )
    out = parse_judge(judge)
    # Refused one way or another (a think tag in a JSON answer also breaks the reasoning split).
    assert isinstance(out, ContractError), out


def test_a_web_pages_summary_element_named_in_a_criticism_is_content():
    text = "<criticism>Overall Grading: Good\nExplanation: It opens <summary>.\n</criticism>"
    out = parse_critique(text)
    assert isinstance(out, CritiqueOutput) and out.explanation == "It opens <summary>."


def test_backticks_inside_a_sentence_are_content():
    text = "<criticism>Overall Grading: Good\nExplanation: It types `ls` in.\n</criticism>"
    out = parse_critique(text)
    assert isinstance(out, CritiqueOutput) and out.explanation == "It types `ls` in."
