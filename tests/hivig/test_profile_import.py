"""hivig profile import-reference: the authors' interface, read from a copy of their repository.

The fixture under tests/fixtures/reference_repo has the paths and Python shape of the HiViG
repository (revision fd1d4a2) with our own wording and numbers; it is passed with its own
digests as ``known=``. Set HIVIG_REFERENCE_REPO to an unpacked copy of the real repository to
also run the import against it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from hivig.messages import ImagePart, ImageRef, TextPart
from hivig.profiles import PROFILE_FILES, load_profile
from hivig.profiles.reference import (
    CRITIQUE_SFT,
    KNOWN_REVISIONS,
    PROGRESS_SUMMARY,
    REVISION,
    SOURCES,
    SUMMARY_SFT,
    ReferenceImportError,
    import_reference,
)
from hivig.prompts import parse_template

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference_repo"


def _digests(root: Path) -> dict[str, str]:
    return {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in SOURCES}


def _known(root: Path) -> dict[str, dict[str, str]]:
    return {"fixture": _digests(root)}


def _module(root: Path, path: str) -> ModuleType:
    # The fixture modules are ours and define only constants and functions.
    name = "fixture_" + hashlib.sha256(str(root / path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, root / path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "repo"))


def _edit(root: Path, path: str, old: str, new: str) -> None:
    file = root / path
    text = file.read_text("utf-8")
    assert old in text
    file.write_text(text.replace(old, new, 1), "utf-8")


def _flat(content: list[TextPart | ImagePart]) -> str:
    return "".join(p.text if isinstance(p, TextPart) else "<image>" for p in content)


def _refusal(repo: Path, out: Path, **kwargs: object) -> str:
    with pytest.raises(ReferenceImportError) as info:
        import_reference(repo, out, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert not out.exists(), "a refused import must write nothing"
    return message


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "reference"
    report = import_reference(FIXTURE, out, known=_known(FIXTURE))
    assert report.revision == "fixture"
    assert report.out == out
    return out


def test_fixture_import_writes_the_profile(imported: Path) -> None:
    assert sorted(p.name for p in imported.iterdir()) == sorted(PROFILE_FILES)
    critique = _module(FIXTURE, CRITIQUE_SFT)
    body = yaml.safe_load((imported / "profile.yaml").read_text("utf-8"))
    assert body["name"] == "hivig-reference"
    assert "fixture" in body["source"] and "\n" not in body["source"]
    assert body["render"] == {
        "tool_call_ascii": True,
        "masked_calls": "first",
        "summary_feedback": "inner",
    }
    assert body["frame"] == {
        "geometry": "llamafactory",
        "image_max_pixels": 802816,
        "image_min_pixels": 28 * 28,
        "markers": "original",
        "size_class": "aspect",
        "drag_arrows": False,
    }
    assert body["generation"] == {
        "history_max_tokens": 4096,
        "critique_max_tokens": 4096,
        "observe_deadline_s": 120,
        "critique_deadline_s": 120,
        "recurrence_note": False,
    }
    assert body["marker_geometry"] == {
        "mobile": {"gap": [5, 70], "arm": [11, 35], "width": [3, 140], "head": [9, 50]},
        "desktop": {"gap": [2, 140], "arm": [5, 110], "width": [1, 250], "head": [7, 100]},
    }
    read = lambda name: (imported / name).read_bytes().decode("utf-8")  # noqa: E731
    assert read("action_space_computer_use.txt") == critique.action_spaces["desktop"]
    assert read("action_space_mobile_use.txt") == critique.action_spaces["mobile"]
    assert read("taxonomy.txt") == "\n".join(f"- {d}" for d in critique.error_dimensions)
    assert read("initial_summary.txt") == "Nothing has happened yet; the task starts here."
    chat = resources.files("hivig.prompts").joinpath("chat_template_v1.jinja").read_text("utf-8")
    assert read("chat_template.jinja") == chat


def test_the_written_profile_loads(imported: Path) -> None:
    profile = load_profile(imported)
    assert profile.name == "hivig-reference"
    assert profile.render.masked_calls == "first" and profile.render.tool_call_ascii
    assert profile.frame.geometry == "llamafactory" and not profile.frame.drag_arrows
    assert profile.templates["critic_critique"].inline_images
    assert profile.templates["critic_history"].image_slots == ("before", "after")


def test_literal_dollars_and_braces_are_escaped(imported: Path) -> None:
    text = (imported / "critic_critique.txt").read_text("utf-8")
    assert text.startswith("@@ system\n")
    assert '{"grade": "good"}' in text and "costs $$5." in text
    assert "@@ user\n@@ images inline screenshot\n" in text
    history = (imported / "critic_history.txt").read_text("utf-8")
    assert "@@ user\n@@ images inline before after\n" in history


VALUES = {
    "task": "Find the caf\u00e9 for $3 {cheap}",
    "history": 'Step 1:\nAction: open\n<tool_call>\n{"a": 1}\n</tool_call>',
    "step": "<tool_call>\n{}\n</tool_call>",
    "previous_summary": "Progress: none $$ yet",
}


def test_critique_template_round_trips(imported: Path) -> None:
    critique = _module(FIXTURE, CRITIQUE_SFT)
    template = parse_template(
        "critic_critique", 1, (imported / "critic_critique.txt").read_text("utf-8")
    )
    for space, theirs in (("computer_use", "desktop"), ("mobile_use", "mobile")):
        action_space = (imported / f"action_space_{space}.txt").read_text("utf-8")
        taxonomy = (imported / "taxonomy.txt").read_text("utf-8")
        system, user = template.render(
            action_space=action_space,
            taxonomy=taxonomy,
            task=VALUES["task"],
            history=VALUES["history"],
            step=VALUES["step"],
            screenshot=ImageRef("now.png"),
        )
        assert system.text() == critique.CRITIC_GENERATION_FORMAT.format(
            platform_action_space=critique.action_spaces[theirs],
            error_dimension_str=critique.error_dimension_str,
        )
        assert _flat(user.content) == critique.USER_PROMPT.format(
            intent=VALUES["task"],
            trajectory=VALUES["history"],
            current_proposed_step=VALUES["step"],
        )
        assert user.images() == [ImageRef("now.png")]


def test_history_template_round_trips(imported: Path) -> None:
    summary = _module(FIXTURE, SUMMARY_SFT)
    template = parse_template(
        "critic_history", 1, (imported / "critic_history.txt").read_text("utf-8")
    )
    action_space = (imported / "action_space_mobile_use.txt").read_text("utf-8")
    system, user = template.render(
        action_space=action_space,
        task=VALUES["task"],
        previous_summary=VALUES["previous_summary"],
        step=VALUES["step"],
        before=ImageRef("before.png"),
        after=ImageRef("after.png"),
    )
    assert system.text() == summary.SUMMARY_SYSTEM_PROMPT.format(
        platform_action_space=summary.action_spaces["mobile"]
    )
    assert _flat(user.content) == summary.SUMMARY_USER_PROMPT.format(
        intent=VALUES["task"],
        previous_summary=VALUES["previous_summary"],
        proposed_step=VALUES["step"],
    )
    assert user.images() == [ImageRef("before.png"), ImageRef("after.png")]


def test_the_built_in_table_refuses_the_fixture(tmp_path: Path) -> None:
    message = _refusal(FIXTURE, tmp_path / "out")
    assert REVISION in message
    for path in SOURCES:
        assert path in message


def test_only_the_changed_file_is_named(tmp_path: Path) -> None:
    known = _known(FIXTURE)
    known["fixture"][SUMMARY_SFT] = "0" * 64
    message = _refusal(FIXTURE, tmp_path / "out", known=known)
    assert SUMMARY_SFT in message
    assert [p for p in SOURCES if p in message] == [SUMMARY_SFT]


def test_the_built_in_table_names_the_supported_revision() -> None:
    assert set(KNOWN_REVISIONS) == {REVISION}
    assert set(KNOWN_REVISIONS[REVISION]) == set(SOURCES)


def test_an_empty_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    message = _refusal(tmp_path / "empty", tmp_path / "out")
    assert "not a copy of G-JWLee/HiViG" in message and REVISION in message


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    message = _refusal(tmp_path / "nowhere", tmp_path / "out", known=_known(FIXTURE))
    assert "no such folder" in message


def test_a_missing_script_is_named(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    known = _known(repo)
    (repo / PROGRESS_SUMMARY).unlink()
    message = _refusal(repo, tmp_path / "out", known=known)
    assert PROGRESS_SUMMARY in message
    assert [p for p in SOURCES if p in message] == [PROGRESS_SUMMARY]


def test_an_unknown_placeholder_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    _edit(repo, CRITIQUE_SFT, "Step to judge:\n", "Mood: {mood}\nStep to judge:\n")
    message = _refusal(repo, tmp_path / "out", known=_known(repo))
    assert "{mood}" in message and CRITIQUE_SFT in message


def test_a_missing_image_marker_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    _edit(repo, SUMMARY_SFT, "Screen after:\n<image>", "Screen after:\n(none)")
    message = _refusal(repo, tmp_path / "out", known=_known(repo))
    assert "<image>" in message and SUMMARY_SFT in message


def test_code_is_never_run(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    marker = tmp_path / "ran"
    _edit(
        repo,
        CRITIQUE_SFT,
        'USER_PROMPT = """',
        f"USER_PROMPT = open({str(marker)!r}, 'w').write('x') or \"\"\"",
    )
    message = _refusal(repo, tmp_path / "out", known=_known(repo))
    assert "USER_PROMPT" in message
    assert not marker.exists()


def test_other_marker_code_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    _edit(repo, CRITIQUE_SFT, "gap = max(5, base_dim // 70)", "gap = 5 + base_dim // 70")
    message = _refusal(repo, tmp_path / "out", known=_known(repo))
    assert "max(N, base_dim // M)" in message


@pytest.mark.skipif(
    not os.environ.get("HIVIG_REFERENCE_REPO"),
    reason="set HIVIG_REFERENCE_REPO to an unpacked copy of G-JWLee/HiViG at fd1d4a2",
)
def test_the_real_repository_imports(tmp_path: Path) -> None:
    from hivig.vision._markers import marker_geometry

    report = import_reference(os.environ["HIVIG_REFERENCE_REPO"], tmp_path / "reference")
    assert report.revision == REVISION
    table = report.settings["marker_geometry"]
    size = lambda rule, base: max(rule[0], base // rule[1])  # noqa: E731
    for size_class in ("mobile", "desktop"):
        t = table[size_class]
        for width, height in ((1920, 1080), (1080, 2400), (1440, 3120), (640, 480), (300, 200)):
            base = min(width, height)
            got = marker_geometry(width, height, size_class)
            gap = size(t["gap"], base)
            want = (gap, gap + size(t["arm"], base), size(t["width"], base), size(t["head"], base))
            assert (got.gap, got.outer, got.width, got.head) == want


def test_an_unstripped_prompt_fails_the_round_trip(tmp_path: Path) -> None:
    # The template file format drops a section's leading newline; their text would keep it.
    repo = _copy(tmp_path)
    _edit(
        repo,
        CRITIQUE_SFT,
        'Step to judge:\n{current_proposed_step}\n""".strip()',
        ('Step to judge:\n{current_proposed_step}\n"""'),
    )
    message = _refusal(repo, tmp_path / "out", known=_known(repo))
    assert "byte for byte" in message


def test_a_placeholder_glued_to_a_word_is_braced(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    _edit(repo, CRITIQUE_SFT, "Goal:\n{intent}\n", "Goal:\n{intent}_now and {intent}s\n")
    import_reference(repo, tmp_path / "out", known=_known(repo))
    text = (tmp_path / "out" / "critic_critique.txt").read_text("utf-8")
    assert "Goal:\n${task}_now and ${task}s\n" in text
