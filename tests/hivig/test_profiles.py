"""Critic profiles: one folder is the whole interface, and the gateway serves exactly it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hivig.messages import ImagePart, ImageRef, TextPart
from hivig.profiles import (
    PROFILE_FILES,
    GenerationBudget,
    ProfileError,
    default_profile,
    load_profile,
)
from hivig.prompts import (
    PromptError,
    build_critique_messages,
    build_history_messages,
    parse_template,
)
from serve.app import create_app
from serve.config import ConfigError
from tests.fakes.gateway import CLICK, ScriptedBackend, observe, serve_config, start_session

ROOT = Path(__file__).resolve().parents[2]

INLINE_CRITIQUE = """@@ system
Judge the step. Tools:
$action_space
Errors:
$taxonomy
@@ user
@@ images inline screenshot
Goal:
$task

So far:
$history

Screen now:
$screenshot

Current Proposed Step ($$5 budget):
$step
"""

INLINE_HISTORY = """@@ system
Track progress. Tools:
$action_space
@@ user
@@ images inline before after
Goal:
$task

Before summary:
$previous_summary

Before:
$before

Step:
$step

After:
${after}
"""


def _house_profile(root: Path) -> Path:
    """A profile unlike the default in every text, with images inside the user text."""
    folder = default_profile().write(root / "house")
    (folder / "critic_critique.txt").write_text(INLINE_CRITIQUE)
    (folder / "critic_history.txt").write_text(INLINE_HISTORY)
    (folder / "action_space_computer_use.txt").write_text("DESKTOP TOOLS")
    (folder / "action_space_mobile_use.txt").write_text("PHONE TOOLS")
    (folder / "taxonomy.txt").write_text("- Only One: a single made-up dimension")
    (folder / "initial_summary.txt").write_text("Nothing yet.")
    settings = (folder / "profile.yaml").read_text()
    settings = settings.replace("name: hivig-v1", "name: house")
    settings = settings.replace("recurrence_note: true", "recurrence_note: false")
    settings = settings.replace("critique_max_tokens: 768", "critique_max_tokens: 3000")
    (folder / "profile.yaml").write_text(settings)
    return folder


def test_the_default_profile_builds_the_golden_prompts_byte_for_byte(tmp_path):
    profile = load_profile(default_profile().write(tmp_path / "p"))
    assert profile.digest == default_profile().digest and profile.is_default
    for platform in ("web", "android", "windows"):
        shot, before = ImageRef("s.png", ()), ImageRef("b.png")
        plain = build_critique_messages("Open it", platform, "Step 1:\nx", shot, "y")
        via = build_critique_messages("Open it", platform, "Step 1:\nx", shot, "y", profile=profile)
        assert plain == via and plain.prompt_id == via.prompt_id == "critic_critique_v1"
        plain = build_history_messages("Open it", platform, "p", before, shot, "y")
        via = build_history_messages("Open it", platform, "p", before, shot, "y", profile=profile)
        assert plain == via


def test_inline_slots_put_each_image_where_it_stands():
    t = parse_template("critic_history", 1, INLINE_HISTORY)
    before, after = ImageRef("b.png"), ImageRef("a.png")
    # A value that spells a slot stays text: slots are cut out of the template, not the values.
    messages = t.render(
        action_space="A",
        task="type $before",
        previous_summary="none",
        before=before,
        after=after,
        step="click",
    )
    parts = messages[1].content
    assert [type(p) for p in parts] == [TextPart, ImagePart, TextPart, ImagePart]
    assert parts[0].text == "Goal:\ntype $before\n\nBefore summary:\nnone\n\nBefore:\n"
    assert parts[1].image is before and parts[3].image is after
    assert parts[2].text == "\n\nStep:\nclick\n\nAfter:\n"
    shot = parse_template("critic_critique", 1, INLINE_CRITIQUE).render(
        action_space="A", taxonomy="T", task="t", history="h", screenshot=before, step="s"
    )
    assert (
        shot[1].content[2].text == "\n\nCurrent Proposed Step ($5 budget):\ns"
    )  # $$ is a literal dollar


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ("@@ images inline screenshot\n$task $history $step", "must stand exactly once"),
        ("@@ images inline screenshot\n$screenshot $task $history $step $screenshot", "found 2"),
        ("@@ images inline screenshot\n$$screenshot $task $history $step", "found 0"),
    ],
)
def test_an_inline_slot_stands_exactly_once(user, message):
    with pytest.raises(PromptError, match=message):
        parse_template(
            "critic_critique", 1, f"@@ system\n$action_space $taxonomy\n@@ user\n{user}\n"
        )


def test_a_profile_folder_with_a_missing_or_bad_part_is_one_line(tmp_path):
    with pytest.raises(ProfileError, match="profile folder not found"):
        load_profile(tmp_path / "nowhere")
    for name in PROFILE_FILES:
        folder = default_profile().write(tmp_path / name)
        (folder / name).unlink()
        with pytest.raises(ProfileError, match=f"lacks {name}") as e:
            load_profile(folder)
        assert "\n" not in str(e.value)
    folder = default_profile().write(tmp_path / "bad")
    cases = [
        ("profile.yaml", "frame:\n  geometry: fisheye\n", "frame.geometry must be one of"),
        ("profile.yaml", "colour: red\n", "unknown keys"),
        ("profile.yaml", "frame:\n  zoom: 2\n", "unknown `frame` keys"),
        ("profile.yaml", "generation:\n  critique_max_tokens: 0\n", "must be positive"),
        ("profile.yaml", "{unclosed", "not valid YAML"),
        ("critic_critique.txt", "@@ system\n$task\n@@ user\nhi\n", "differ from the documented"),
        ("taxonomy.txt", b"\xff\xfe", "not UTF-8"),
    ]
    for file, text, message in cases:
        good = (folder / file).read_bytes()
        (folder / file).write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ProfileError, match=message) as e:
            load_profile(folder)
        assert "\n" not in str(e.value) and str(folder) in str(e.value)
        (folder / file).write_bytes(good)
    assert load_profile(folder).is_default


def test_the_gateway_serves_a_profile_exactly(tmp_path):
    folder = _house_profile(tmp_path)
    profile = load_profile(folder)
    assert not profile.is_default and profile.generation.critique_max_tokens == 3000
    backend = ScriptedBackend()
    cfg = serve_config(tmp_path / "state", f"critic.profile={folder}")
    with TestClient(create_app(cfg, backend)) as c:
        info = c.get("/v1/info").json()
        assert info["profile"] == {"name": "house", "digest": profile.digest}
        sid = start_session(c)
        observe(c, sid, 0)
        observe(c, sid, 1, prev=CLICK)
        v = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 1, "action": CLICK})
        assert v.status_code == 200, v.text
    history = next(m for kind, m in backend.calls if kind == "history")
    critique = next(m for kind, m in backend.calls if kind == "critique")
    assert history[0].text() == "Track progress. Tools:\nDESKTOP TOOLS"
    user = history[1].content
    assert [type(p) for p in user] == [TextPart, ImagePart, TextPart, ImagePart]
    # The session's first update reads the profile's own opening summary.
    assert "Before summary:\nNothing yet.\n\nBefore:\n" in user[0].text
    assert critique[0].text().endswith("Errors:\n- Only One: a single made-up dimension")
    assert [type(p) for p in critique[1].content] == [TextPart, ImagePart, TextPart]
    assert critique[1].content[0].text.startswith("Goal:\n")


def test_the_profiles_budget_replaces_the_configs(tmp_path):
    folder = _house_profile(tmp_path)
    settings = (folder / "profile.yaml").read_text()
    settings = settings.replace("critique_deadline_s: 8.0", "critique_deadline_s: 95.0")
    (folder / "profile.yaml").write_text(settings)
    backend = ScriptedBackend()
    app = create_app(serve_config(tmp_path / "state", f"critic.profile={folder}"), backend)
    with TestClient(app) as c:
        assert app.state.gateway.critic.budget == load_profile(folder).generation
        assert c.get("/v1/info").json()["deadlines_s"] == {"observe": 8.0, "critique": 95.0}
        sid = start_session(c)
        observe(c, sid, 0)
        c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
    assert backend.samplings["critique"].max_tokens == 3000
    # Without a profile, the config's own values hold (the default profile's budget).
    assert GenerationBudget() == default_profile().generation


def test_profile_and_prompt_dir_exclude_each_other(tmp_path):
    with pytest.raises(ConfigError, match="exclude each other"):
        serve_config(tmp_path, "critic.profile=a", "critic.prompt_dir=b")


def test_serving_a_broken_profile_is_one_line_and_exit_2(tmp_path):
    folder = default_profile().write(tmp_path / "p")
    (folder / "chat_template.jinja").unlink()
    run = subprocess.run(
        [sys.executable, "-m", "serve", "--config", "configs/serve/vllm.yaml", "model=critic",
         "backend.base_url=http://127.0.0.1:9/v1", f"critic.profile={folder}",
         f"sessions.state_dir={tmp_path / 's'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "critic.profile" in lines[0]
    assert "lacks chat_template.jinja" in lines[0]


# ---------------------------------------------------------------------------------------------
# Pixels: the frame policy of a profile


LLAMAFACTORY = (
    "frame:\n  geometry: llamafactory\n  image_max_pixels: 1048576\n  image_min_pixels: 1024\n"
    "  markers: original\n  size_class: aspect\n  drag_arrows: false\n"
)


@pytest.mark.parametrize(
    ("size", "grid"), [((1920, 1080), (1376, 768)), ((1080, 2400), (672, 1536)),
                       ((1440, 3120), (704, 1504))],
)  # fmt: skip
def test_a_llamafactory_policy_gives_llamafactorys_grids(size, grid):
    from PIL import Image

    from hivig.vision import FramePolicy, canonical_frame

    policy = FramePolicy(geometry="llamafactory", markers="original", size_class="aspect")
    shot = Image.new("RGB", size, (200, 200, 200))
    # The processor's own budget (Qwen3-VL's) leaves LlamaFactory's resize as the only cap.
    frame = canonical_frame(shot, min_pixels=65_536, max_pixels=16_777_216, policy=policy)
    assert frame.size == grid
    assert canonical_frame(shot, min_pixels=65_536, max_pixels=1_048_576).size != grid


def test_the_gateway_sends_the_profiles_pixels(tmp_path):
    from PIL import Image

    from hivig.messages import PointMark
    from hivig.vision import FramePolicy, canonical_frame, load_image
    from tests.fakes.gateway import b64, screen

    folder = default_profile().write(tmp_path / "lf")
    settings = (folder / "profile.yaml").read_text()
    start = settings.index("frame:")
    end = settings.index("generation:")
    (folder / "profile.yaml").write_text(settings[:start] + LLAMAFACTORY + settings[end:])
    profile = load_profile(folder)
    backend = ScriptedBackend()
    cfg = serve_config(tmp_path / "state", f"critic.profile={folder}", "frame.max_pixels=16777216")
    shot = screen(1280, 900, seed=3)
    click = {"type": "left_click", "x": 500, "y": 400}
    drag = {"type": "left_click_drag", "x": 300, "y": 300}
    with TestClient(create_app(cfg, backend)) as c:
        sid = start_session(c, screen={"w": 1280, "h": 900}, coord_space="norm1000")
        assert observe(c, sid, 0, screenshot=b64(shot)).status_code == 200
        for action in (click, drag):
            r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": action})
            assert r.status_code == 200, r.text
    click_call, drag_call = [m for kind, m in backend.calls if kind == "critique"]
    sent = click_call[1].images()[0]
    # The marker is drawn on the 1280x900 original (aspect ratio: a desktop marker), then
    # LlamaFactory's resize, then the grid: exactly what training materialises.
    expected = canonical_frame(
        load_image(shot), min_pixels=1024, max_pixels=16_777_216, policy=profile.frame,
        marks=(PointMark(500, 400),), size_class="desktop",
    )  # fmt: skip
    assert sent.size == expected.size == (1216, 864)
    assert sent.tobytes() == expected.tobytes()
    on_frame = canonical_frame(
        load_image(shot), min_pixels=1024, max_pixels=16_777_216,
        policy=FramePolicy(geometry="llamafactory"), marks=(PointMark(500, 400),),
    )  # fmt: skip
    assert sent.tobytes() != on_frame.tobytes()  # drawn before the resize, not after
    # A desktop drag names only its end: without drag arrows it is sent unmarked.
    clean = canonical_frame(
        load_image(shot), min_pixels=1024, max_pixels=16_777_216, policy=profile.frame
    )
    assert drag_call[1].images()[0].tobytes() == clean.tobytes()
    assert isinstance(sent, Image.Image)


@pytest.mark.parametrize("feedback", ["record", "inner"])
def test_the_previous_summary_is_fed_back_as_the_profile_says(tmp_path, feedback):
    folder = _house_profile(tmp_path)
    settings = (folder / "profile.yaml").read_text()
    (folder / "profile.yaml").write_text(
        settings.replace("summary_feedback: record", f"summary_feedback: {feedback}")
    )
    # The model writes its summary its own way (spacing the parsed record does not keep).
    own_words = "Progress Summary:   Opened the settings.\nLast Action Result:    It opened."
    backend = ScriptedBackend(history_answers=[f"<summary>\n{own_words}\n</summary>"] * 3)
    cfg = serve_config(tmp_path / "state", f"critic.profile={folder}")
    with TestClient(create_app(cfg, backend)) as c:
        sid = start_session(c)
        for k in range(3):
            assert observe(c, sid, k, prev=CLICK if k else None).status_code == 200
    histories = [m for kind, m in backend.calls if kind == "history"]
    assert len(histories) == 2
    second = histories[1][1].content[0].text
    if feedback == "inner":
        assert f"Before summary:\n{own_words}\n\nBefore:" in second
    else:
        record = "Progress Summary: Opened the settings.\nLast Action Result: It opened."
        assert f"Before summary:\n{record}\n\nBefore:" in second
        assert own_words not in second


def test_tool_calls_are_escaped_as_the_profile_was_trained(tmp_path):
    folder = _house_profile(tmp_path)
    settings = (folder / "profile.yaml").read_text()
    (folder / "profile.yaml").write_text(
        settings.replace("tool_call_ascii: false", "tool_call_ascii: true")
    )
    backend = ScriptedBackend()
    typed = {"type": "type", "text": "Grüße 😀", "intent": "Type the greeting: Grüße"}
    cfg = serve_config(tmp_path / "state", f"critic.profile={folder}")
    with TestClient(create_app(cfg, backend)) as c:
        sid = start_session(c)
        observe(c, sid, 0)
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": typed})
        assert r.status_code == 200, r.text
    critique = next(m for kind, m in backend.calls if kind == "critique")
    text = critique[1].text()
    assert '"text": "Gr\\u00fc\\u00dfe \\ud83d\\ude00"' in text
    assert "Action: Type the greeting: Grüße" in text  # the intent line is not JSON


def test_a_masked_proposal_keeps_its_first_call_where_the_profile_says(tmp_path):
    folder = _house_profile(tmp_path)
    settings = (folder / "profile.yaml").read_text()
    (folder / "profile.yaml").write_text(
        settings.replace("masked_calls: all", "masked_calls: first")
    )
    profile = load_profile(folder)
    two = (
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "mouse_move", '
        '"coordinate": [5, 5]}}\n</tool_call>\n<tool_call>\n{"name": "computer_use", '
        '"arguments": {"action": "scroll", "pixels": -3}}\n</tool_call>'
    )
    shot = ImageRef("s.png")
    masked = build_critique_messages("t", "web", "", shot, two, profile=profile)
    assert masked[1].text().count("<tool_call>") == 1 and "mouse_move" in masked[1].text()
    stated = build_critique_messages(
        "t", "web", "", shot, f"Action: Scroll\n{two}", profile=profile
    )
    assert stated[1].text().count("<tool_call>") == 2  # a stated intent keeps every call
    history = build_history_messages("t", "web", "p", shot, shot, two, profile=profile)
    assert history[1].text().count("<tool_call>") == 2  # executed steps keep every call


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "data_gen", "run", "--config", "configs/data_gen/demo.yaml",
         "corpus=data_gen/sample_corpus", "out=OUT", "profile=NOWHERE"],
        ["-m", "hivig.cli", "profile", "check", "--checkpoint", "NOWHERE"],
        ["-m", "hivig.cli", "profile", "show", "NOWHERE"],
    ],
)  # fmt: skip
def test_a_wrong_profile_or_checkpoint_path_is_one_line_and_exit_2(argv, tmp_path):
    argv = [a.replace("NOWHERE", str(tmp_path / "nowhere")) for a in argv]
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    run = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert str(tmp_path / "nowhere") in lines[0]
