"""Prompt templates and builders: loading, strict rendering, message order, golden text."""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources

import pytest

from hivig.actions import (
    PLATFORMS,
    Click,
    LeftClick,
    MouseMove,
    Scroll,
    Swipe,
    Type,
    action_space,
    space_for_platform,
)
from hivig.messages import ImagePart, ImageRef, PointMark, TextPart
from hivig.prompts import (
    ANNOTATOR_PROMPTS,
    CRITIC_PROMPTS,
    PromptError,
    _builders,
    available_prompts,
    build_critique_messages,
    build_history_annotation_messages,
    build_history_messages,
    build_judge_messages,
    build_perturbation_messages,
    build_rationale_bad_messages,
    build_rationale_good_messages,
    build_transition_messages,
    format_step,
    format_trajectory,
    load_prompt,
    parse_template,
)
from hivig.taxonomy import DIMENSIONS, lookup_dimension

BEFORE = ImageRef("ep1/step_0.png")
AFTER = ImageRef("ep1/step_1.png")
MARKED = ImageRef("ep1/step_1.png", marks=(PointMark(412, 88),), size_class="desktop")


def _builders_for(platform):
    """Every builder with representative arguments (name, callable)."""
    space = space_for_platform(platform)
    point = LeftClick((412, 88)) if space == "computer_use" else Click((412, 88))
    step = format_step("Open the File menu", [point], space)
    hist = format_trajectory([step])
    vh = lookup_dimension("Visual Hallucination")
    return {
        "critic_history": lambda: build_history_messages(
            "Save the file", platform, "Progress Summary: none.", BEFORE, AFTER, step
        ),
        "critic_critique": lambda: build_critique_messages(
            "Save the file", platform, hist, MARKED, step
        ),
        "annotator_transition": lambda: build_transition_messages(
            "Save the file", platform, BEFORE, AFTER, step
        ),
        "annotator_history": lambda: build_history_annotation_messages(
            "Save the file", platform, "Progress Summary: none.", BEFORE, AFTER, step
        ),
        "annotator_perturbation": lambda: build_perturbation_messages(
            "Save the file", platform, hist, AFTER, "I open the menu.", step, DIMENSIONS[:3]
        ),
        "annotator_judge": lambda: build_judge_messages(
            "Save the file", platform, hist, AFTER, step, step
        ),
        "annotator_rationale_good": lambda: build_rationale_good_messages(
            "Save the file", platform, hist, MARKED, step, "mech", "effect", "next"
        ),
        "annotator_rationale_bad": lambda: build_rationale_bad_messages(
            "Save the file", platform, hist, MARKED, step, vh, step, "mech", "effect"
        ),
    }


# -------------------------------------------------------------------------------------------
# loading


def test_all_prompts_shipped():
    shipped = available_prompts()
    assert set(CRITIC_PROMPTS) | set(ANNOTATOR_PROMPTS) <= set(shipped)
    for name, versions in shipped.items():
        template = load_prompt(name)
        assert template.version == versions[-1]
        assert template.id == f"{name}_v{template.version}"
        assert template.system and template.user


def test_load_errors():
    with pytest.raises(PromptError, match="unknown prompt"):
        load_prompt("critic_critque")
    with pytest.raises(PromptError, match="no version 99"):
        load_prompt("critic_critique", 99)
    assert load_prompt("critic_critique", 1).id == "critic_critique_v1"


def test_render_rejects_missing_unused_and_wrong_kinds():
    t = load_prompt("critic_critique")
    values = {
        "action_space": "{}",
        "taxonomy": "-",
        "task": "t",
        "history": "",
        "screenshot": MARKED,
        "step": "s",
    }
    assert len(t.render(**values)) == 2
    with pytest.raises(PromptError, match=r"missing values \['task'\]"):
        t.render(**{k: v for k, v in values.items() if k != "task"})
    with pytest.raises(PromptError, match=r"unused values \['extra'\]"):
        t.render(**values, extra="x")
    with pytest.raises(PromptError, match="needs an ImageRef"):
        t.render(**{**values, "screenshot": "shot.png"})
    with pytest.raises(PromptError, match="must be a str"):
        t.render(**{**values, "task": MARKED})


def test_values_are_not_substituted_twice():
    t = parse_template("x", 1, "@@ system\n$a\n@@ user\n$b")
    msgs = t.render(a="$b", b="${a} $$")
    assert msgs[0].text() == "$b" and msgs[1].text() == "${a} $$"


def test_template_file_format_errors():
    ok = parse_template("x", 1, "@@ system\nS $a\n@@ user\n@@ images img\nU $b $$5")
    assert ok.image_slots == ("img",) and ok.placeholders == ("a", "b", "img")
    msgs = ok.render(a="1", b="2", img=BEFORE)
    assert msgs[0].text() == "S 1" and msgs[1].text() == "U 2 $5"
    with pytest.raises(PromptError, match="must start"):
        parse_template("x", 1, "S\n@@ user\nU")
    with pytest.raises(PromptError, match="no '@@ user'"):
        parse_template("x", 1, "@@ system\nS")
    with pytest.raises(PromptError, match="malformed placeholder"):
        parse_template("x", 1, "@@ system\nprice $5\n@@ user\nU")


# -------------------------------------------------------------------------------------------
# every template for every platform


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_template_renders_for_every_platform(platform):
    builders = _builders_for(platform)
    assert set(builders) == set(CRITIC_PROMPTS) | set(ANNOTATOR_PROMPTS)
    space = space_for_platform(platform)
    tools = json.dumps(action_space(space), ensure_ascii=False)
    for name, build in builders.items():
        messages = build()
        assert messages.prompt_id == load_prompt(name).id
        system, user = messages
        assert system.role == "system" and user.role == "user"
        assert all(isinstance(p, TextPart) for p in system.content)
        assert f"<tools>\n{tools}\n</tools>" in system.text(), name
        other = "mobile_use" if space == "computer_use" else "computer_use"
        assert f'"name": "{other}"' not in system.text()
        # Stable parts first: every image precedes every text item of the user turn.
        kinds = [type(p) for p in user.content]
        first_text = kinds.index(TextPart)
        assert all(k is ImagePart for k in kinds[:first_text])
        assert all(k is TextPart for k in kinds[first_text:])
        assert all(isinstance(p.image, ImageRef) for p in user.content if isinstance(p, ImagePart))
        for text in (system.text(), user.text()):
            assert not re.search(r"\$[A-Za-z_{]", text), (name, text)


def test_image_order_and_counts():
    b = _builders_for("windows")
    assert b["critic_history"]()[1].images() == [BEFORE, AFTER]
    assert b["annotator_transition"]()[1].images() == [BEFORE, AFTER]
    assert b["critic_critique"]()[1].images() == [MARKED]
    assert b["annotator_judge"]()[1].images() == [AFTER]


def test_taxonomy_in_critic_and_judge_prompts():
    b = _builders_for("web")
    critique = b["critic_critique"]()[0].text()
    positions = [critique.index(f"- {d.name}: ") for d in DIMENSIONS]
    assert positions == sorted(positions)  # training-prompt order
    judge_order = list(reversed(DIMENSIONS))
    judge = build_judge_messages("t", "web", "", AFTER, "a", "b", dimension_order=judge_order)
    positions = [judge[1].text().index(f"- {d.name}: ") for d in judge_order]
    assert positions == sorted(positions)
    with pytest.raises(PromptError):
        build_judge_messages("t", "web", "", AFTER, "a", "b", dimension_order=DIMENSIONS[:11])


def test_judge_system_prompt_is_the_same_for_every_dimension_order():
    # The shuffled taxonomy is per request: it must sit in the user text, never in the system
    # prompt, or every request gets a different prefix and prefix caching never hits.
    orders = [DIMENSIONS, tuple(reversed(DIMENSIONS)), DIMENSIONS[6:] + DIMENSIONS[:6]]
    built = [
        build_judge_messages("t", "web", "h", AFTER, "a", "b", dimension_order=o) for o in orders
    ]
    systems = {m[0].text() for m in built}
    assert len(systems) == 1
    assert not any(d.definition in next(iter(systems)) for d in DIMENSIONS)
    users = [m[1].text() for m in built]
    assert len(set(users)) == len(orders)  # the order is still shown, per request
    for user in users:
        assert all(f"- {d.name}: {d.definition}" in user for d in DIMENSIONS)


def test_rationale_bad_shows_only_its_dimension():
    vh = lookup_dimension("Visual Hallucination")
    msgs = _builders_for("android")["annotator_rationale_bad"]()
    text = msgs[0].text() + msgs[1].text()
    assert vh.definition in text and vh.consequence in text
    assert "Error Dimension: Visual Hallucination" in msgs[0].text()
    assert lookup_dimension("Semantic Error").definition not in text


def test_perturbation_lists_candidates_and_needs_one():
    msgs = _builders_for("mac")["annotator_perturbation"]()
    for d in DIMENSIONS[:3]:
        assert f"- {d.name}: " in msgs[1].text()
    assert f"- {DIMENSIONS[5].name}: " not in msgs[1].text()
    with pytest.raises(PromptError):
        build_perturbation_messages("t", "mac", "", AFTER, "x", "y", [])


def test_unknown_platform_is_a_typed_error():
    from hivig.actions import ActionError

    with pytest.raises(ActionError):
        build_critique_messages("t", "beos", "", MARKED, "s")


# -------------------------------------------------------------------------------------------
# step and trajectory text


def test_format_step_masking_keeps_all_calls():
    actions = [MouseMove((500, 554)), Scroll(-300)]
    full = format_step("  Scroll the   list down ", actions, "computer_use")
    masked = format_step("Scroll the list down", actions, "computer_use", mask_intent=True)
    assert full.startswith("Action: Scroll the list down\n<tool_call>")
    assert full.split("\n", 1)[1] == masked
    assert masked.count("<tool_call>") == 2 and "Action:" not in masked
    assert format_step(None, actions, "computer_use") == masked
    assert format_step("   ", actions, "computer_use") == masked
    with pytest.raises(PromptError):
        format_step("x", [], "computer_use")


def test_format_trajectory():
    s1 = format_step("Type the name", [Type("Zoë")], "computer_use")
    s2 = format_step("Swipe up", [Swipe((500, 800), (500, 200))], "mobile_use")
    text = format_trajectory([s1, s2])
    assert text.startswith("Step 1:\nAction: Type the name\n<tool_call>")
    assert "Zoë" in text  # UTF-8, not \\u escapes
    assert "\n\nStep 2:\nAction: Swipe up\n" in text
    assert format_trajectory([]) == ""


# -------------------------------------------------------------------------------------------
# golden critique prompt

GOLDEN_USER = """User Instruction (Goal): Save the report as PDF
Trajectory:
Step 1:
Action: Open the File menu
<tool_call>
{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [31, 12]}}
</tool_call>
Current Observation: the image above.
Current Proposed Step:
Action: Click Export as PDF
<tool_call>
{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [88, 240]}}
</tool_call>"""

# sha256 of the critic_critique_v1 system text with the action space replaced by "<SPACE>".
# A changed hash means a released prompt was edited: add critic_critique_v2 instead.
GOLDEN_SYSTEM_SHA256 = "6cce2608482e6cddf390a73e5d237f1aa1b32a98c5e14b894bef3c26d1ed9c0b"


def test_golden_critique_prompt(monkeypatch):
    monkeypatch.setattr(_builders, "action_space_text", lambda platform: "<SPACE>")
    past = format_step("Open the File menu", [LeftClick((31, 12))], "computer_use")
    step = format_step("Click Export as PDF", [LeftClick((88, 240))], "computer_use")
    shot = ImageRef("ep/3.png", marks=(PointMark(88, 240),))
    messages = build_critique_messages(
        "Save the report as PDF", "windows", format_trajectory([past]), shot, step, version=1
    )
    assert messages.prompt_id == "critic_critique_v1"
    assert messages[1].content == [ImagePart(shot), TextPart(GOLDEN_USER)]
    system = messages[0].text()
    assert system.startswith("You are a GUI environment simulator and action critic.")
    assert "<tools>\n<SPACE>\n</tools>" in system
    assert hashlib.sha256(system.encode()).hexdigest() == GOLDEN_SYSTEM_SHA256


# -------------------------------------------------------------------------------------------
# released templates are never edited

# sha256 of every shipped ``<name>_v<N>.txt``. A changed hash means a released template was edited:
# revert it and add ``<name>_v<N+1>.txt`` instead. A new version is added here with its hash.
TEMPLATE_SHA256 = {
    "annotator_perturbation_v2.txt": (
        "5f2256c035eb4049dc3fdbae67dcd5b5c483030c61b255c55fe5a5241c001cd7"
    ),
    "annotator_rationale_bad_v2.txt": (
        "9102f50c58b34fcc762605f554507fe4ca36d9ff790c26832cf2514b2b98a476"
    ),
    "annotator_rationale_good_v2.txt": (
        "b0de4d22348fe63a254867f44f6781cc012811f25a23c5df2257b8795d2dd3ac"
    ),
    "annotator_grounding_v1.txt": (
        "51f14b1606f7e5f29a6c4c896ffe1b56c55aabc33d42b3a5e5026a1b9089ceb9"
    ),
    "annotator_history_v1.txt": "ffa0163c7c8c21f470534479bce184508694d6ec2b8f2127ed22ea8e7624664a",
    "annotator_judge_v1.txt": "055f46d520456369f3d8623daf2b1390dc3bba99f9ef150c5785ede95d7724ca",
    "annotator_perturbation_v1.txt": (
        "f40921ccf01eff8287db8a93122009ef70285d4dbe6f18934e116a4aa4da05b9"
    ),
    "annotator_rationale_bad_v1.txt": (
        "de0a92216cbce17c5e67b04eb7540bc9a4d0573d2f1870c20b14418d59dddb66"
    ),
    "annotator_rationale_good_v1.txt": (
        "03bd1604ace4c1591911849361425f06084c34e7c0019155a32fdee9e3d0a1bd"
    ),
    "annotator_transition_v1.txt": (
        "c4aae1159f008cb78bcd68355a7e3ee22948b4663c817ad20e0bb2e574dcae6f"
    ),
    "critic_critique_v1.txt": "683be125830d53a15bc89d16403b2c43249ea371160eb71e9727cf4d36f83b1b",
    "critic_history_v1.txt": "49826ecac59857adbfac64495358ac05f6daf2e20b20cb906477c101a576656e",
}


def _shipped_templates() -> dict[str, bytes]:
    folder = resources.files("hivig.prompts")
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if re.fullmatch(r"[a-z][a-z0-9_]*_v[1-9][0-9]*\.txt", entry.name)
    }


def _pin_problems(shipped: dict[str, bytes]) -> list[str]:
    problems = [f"{name}: no pinned hash" for name in sorted(shipped.keys() - TEMPLATE_SHA256)]
    problems += [f"{name}: pinned but gone" for name in sorted(TEMPLATE_SHA256.keys() - shipped)]
    problems += [
        f"{name}: edited after release (add a new version instead)"
        for name, data in sorted(shipped.items())
        if name in TEMPLATE_SHA256 and hashlib.sha256(data).hexdigest() != TEMPLATE_SHA256[name]
    ]
    return problems


def test_every_shipped_template_is_pinned():
    shipped = _shipped_templates()
    assert sorted(shipped) == sorted(
        f"{name}_v{v}.txt" for name, versions in available_prompts().items() for v in versions
    )
    assert _pin_problems(shipped) == []


def test_template_pin_detects_edits_additions_and_removals():
    # Negative controls on copies: one changed byte, an unpinned new version, a removed file.
    shipped = _shipped_templates()
    name = "annotator_judge_v1.txt"
    edited = {**shipped, name: shipped[name].replace(b"\n", b" \n", 1)}
    assert _pin_problems(edited) == [f"{name}: edited after release (add a new version instead)"]
    added = {**shipped, "annotator_judge_v2.txt": shipped[name]}
    assert _pin_problems(added) == ["annotator_judge_v2.txt: no pinned hash"]
    removed = {k: v for k, v in shipped.items() if k != name}
    assert _pin_problems(removed) == [f"{name}: pinned but gone"]
