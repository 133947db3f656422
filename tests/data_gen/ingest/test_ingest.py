"""Ingest of hand-written ScaleCUA records: the format's worked examples and their variants."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from PIL import Image

from data_gen.__main__ import main
from data_gen.ingest import (
    IngestConfig,
    IngestError,
    classify_entry,
    ingest,
    parse_prompt,
    scroll_direction,
    sniff_image,
)
from hivig.trajectory import Trajectory

HEAD = "Please generate the next move according to the UI screenshot, task and previous operations."
EVAL_HEAD = (
    "Please generate the next move according to the UI screenshot, the task and previous "
    "operations."
)

# Example A of the ScaleCUA format, verbatim (third step of an Android planning_cot trajectory).
EXAMPLE_A = {
    "image": "clock/clock_12/images/003_1749801122310.png",
    "conversations": [
        {
            "from": "human",
            "value": "<image>\nPlease generate the next move according to the UI screenshot, task "
            "and previous operations.\n\nTask: Set an alarm for 7:30 AM labelled Gym.\n\nPrevious "
            'operations:\nStep 1: "Open the Clock app."\nStep 2: "Tap the Alarm tab at the bottom '
            'of the screen."',
        },
        {
            "from": "gpt",
            "value": "<think>\nThe Alarm tab is open and lists two existing alarms. A floating '+' "
            "button at the bottom centre adds a new alarm.\n</think>\n<operation>\nTap the '+' "
            "button at the bottom centre to create a new alarm\n</operation>\n<action>\nclick(x=0."
            "5012, y=0.8735)\n</action>",
        },
    ],
    "width": 1080,
    "height": 2400,
}

# Example B, verbatim (second step of a Windows navigation trajectory).
EXAMPLE_B = {
    "image": "excel/free_task_20250702_143015/images/20250702_143031_4.png",
    "conversations": [
        {
            "from": "human",
            "value": "<image>\nPlease generate the next move according to the UI screenshot, task "
            "and previous operations.\n\nTask: Rename the sheet 'Sheet1' to 'Budget'.\n\nPrevious "
            "operations:\nStep 1: Double-click the 'Sheet1' tab at the bottom left to edit its "
            "name",
        },
        {
            "from": "gpt",
            "value": "<operation>\nType the new name Budget and confirm with Enter\n</operation>\n"
            "<action>\nwrite(message='Budget')\npress(keys='enter')\n</action>",
        },
    ],
    "width": 1920,
    "height": 1080,
}


def record(image, task, history, op, action, size=(64, 48), think=None, head=HEAD, quote=False):
    """A step record in the published layout."""
    prev = "None"
    if history:
        fmt = '"{}"' if quote else "{}"
        prev = "\n".join(f"Step {i}: {fmt.format(h)}" for i, h in enumerate(history, 1))
    human = f"<image>\n{head}\n\nTask: {task}\n\nPrevious operations:\n{prev}"
    gpt = f"<think>\n{think}\n</think>\n" if think else ""
    gpt += f"<operation>\n{op}\n</operation>\n<action>\n{action}\n</action>"
    return {
        "image": image,
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
        "width": size[0],
        "height": size[1],
    }


def episode(folder, task, steps, size=(64, 48), **kw):
    """Records of one trajectory: ``steps`` is a list of (operation, action) pairs."""
    out, ops = [], []
    for k, (op, action) in enumerate(steps):
        out.append(record(f"{folder}/images/{k}.png", task, list(ops), op, action, size, **kw))
        ops.append(op)
    return out


def write_corpus(root: Path, files: dict, *, make_images: bool = True) -> None:
    """``files``: meta key -> (platform, family, lines); lines are dicts or raw strings."""
    meta = {}
    for key, (platform, family, lines) in files.items():
        anno = f"annotations/{key}.jsonl"
        img_root = f"data/data_20250612/{platform}/images"
        meta[key] = {
            "root": img_root,
            "annotation": anno,
            "conv_style": f"internvl2_5_{platform}_{family}_v1",
            "repeat_time": 1,
            "task": f"{platform}_{family}",
        }
        (root / anno).parent.mkdir(parents=True, exist_ok=True)
        texts = [ln if isinstance(ln, str) else json.dumps(ln) for ln in lines]
        (root / anno).write_text("\n".join(texts) + "\n", encoding="utf-8")
        if not make_images:
            continue
        for ln in lines:
            if isinstance(ln, dict) and isinstance(ln.get("image"), str):
                path = root / img_root / ln["image"]
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    Image.new("RGB", (ln["width"], ln["height"]), "white").save(path)
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


def run(tmp_path: Path, files: dict, **cfg):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, files)
    res = ingest(corpus, tmp_path / "out", IngestConfig(**cfg), progress=False)
    out = res.out_dir
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    quarantine = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["lines"] == stats["steps_kept"] + sum(stats["dropped"].values())
    for t in trajs:  # every output line is a valid hivig trajectory
        assert Trajectory.from_json(t).to_json() == t
    return trajs, quarantine, stats, res.report


# ------------------------------------------------------------------------ worked examples


def test_example_a_android_planning_step(tmp_path):
    task = "Set an alarm for 7:30 AM labelled Gym."
    folder = "clock/clock_12"
    first = [
        record(f"{folder}/images/001.png", task, [], "Open the Clock app.", "click(x=0.1, y=0.2)"),
        record(
            f"{folder}/images/002.png",
            task,
            ["Open the Clock app."],
            "Tap the Alarm tab at the bottom of the screen.",
            "click(x=0.3, y=0.95)",
            quote=True,
        ),
    ]
    for r in first:
        r["width"], r["height"] = 1080, 2400
    trajs, quarantine, stats, _ = run(
        tmp_path,
        {
            "internal_android_planning_cot_20250630": (
                "android",
                "planning_cot",
                [*first, EXAMPLE_A],
            )
        },
    )
    assert quarantine == []
    assert stats == {"lines": 3, "steps_kept": 3, "trajectories": 1, "dropped": {}}
    (t,) = trajs
    assert t["platform"] == "android" and t["task"] == task
    assert t["screen"] == {"width": 1080, "height": 2400}
    assert t["outcome"] == "unknown"  # no terminate
    step = t["steps"][2]
    assert step["index"] == 2
    assert step["screenshot"] == "data/data_20250612/android/images/" + EXAMPLE_A["image"]
    assert step["think"].startswith("The Alarm tab is open")
    assert step["intent"] == "Tap the '+' button at the bottom centre to create a new alarm"
    assert step["actions"] == [{"action": "click", "coordinate": [501, 874]}]
    assert step["raw_action"] == "click(x=0.5012, y=0.8735)"


def test_example_b_windows_multi_call_then_terminate(tmp_path):
    task = "Rename the sheet 'Sheet1' to 'Budget'."
    folder = "excel/free_task_20250702_143015"
    op0 = "Double-click the 'Sheet1' tab at the bottom left to edit its name"
    op1 = "Type the new name Budget and confirm with Enter"
    lines = [
        record(
            f"{folder}/images/20250702_143029_3.png", task, [], op0, "doubleClick(x=0.05, y=0.97)"
        ),
        EXAMPLE_B,
        record(
            f"{folder}/images/20250702_143035_5.png",
            task,
            [op0, op1],
            "The sheet is renamed",
            "terminate(status='success', info=None)",
        ),
    ]
    for r in lines:
        r["width"], r["height"] = 1920, 1080
    trajs, quarantine, _, _ = run(
        tmp_path, {"internal_windows_navigation_20250702": ("windows", "navigation", lines)}
    )
    assert quarantine == []
    (t,) = trajs
    assert [s["index"] for s in t["steps"]] == [0, 1, 2]
    assert t["steps"][0]["actions"] == [{"action": "double_click", "coordinate": [50, 970]}]
    assert t["steps"][1]["think"] is None
    assert t["steps"][1]["actions"] == [
        {"action": "type", "text": "Budget"},
        {"action": "key", "keys": ["enter"]},
    ]
    assert t["steps"][2]["actions"] == [{"action": "terminate", "status": "success"}]
    assert t["outcome"] == "success"


# ------------------------------------------------------------------------ variants


def test_eval_wording_quotes_and_action_variants(tmp_path):
    desk = episode(
        "app/free_task_1",
        "Copy the text",
        [
            ("Select all", "hotkey('ctrl', 'a')"),
            ("Copy", "hotkey('ctrl','c')"),
            ("Give up", "terminate(status='fail', info=None)"),
        ],
        head=EVAL_HEAD,
        quote=True,
    )
    # Evaluation wording puts the instruction on the line after ``Task:``.
    for r in desk:
        r["conversations"][0]["value"] = r["conversations"][0]["value"].replace("Task: ", "Task:\n")
    web = episode(
        "shop/task_1",
        "Scroll the page",
        [
            ("Scroll down", "swipe(direction='up')"),
            ("Pick", "select_option(x=0.5, y=0.5, value='a')"),
        ],
    )
    phone = episode(
        "contacts/c_1",
        "Scroll contacts",
        [
            ("Swipe up", "swipe(from_coord=[0.5, 0.8], to_coord=[0.5, 0.3])"),
            ("Enter", "press(keys='enter')"),
        ],
    )
    trajs, quarantine, _, report = run(
        tmp_path,
        {
            "internal_windows_navigation_1": ("windows", "navigation", desk),
            "internal_web_navigation_1": ("web", "navigation", web),
            "internal_android_navigation_1": ("android", "navigation", phone),
        },
    )
    by_task = {t["task"]: t for t in trajs}
    d = by_task["Copy the text"]
    assert [s["actions"] for s in d["steps"]] == [
        [{"action": "key", "keys": ["ctrl", "a"]}],
        [{"action": "key", "keys": ["ctrl", "c"]}],
        [{"action": "terminate", "status": "failure"}],
    ]
    assert d["outcome"] == "failure"
    flags = report["files"]["annotations/internal_windows_navigation_1.jsonl"]["flags"]
    assert flags["positional:hotkey"] == 2 and flags["status_fail"] == 1
    assert by_task["Scroll the page"]["steps"][0]["actions"] == [
        {"action": "scroll", "pixels": -500}
    ]
    p = by_task["Scroll contacts"]
    assert [s["actions"] for s in p["steps"]] == [
        [{"action": "swipe", "coordinate": [500, 800], "coordinate2": [500, 300]}],
        [{"action": "system_button", "button": "Enter"}],
    ]
    # select_option has no Qwen3-VL equivalent: that step is quarantined, the prefix is kept.
    assert len(by_task["Scroll the page"]["steps"]) == 1
    assert [(q["file"], q["line"], q["reason"]) for q in quarantine] == [
        ("annotations/internal_web_navigation_1.jsonl", 2, "bad_action")
    ]


def test_parse_prompt_structural():
    assert parse_prompt(
        f"<image>\n{EVAL_HEAD}\n\nTask:\nDo   it\nnow\n\nPrevious operations:\nNone"
    ) == (
        "Do it now",
        [],
    )
    text = 'x\nTask: T\nPrevious operations:\nStep 1: "a\ncontinued"\nStep 2: b'
    # History lines keep their quotes here; the consistency check strips the surrounding ones.
    assert parse_prompt(text) == ("T", ['"a continued"', "b"])
    assert parse_prompt("no task here")[0] == "missing_task"
    assert parse_prompt("Task: T\nPrevious operations:\nStep 2: b")[0] == "bad_history"


def test_boost_instruction_variants_share_episode_key(tmp_path):
    steps = [
        ("Open the menu", "click(x=0.1, y=0.1)"),
        ("Done", "terminate(status='success', info=None)"),
    ]
    a = episode("settings/f_1", "Variant one", steps)
    b = episode("settings/f_1", "Variant two", steps)
    lines = [a[0], b[0], a[1], b[1]]  # step-major interleaving
    trajs, quarantine, stats, _ = run(
        tmp_path,
        {"internal_windows_planning_cot_boost_instruction_1": ("windows", "planning_cot", lines)},
    )
    assert quarantine == [] and stats["trajectories"] == 2
    assert {t["task"] for t in trajs} == {"Variant one", "Variant two"}
    assert len({t["episode_key"] for t in trajs}) == 1
    assert len({t["id"] for t in trajs}) == 2
    assert all(len(t["steps"]) == 2 for t in trajs)


def test_bad_step_keeps_prefix_and_quarantines_the_rest(tmp_path):
    lines = episode(
        "f/t1",
        "Task one",
        [
            ("a", "click(x=0.1, y=0.1)"),
            ("b", "click(x=0.2, y=0.2)"),
            ("c", "click(x=0.3,"),
            ("d", "click(x=0.4, y=0.4)"),
        ],
    )
    lines.insert(2, json.dumps(lines[1]))  # an exact duplicate of line 2
    trajs, quarantine, stats, _ = run(
        tmp_path, {"internal_ubuntu_navigation_1": ("ubuntu", "navigation", lines)}
    )
    assert len(trajs) == 1 and len(trajs[0]["steps"]) == 2
    assert [(q["line"], q["reason"]) for q in quarantine] == [
        (3, "duplicate"),
        (4, "bad_action"),
        (5, "after_bad_step"),
    ]
    assert stats["dropped"] == {"after_bad_step": 1, "bad_action": 1, "duplicate": 1}
    assert all(q["file"] == "annotations/internal_ubuntu_navigation_1.jsonl" for q in quarantine)


def test_gap_mismatch_orphan_and_bad_lines(tmp_path):
    ok = episode(
        "f/a",
        "A",
        [
            ("a0", "click(x=0.1, y=0.1)"),
            ("a1", "click(x=0.1, y=0.1)"),
            ("a2", "click(x=0.1, y=0.1)"),
        ],
    )
    gap = [ok[0], ok[2]]  # step 1 missing
    mism = episode("f/b", "B", [("b0", "click(x=0.1, y=0.1)"), ("b1", "click(x=0.1, y=0.1)")])
    mism[1]["conversations"][0]["value"] = mism[1]["conversations"][0]["value"].replace(
        "Step 1: b0", "Step 1: zz"
    )
    orphan = episode("f/c", "C", [("c0", "click(x=0.1, y=0.1)"), ("c1", "click(x=0.1, y=0.1)")])[1:]
    no_task = record("f/d/images/0.png", "D", [], "d0", "click(x=0.1, y=0.1)")
    no_task["conversations"][0]["value"] = "<image>\nhello"
    no_op = record("f/e/images/0.png", "E", [], "e0", "click(x=0.1, y=0.1)")
    no_op["conversations"][1]["value"] = "<action>\nclick(x=0.1, y=0.1)\n</action>"
    lines = [*gap, *mism, *orphan, no_task, no_op, "{not json", "", '{"image": 3}']
    trajs, quarantine, stats, _ = run(
        tmp_path, {"internal_mac_navigation_1": ("mac", "navigation", lines)}
    )
    reasons = {(q["line"], q["reason"]) for q in quarantine}
    assert reasons == {
        (2, "history_gap"),
        (4, "history_mismatch"),
        (5, "no_trajectory_start"),
        (6, "missing_task"),
        (7, "missing_operation"),
        (8, "bad_json"),
        (9, "empty_line"),
        (10, "bad_record"),
    }
    assert sorted(len(t["steps"]) for t in trajs) == [1, 1]
    assert stats["lines"] == 10 and stats["steps_kept"] == 2


def test_scales_per_file(tmp_path):
    grid = episode(
        "g/1",
        "G",
        [
            ("a", "click(x=500, y=250)"),
            ("b", "click(x=1, y=0)"),
            ("c", "click(x=0.42, y=0.5)"),
            ("d", "click(x=1, y=1)"),
        ],
    )
    grid_b = episode("g/2", "H", [("a", "click(x=1500, y=10)")])
    # Two more grid records make grid the clear majority of the file's tally.
    grid_c = episode("g/3", "I", [("a", "click(x=300, y=600)"), ("b", "click(x=20, y=40)")])
    unit = episode("u/1", "U", [("a", "click(x=0.25, y=0.75)")])
    unit_b = episode("u/2", "V", [("a", "click(x=734, y=0.5)")])
    trajs, quarantine, _, report = run(
        tmp_path,
        {
            "internal_windows_navigation_grid": (
                "windows",
                "navigation",
                [*grid, *grid_b, *grid_c],
            ),
            "internal_windows_navigation_unit": ("windows", "navigation", [*unit, *unit_b]),
        },
    )
    by_task = {t["task"]: t for t in trajs}
    # The all-0/1 record in a grid file is grid (not unit): (1, 0) -> (1, 0), not (1000, 0).
    assert [s["actions"][0]["coordinate"] for s in by_task["G"]["steps"]] == [[500, 250], [1, 0]]
    assert by_task["U"]["steps"][0]["actions"][0]["coordinate"] == [250, 750]
    assert {(q["file"].split("_")[-1], q["line"], q["reason"]) for q in quarantine} == {
        ("grid.jsonl", 3, "ambiguous_scale"),
        ("grid.jsonl", 4, "after_bad_step"),
        ("grid.jsonl", 5, "ambiguous_scale"),
        ("unit.jsonl", 2, "ambiguous_scale"),
    }
    files = report["files"]
    assert files["annotations/internal_windows_navigation_grid.jsonl"]["scale"] == "grid"
    assert files["annotations/internal_windows_navigation_unit.jsonl"]["scale"] == "unit"
    assert files["annotations/internal_windows_navigation_grid.jsonl"]["scale_conflicts"] == 2


@pytest.mark.parametrize(
    ("words", "decision", "pixels"), [("down", "inverted", -300), ("up", "pyautogui", 300)]
)
def test_scroll_sign_is_decided_from_operation_text(tmp_path, words, decision, pixels):
    lines = []
    for i in range(6):
        lines += episode(
            f"s/{i}", f"T{i}", [(f"Scroll {words} the list", "scroll(clicks=3, x=0.5, y=0.5)")]
        )
    trajs, _, _, report = run(
        tmp_path, {"internal_ubuntu_navigation_s": ("ubuntu", "navigation", lines)}
    )
    assert report["scroll_sign"]["ubuntu/navigation"]["decision"] == decision
    assert trajs[0]["steps"][0]["actions"] == [
        {"action": "mouse_move", "coordinate": [500, 500]},
        {"action": "scroll", "pixels": pixels},
    ]


def test_scroll_sign_needs_enough_evidence(tmp_path):
    lines = []
    for i in range(3):
        lines += episode(
            f"s/{i}", f"T{i}", [("Scroll down the list", "scroll(clicks=3, x=0.5, y=0.5)")]
        )
    trajs, _, _, report = run(
        tmp_path, {"internal_ubuntu_navigation_s": ("ubuntu", "navigation", lines)}
    )
    assert report["scroll_sign"]["ubuntu/navigation"]["decision"] == "too_few"
    assert trajs[0]["steps"][0]["actions"][1] == {"action": "scroll", "pixels": 300}


def test_scroll_direction_words():
    assert scroll_direction("Scroll down the file list") == "down"
    assert scroll_direction("scrolling further up to see the header") == "up"
    assert scroll_direction("Scroll up, then scroll down") is None
    assert scroll_direction("Click the button") is None


def test_missing_and_truncated_images(tmp_path):
    lines = episode("f/x", "X", [("a", "click(x=0.1, y=0.1)")]) + episode(
        "f/y", "Y", [("a", "click(x=0.1, y=0.1)")]
    )
    corpus = tmp_path / "corpus"
    write_corpus(corpus, {"internal_web_navigation_1": ("web", "navigation", lines)})
    img = corpus / "data/data_20250612/web/images"
    (img / "f/x/images/0.png").unlink()
    data = (img / "f/y/images/0.png").read_bytes()
    (img / "f/y/images/0.png").write_bytes(data[: len(data) // 2])
    res = ingest(corpus, tmp_path / "out", progress=False)
    assert res.stats["dropped"] == {"corrupt_image": 1, "missing_image": 1}
    assert res.stats["trajectories"] == 0


def test_sniff_image_formats(tmp_path):
    png, jpg = tmp_path / "a.png", tmp_path / "b.jpg"
    Image.new("RGB", (37, 21), "red").save(png)
    Image.new("RGB", (40, 30), "blue").save(jpg, quality=80)
    assert sniff_image(png, "header") == (37, 21)
    assert sniff_image(jpg, "header") == (40, 30)
    assert sniff_image(jpg, "full") == (40, 30)
    (tmp_path / "c.png").write_bytes(b"GIF89a" + b"\0" * 40)
    assert sniff_image(tmp_path / "c.png", "header")[0] == "corrupt_image"
    assert sniff_image(tmp_path / "nope.png", "header")[0] == "missing_image"
    # A PNG whose data chunk is damaged but whose header and end marker are intact passes the
    # header check and fails the full decode.
    raw = bytearray(png.read_bytes())
    raw[40:60] = b"\0" * 20
    (tmp_path / "d.png").write_bytes(bytes(raw))
    assert sniff_image(tmp_path / "d.png", "header") == (37, 21)
    assert sniff_image(tmp_path / "d.png", "full")[0] == "corrupt_image"


def test_meta_entries_are_classified():
    def entry(key, task="", style=""):
        return classify_entry(
            key, {"root": "r", "annotation": "a.jsonl", "task": task, "conv_style": style}
        )

    assert entry("internal_android_planning_cot_boost_instruction_20250630").platform == "android"
    assert entry("x", "mac_navigation", "internvl2_5_macos_navigation_v1").platform == "mac"
    assert entry("ws_web_navigation_w_history_1").family == "navigation"
    assert entry("ws_web_navigation_wo_history_1") == "without_history"
    assert entry("internal_windows_planning_cot_boost_action_1") == "boost_action_unverified"
    assert entry("windows_action_grounding_1") == "not_a_trajectory_family"
    assert entry("internal_iphone_navigation_1") == "no_trajectories_for_ios"
    assert classify_entry("k", ["not", "a", "dict"]) == "entry_not_an_object"


def test_platform_filter_and_shards_partition_the_output(tmp_path):
    files = {}
    for p in ("windows", "web"):
        lines = []
        for i in range(12):
            lines += episode(
                f"{p}/e{i}",
                f"task {i}",
                [("a", "click(x=0.1, y=0.1)"), ("b", "click(x=0.2, y=0.2)")],
            )
        lines.append("garbage line")
        files[f"internal_{p}_navigation_1"] = (p, "navigation", lines)
    corpus = tmp_path / "corpus"
    write_corpus(corpus, files)
    whole = ingest(corpus, tmp_path / "all", progress=False)
    parts = [
        ingest(corpus, tmp_path / "sh", IngestConfig(shard=(i, 3)), progress=False)
        for i in range(3)
    ]
    assert sum(p.stats["lines"] for p in parts) == whole.stats["lines"] == 50
    assert sum(p.stats["trajectories"] for p in parts) == whole.stats["trajectories"] == 24
    assert all(p.stats["trajectories"] < 24 for p in parts)  # the work really is divided
    merged = sorted(
        ln for p in parts for ln in (p.out_dir / "trajectories.jsonl").read_text().splitlines()
    )
    assert merged == sorted((whole.out_dir / "trajectories.jsonl").read_text().splitlines())
    web = ingest(corpus, tmp_path / "web", IngestConfig(platforms=("web",)), progress=False)
    assert web.stats["lines"] == 25 and web.report["skipped_entries"] == {
        "internal_windows_navigation_1": "platform_not_selected"
    }


def test_bad_options_and_missing_meta(tmp_path):
    with pytest.raises(IngestError):
        IngestConfig(shard=(3, 3))
    with pytest.raises(IngestError):
        IngestConfig(verify_images="sometimes")
    with pytest.raises(IngestError, match="meta.json"):
        ingest(tmp_path, tmp_path / "out", progress=False)
    (tmp_path / "meta.json").write_text("[1, 2]")
    with pytest.raises(IngestError):
        ingest(tmp_path, tmp_path / "out", progress=False)


def test_output_is_deterministic(tmp_path):
    lines = []
    for i in range(5):
        lines += episode(
            f"f/{i}",
            f"t{i}",
            [("a", "click(x=0.1, y=0.1)"), ("b", "terminate(status='success', info=None)")],
        )
    corpus = tmp_path / "corpus"
    write_corpus(corpus, {"internal_windows_navigation_1": ("windows", "navigation", lines)})
    a = ingest(corpus, tmp_path / "a", progress=False).out_dir
    b = ingest(corpus, tmp_path / "b", progress=False).out_dir
    for name in ("trajectories.jsonl", "quarantine.jsonl", "stats.json", "report.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


# ------------------------------------------------------------------------ command line


def test_cli_ingest_summary_and_errors(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    write_corpus(
        corpus,
        {
            "internal_web_navigation_1": (
                "web",
                "navigation",
                episode("f/1", "T", [("a", "click(x=0.5, y=0.5)")]),
            )
        },
    )
    assert main(["ingest", "--root", str(corpus), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ingest summary" in out and "steps kept" in out
    assert (
        main(["ingest", "--root", str(tmp_path / "none"), "--out", str(tmp_path / "o2"), "--quiet"])
        == 2
    )
    assert "no meta.json" in capsys.readouterr().err


def test_cli_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for cmd in ("ingest", "split", "make-sample", "run"):
        assert cmd in text
    with pytest.raises(SystemExit):
        main(["ingest", "--root", "x", "--out", "y", "--shard", "5/2"])


def test_cli_run_is_handed_its_arguments_untouched(monkeypatch):
    seen = []
    fake = types.ModuleType("data_gen.run")
    fake.main = lambda argv: seen.append(list(argv)) or 7
    monkeypatch.setitem(sys.modules, "data_gen.run", fake)
    assert main(["run", "--config", "c.yaml", "a.b=1", "--dry-run"]) == 7
    assert seen == [["--config", "c.yaml", "a.b=1", "--dry-run"]]


def test_call_user_step_is_quarantined_not_crashing(tmp_path):
    steps = [("Click the box", "click(x=0.5, y=0.5)"), ("Ask the user", "call_user()")]
    lines = episode("app/t1", "Do the thing", steps)
    trajs, quarantine, stats = run(tmp_path, {"win_nav": ("windows", "navigation", lines)})[:3]
    assert [len(t["steps"]) for t in trajs] == [1]  # the good prefix is kept
    assert [q["reason"] for q in quarantine] == ["call_user"]
    assert stats["lines"] == stats["steps_kept"] + sum(stats["dropped"].values())
