"""The synthetic ScaleCUA-format corpus: layout, determinism, coverage, coherent screens."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from PIL import Image, ImageChops

from data_gen.__main__ import main
from data_gen.sample_corpus import SampleConfig, make_sample

SMALL = {"desktop_size": (640, 360), "web_size": (640, 400), "phone_size": (270, 600)}


def digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample")
    # 70: fourteen episodes per platform reach every scenario of the four-scenario rotations
    # (web, android) at least three times, so the shop's rarer branches occur (a product in a
    # long list, scrolled to; one in a short list; a failed search).
    return make_sample(root, SampleConfig(trajectories=70, seed=5, **SMALL), progress=False)


def records(root: Path):
    meta = json.loads((root / "meta.json").read_text())
    for key, entry in meta.items():
        for n, line in enumerate((root / entry["annotation"]).read_text().splitlines(), 1):
            yield key, entry, n, json.loads(line)


def test_same_seed_is_byte_identical_and_seeds_differ(tmp_path):
    cfg = SampleConfig(trajectories=6, seed=11, **SMALL)
    make_sample(tmp_path / "a", cfg, progress=False)
    make_sample(tmp_path / "b", cfg, progress=False)
    make_sample(tmp_path / "c", SampleConfig(trajectories=6, seed=12, **SMALL), progress=False)
    a, b, c = (digest(tmp_path / x) for x in "abc")
    assert a == b
    assert a != c  # negative control: the seed matters


def test_published_layout(corpus):
    root = corpus.root
    meta = json.loads((root / "meta.json").read_text())
    assert meta and all(
        set(e) >= {"root", "annotation", "conv_style", "repeat_time", "task"} for e in meta.values()
    )
    for key, entry in meta.items():
        assert re.fullmatch(
            r"data/data_\d{8}/(windows|mac|ubuntu|web|android)/images", entry["root"]
        )
        assert re.fullmatch(
            r"annotations/data_\d{8}_\w+_\d{8}(_boost_instruction)?\.jsonl", entry["annotation"]
        )
        assert entry["root"].split("/")[2] in key
    seen = 0
    for key, entry, _, rec in records(root):
        seen += 1
        assert list(rec) == ["image", "conversations", "width", "height"]
        human, gpt = rec["conversations"]
        assert (human["from"], gpt["from"]) == ("human", "gpt")
        assert human["value"].startswith("<image>\nPlease generate the next move")
        assert "\n\nTask: " in human["value"] and "\n\nPrevious operations:\n" in human["value"]
        assert ("<think>" in gpt["value"]) == ("planning" in key)
        assert re.search(
            r"<operation>\n.+\n</operation>\n<action>\n.+\n</action>$", gpt["value"], re.S
        )
        assert "/images/" in rec["image"]
        with Image.open(root / entry["root"] / rec["image"]) as im:
            assert im.format == "PNG" and im.size == (rec["width"], rec["height"])
    assert seen == corpus.lines


def test_coverage_of_actions_outcomes_and_variants(corpus):
    calls = "\n".join(a for ep in corpus.episodes for a in ep.raw_actions)
    for pattern in (
        r"^click\(x=0\.\d+, y=0\.\d+\)$",
        r"^doubleClick\(",
        r"^moveTo\(.*\n^dragTo\(",
        r"^scroll\(clicks=-\d+, x=",
        r"^swipe\(direction='up', amount=0\.5\)$",
        r"^swipe\(from_coord=\[",
        r"^write\(message='",
        r"^press\(keys='enter'\)$",
        r"^hotkey\('(ctrl|command)', 'c'\)$",
        r"^open_app\(app_name=",
        r"^response\(answer=",
        r"^terminate\(status='(failure|fail)'",
        r"^wait\(seconds=\d+\)$",
        r"^long_press\(x=0\.\d+, y=0\.\d+, duration=1\)$",
        r"^rightClick\(x=0\.\d+, y=0\.\d+\)$",
    ):
        assert re.search(pattern, calls, re.M), pattern
    assert {ep.platform for ep in corpus.episodes} == {"windows", "mac", "ubuntu", "web", "android"}
    assert any("\n" in a for ep in corpus.episodes for a in ep.raw_actions)  # multi-call steps
    assert all(ep.raw_actions[-1].startswith("terminate(") for ep in corpus.episodes)
    outcomes = {ep.outcome for ep in corpus.episodes}
    assert outcomes == {"success", "failure"}
    assert any(len(ep.instructions) > 1 for ep in corpus.episodes)
    assert corpus.trajectories == sum(len(ep.instructions) for ep in corpus.episodes)


def test_the_shop_finds_long_and_short_lists(corpus):
    # A long list is scrolled before the product is opened; a short one shows it at once and
    # leaves the rows a longer list would fill blank (where a layout-habit ghost can point).
    found = [
        ep.raw_actions
        for ep in corpus.episodes
        if ep.platform == "web" and any(a.startswith("response(answer='$") for a in ep.raw_actions)
    ]
    scrolled = [a for a in found if any(x.startswith("swipe(direction='up'") for x in a)]
    assert scrolled and len(scrolled) < len(found)
    for actions in found:
        opened = actions.index(next(a for a in actions if a.startswith("response("))) - 1
        assert actions[opened].startswith("click(")


def test_boost_files_interleave_variants_step_major(corpus):
    boost = [ep for ep in corpus.episodes if ep.annotation.endswith("_boost_instruction.jsonl")]
    ep = boost[0]
    lines = [
        json.loads(x)
        for x in (corpus.root / ep.annotation).read_text().splitlines()
        if ep.source_folder + "/" in x
    ]
    k = len(ep.instructions)
    assert len(lines) == k * len(ep.screenshots)
    for i, rec in enumerate(lines):
        assert ep.instructions[i % k] in rec["conversations"][0]["value"]
        assert ep.screenshots[i // k].endswith(rec["image"])


def test_next_screenshot_shows_an_effect(corpus):
    for ep in corpus.episodes[:15]:
        shots = [Image.open(corpus.root / p).convert("RGB") for p in ep.screenshots]
        for before, after in zip(shots, shots[1:], strict=False):
            box = ImageChops.difference(before, after).getbbox()
            assert box is not None
    # Negative control: the comparison does see identical screens as identical.
    assert ImageChops.difference(shots[0], shots[0].copy()).getbbox() is None


def test_sidecar_has_boxes_for_every_screenshot(corpus):
    lines = [json.loads(x) for x in (corpus.root / "elements.jsonl").read_text().splitlines()]
    shots = {p for ep in corpus.episodes for p in ep.screenshots}
    assert {ln["screenshot"] for ln in lines} == shots
    for ln in lines:
        labels = {e["label"] for e in ln["elements"]}
        for e in ln["elements"]:
            x1, y1, x2, y2 = e["box"]
            assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000, e
        assert all(t is None or t in labels for t in ln["targets"])


def test_config_validation():
    with pytest.raises(ValueError, match="platforms"):
        SampleConfig(platforms=("beos",))
    with pytest.raises(ValueError, match="trajectories"):
        SampleConfig(trajectories=-1)


def test_cli_make_sample(tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["make-sample", "--out", str(out), "--trajectories", "3", "--seed", "2", "--quiet"]
    argv += ["--desktop-size", "640x360", "--web-size", "640x400", "--phone-size", "270x600"]
    argv += ["--platforms", "web", "android"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "make-sample summary" in text and re.search(r"episodes +3\n", text)
    meta = json.loads((out / "meta.json").read_text())
    assert {e["root"].split("/")[2] for e in meta.values()} <= {"web", "android"}
    with pytest.raises(SystemExit):
        main(["make-sample", "--out", str(out), "--desktop-size", "huge"])


def test_rerun_replaces_a_generated_corpus_and_refuses_foreign_folders(tmp_path):
    out = tmp_path / "c"
    make_sample(out, SampleConfig(trajectories=6, seed=1, **SMALL), progress=False)
    big = digest(out)
    make_sample(out, SampleConfig(trajectories=2, seed=1, **SMALL), progress=False)
    make_sample(tmp_path / "fresh", SampleConfig(trajectories=2, seed=1, **SMALL), progress=False)
    # No stale screenshot or annotation of the larger corpus survives the rerun.
    assert digest(out) == digest(tmp_path / "fresh") and len(digest(out)) < len(big)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="neither empty nor a corpus"):
        make_sample(out, SampleConfig(trajectories=2, seed=1, **SMALL), progress=False)
    assert (out / "notes.txt").read_text() == "mine" and (out / "meta.json").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "meta.json").write_text("{}")  # a real corpus's meta.json, no sidecar: not ours
    with pytest.raises(ValueError):
        make_sample(other, SampleConfig(trajectories=1, **SMALL), progress=False)
    assert (other / "meta.json").read_text() == "{}"


def test_cross_file_copies_share_folder_and_task(tmp_path):
    cfg = SampleConfig(trajectories=20, seed=4, copies=1.0, **SMALL)
    corpus = make_sample(tmp_path / "c", cfg, progress=False)
    plain = [ep for ep in corpus.episodes if not ep.annotation.endswith("_instruction.jsonl")]
    assert plain and all(ep.copy_annotation for ep in plain)
    assert corpus.copies == len(plain)
    for ep in plain:
        assert ("_planning_" in ep.annotation) != ("_planning_" in ep.copy_annotation)
        copy = (corpus.root / ep.copy_annotation).read_text()
        assert copy.count(f"{ep.source_folder}/images/") == len(ep.screenshots)
        assert f"Task: {ep.instructions[0]}" in copy
    none = make_sample(
        tmp_path / "n", SampleConfig(trajectories=20, seed=4, copies=0.0, **SMALL), False
    )
    assert none.copies == 0 and all(ep.copy_annotation is None for ep in none.episodes)


def test_desktop_platforms_differ_in_chrome_and_theme():
    from data_gen.sample_corpus.screens import desktop

    shots = {p: desktop(p, 640, 360, "10:00", "Notes")[0] for p in ("windows", "mac", "ubuntu")}
    pixels = {p: s.image.getpixel((5, 5)) for p, s in shots.items()}
    assert (
        len(set(pixels.values())) == 3
    )  # top-left corner: taskbar-less desktop, menu bar, top bar
    chrome = {p: {e.role for e in s.elements} for p, s in shots.items()}
    assert "taskbar" in chrome["windows"] and "dock" in chrome["mac"] and "dock" in chrome["ubuntu"]
    assert "taskbar" not in chrome["mac"] | chrome["ubuntu"]
    labels = {p: {e.label for e in s.elements} for p, s in shots.items()}
    assert "Close" in labels["windows"] and "Close" not in labels["mac"]  # traffic lights on mac


WAITING = {
    "web_report",
    "web_search",
    "web_ticket",
    "open_file",
    "drag_file",
    "export_pdf",
    "find_contact",
    "install_app",
}


def test_wait_steps_show_a_busy_screen_then_content(corpus):
    sidecar = {
        (ln := json.loads(x))["screenshot"]: ln
        for x in (corpus.root / "elements.jsonl").read_text().splitlines()
    }

    def busy(shot: str) -> set[str]:
        return {e["label"] for e in sidecar[shot]["elements"] if e["role"] == "progress"}

    waited, acted_after = set(), set()
    for ep in corpus.episodes:
        for k, action in enumerate(ep.raw_actions):
            if not action.startswith("wait("):
                continue
            waited.add(ep.scenario)
            before, after = ep.screenshots[k], ep.screenshots[k + 1]
            assert busy(before), (ep.scenario, action)  # spinner or progress bar on screen
            assert not busy(after), ep.scenario  # the next screen has finished loading
            labels = {e["label"] for e in sidecar[after]["elements"]}
            assert labels != {e["label"] for e in sidecar[before]["elements"]}
            if ep.scenario == "web_report":
                assert any(label.startswith("Total:") for label in labels)
            if not ep.raw_actions[k + 1].startswith("terminate("):
                acted_after.add(ep.platform)
        # Negative control: screens of steps that do not wait show nothing busy.
        idle = [s for s, a in zip(ep.screenshots, ep.raw_actions, strict=True) if "wait(" not in a]
        assert not any(busy(s) for s in idle), ep.scenario
    assert waited == WAITING
    # Timing samples need an action right after the wait, on every platform.
    assert acted_after == {"windows", "mac", "ubuntu", "web", "android"}


def test_long_press_and_right_click_open_their_menus(corpus):
    sidecar = {
        (ln := json.loads(x))["screenshot"]: ln
        for x in (corpus.root / "elements.jsonl").read_text().splitlines()
    }
    seen = set()
    for ep in corpus.episodes:
        for k, action in enumerate(ep.raw_actions[:-1]):
            name = action.split("(")[0]
            if name not in ("long_press", "rightClick"):
                continue
            after = sidecar[ep.screenshots[k + 1]]["elements"]
            roles = {e["role"] for e in after}
            assert ("menuitem" in roles) if name == "rightClick" else ("1 selected" not in roles)
            assert any(e["label"] in ("Delete", "Move to Trash") for e in after)
            seen.add(name)
    assert seen == {"long_press", "rightClick"}


def test_focus_click_then_typing_on_every_platform(corpus):
    # Procedural Prerequisite Neglect needs a click on a text field whose typing is the next,
    # separate step (skipping the click is the error); every platform has one.
    sidecar = {
        (ln := json.loads(x))["screenshot"]: ln
        for x in (corpus.root / "elements.jsonl").read_text().splitlines()
    }
    seen = set()
    for ep in corpus.episodes:
        for k, action in enumerate(ep.raw_actions[:-1]):
            nxt = ep.raw_actions[k + 1]
            if action.startswith("click(") and nxt.startswith("write(") and "click(" not in nxt:
                target = sidecar[ep.screenshots[k]]["targets"][0]
                roles = {
                    e["role"]
                    for e in sidecar[ep.screenshots[k]]["elements"]
                    if e["label"] == target
                }
                assert roles == {"textbox"}, (ep.scenario, target)
                seen.add(ep.platform)
    assert seen == {"windows", "mac", "ubuntu", "web", "android"}
