"""Ingest edge cases: cross-file copies, hostile meta.json, deep JSON, encodings, truncation."""

from __future__ import annotations

import json
import re

import pytest

from data_gen.ingest import ingest, parse_line
from tests.data_gen.ingest.test_ingest import episode, record, run, write_corpus

STEPS = [
    ("Click the 'OK' button", "click(x=0.1, y=0.1)"),
    ("Done", "terminate(status='success', info=None)"),
]


def _copies(think_in_planning: bool = True, nav_steps=STEPS, plan_steps=STEPS):
    nav = episode("settings/f_1", "Change the setting", nav_steps)
    plan = episode(
        "settings/f_1",
        "Change the setting",
        plan_steps,
        think="I see the dialog." if think_in_planning else None,
        quote=True,
    )
    return {
        "internal_windows_navigation_1": ("windows", "navigation", nav),
        "internal_windows_planning_cot_1": ("windows", "planning_cot", plan),
    }


# ------------------------------------------------------------------------ cross-file copies


def test_same_episode_in_two_files_is_kept_once_with_think(tmp_path):
    trajs, quarantine, stats, report = run(tmp_path, _copies())
    assert len(trajs) == 1 and stats["trajectories"] == 1
    assert trajs[0]["source"]["file"].endswith("planning_cot_1.jsonl")
    assert all(s["think"] for s in trajs[0]["steps"])
    # The navigation copy's two lines are accounted for as duplicates, not lost.
    assert stats == {"lines": 4, "steps_kept": 2, "trajectories": 1, "dropped": {"duplicate": 2}}
    assert {(q["file"], q["line"], q["reason"]) for q in quarantine} == {
        ("annotations/internal_windows_navigation_1.jsonl", 1, "duplicate"),
        ("annotations/internal_windows_navigation_1.jsonl", 2, "duplicate"),
    }
    assert report["duplicate_copies"] == [
        {
            "id": trajs[0]["id"],
            "dropped": "annotations/internal_windows_navigation_1.jsonl",
            "kept": "annotations/internal_windows_planning_cot_1.jsonl",
        }
    ]


def test_without_think_the_longer_copy_wins(tmp_path):
    files = _copies(think_in_planning=False, nav_steps=STEPS, plan_steps=STEPS[:1])
    trajs, _, stats, _ = run(tmp_path, files)
    assert len(trajs) == 1 and len(trajs[0]["steps"]) == 2
    assert trajs[0]["source"]["file"].endswith("navigation_1.jsonl")
    assert stats["dropped"] == {"duplicate": 1}


def test_copies_share_the_episode_key_even_when_one_is_truncated(tmp_path):
    # Different tasks (so different ids, both kept), one copy a step short: the key must agree.
    nav = episode("settings/f_1", "Task A", STEPS)
    plan = episode("settings/f_1", "Task B", STEPS[:1], think="t")
    other = episode("settings/f_2", "Task A", STEPS)
    trajs, _, _, _ = run(
        tmp_path,
        {
            "internal_windows_navigation_1": ("windows", "navigation", nav + other),
            "internal_windows_planning_cot_1": ("windows", "planning_cot", plan),
        },
    )
    assert len(trajs) == 3
    folder1 = [t["episode_key"] for t in trajs if t["steps"][0]["screenshot"].count("f_1/")]
    folder2 = [t["episode_key"] for t in trajs if t["steps"][0]["screenshot"].count("f_2/")]
    assert len(set(folder1)) == 1 and len(folder1) == 2
    assert folder2[0] != folder1[0]


# ------------------------------------------------------------------------ history quoting


def test_quotes_inside_operations_do_not_cause_history_mismatch(tmp_path):
    steps = [
        ("'OK' and 'Apply' are shown;   click 'OK'", "click(x=0.1, y=0.1)"),
        ("'Done'", "click(x=0.2, y=0.2)"),
        ("Finish", "terminate(status='success', info=None)"),
    ]
    for quote in (False, True):
        lines = episode(f"f/{quote}", "Confirm", steps, quote=quote)
        trajs, quarantine, _, _ = run(
            tmp_path / str(quote), {"internal_mac_navigation_1": ("mac", "navigation", lines)}
        )
        assert quarantine == [] and len(trajs[0]["steps"]) == 3, quote


def test_a_different_history_line_is_still_a_mismatch(tmp_path):
    lines = episode("f/a", "T", STEPS, quote=True)
    human = lines[1]["conversations"][0]["value"]
    lines[1]["conversations"][0]["value"] = human.replace("'OK'", "'Cancel'")
    _, quarantine, _, _ = run(tmp_path, {"internal_mac_navigation_1": ("mac", "navigation", lines)})
    assert [q["reason"] for q in quarantine] == ["history_mismatch"]


# ------------------------------------------------------------------------ truncation


def test_truncated_trajectories_are_reported(tmp_path):
    three = [*STEPS[:1], ("Next", "click(x=0.2, y=0.2)"), STEPS[1]]
    gap = episode("f/gap", "G", three)
    del gap[1]
    bad = episode("f/bad", "B", three)
    bad[1]["conversations"][1]["value"] = (
        "<operation>\nNext\n</operation>\n<action>\nclick(\n</action>"
    )
    whole = episode("f/ok", "O", three)
    trajs, _, _, report = run(
        tmp_path, {"internal_ubuntu_navigation_1": ("ubuntu", "navigation", gap + bad + whole)}
    )
    assert len(trajs) == 3
    by_id = {t["task"]: t["id"] for t in trajs}
    truncated = report["truncated"]
    assert truncated["count"] == 2
    assert truncated["by_reason"] == {"bad_action": 1, "history_gap": 1}
    assert {(r["id"], r["reason"], r["line"]) for r in truncated["trajectories"]} == {
        (by_id["G"], "history_gap", 2),
        (by_id["B"], "bad_action", 4),
    }


# ------------------------------------------------------------------------ hostile meta.json


def _entry(root: str, annotation: str) -> dict:
    return {"root": root, "annotation": annotation, "task": "web_navigation"}


def test_entries_that_leave_the_corpus_are_skipped(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    lines = [json.dumps(r) for r in episode("e/1", "T", STEPS)]
    (outside / "a.jsonl").write_text("\n".join(lines) + "\n")
    corpus = tmp_path / "corpus"
    (corpus / "annotations").mkdir(parents=True)
    (corpus / "annotations/a.jsonl").write_text("\n".join(lines) + "\n")
    (corpus / "link").symlink_to(outside)
    meta = {
        "web_navigation_abs_root": _entry(str(outside), "annotations/a.jsonl"),
        "web_navigation_dotdot_root": _entry("../outside", "annotations/a.jsonl"),
        "web_navigation_abs_anno": _entry("r", str(outside / "a.jsonl")),
        "web_navigation_dotdot_anno": _entry("r", "annotations/../../outside/a.jsonl"),
        "web_navigation_symlink_anno": _entry("r", "link/a.jsonl"),
    }
    (corpus / "meta.json").write_text(json.dumps(meta))
    res = ingest(corpus, tmp_path / "out", progress=False)
    assert res.report["skipped_entries"] == {k: "entry_path_escapes_corpus" for k in meta}
    assert res.stats["lines"] == 0
    # Negative control: the same file under an inside root is read.
    meta = {"web_navigation_ok": _entry("r", "annotations/a.jsonl")}
    (corpus / "meta.json").write_text(json.dumps(meta))
    res = ingest(corpus, tmp_path / "out2", progress=False)
    assert res.report["skipped_entries"] == {} and res.stats["lines"] == 2


def test_root_may_be_the_corpus_itself(tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(
        corpus, {"internal_web_navigation_1": ("web", "navigation", episode("e/1", "T", STEPS))}
    )
    meta = json.loads((corpus / "meta.json").read_text())
    meta["internal_web_navigation_1"]["root"] = "./data/data_20250612/web/images/../../../.."
    (corpus / "data/data_20250612/web/images/e").rename(corpus / "e")
    (corpus / "meta.json").write_text(json.dumps(meta))
    res = ingest(corpus, tmp_path / "out", progress=False)
    assert res.stats["dropped"] == {} and res.stats["steps_kept"] == 2
    trajs = (res.out_dir / "trajectories.jsonl").read_text()
    assert [s["screenshot"] for s in json.loads(trajs)["steps"]] == [
        "e/1/images/0.png",
        "e/1/images/1.png",
    ]


# ------------------------------------------------------------------------ bytes and nesting


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deeply_nested_json_is_bad_json(depth):
    assert parse_line("[" * depth + "]" * depth, 1).error[0] in ("bad_json", "bad_record")
    assert parse_line("[" * depth, 1).error[0] == "bad_json"
    assert parse_line('{"a":' * depth, 1).error[0] == "bad_json"


def test_invalid_utf8_inside_a_json_string_is_bad_encoding(tmp_path):
    corpus = tmp_path / "corpus"
    lines = episode("f/a", "Type it", [("Type", "write(message='caf\u00e9')"), STEPS[1]])
    write_corpus(corpus, {"internal_ubuntu_navigation_1": ("ubuntu", "navigation", lines)})
    path = corpus / "annotations/internal_ubuntu_navigation_1.jsonl"
    good = path.read_bytes()
    # \u00e9 is escaped by json.dumps; put a raw Latin-1 byte into the JSON string instead.
    path.write_bytes(good.replace(b"caf\\u00e9", b"caf\xe9", 1))
    res = ingest(corpus, tmp_path / "out", progress=False)
    assert res.stats["dropped"] == {"bad_encoding": 1, "no_trajectory_start": 1}
    q = [json.loads(x) for x in (res.out_dir / "quarantine.jsonl").read_text().splitlines()]
    assert q[0]["line"] == 1 and q[0]["reason"] == "bad_encoding"
    # Negative control: the valid UTF-8 form of the same text is kept.
    path.write_bytes(good.replace(b"caf\\u00e9", "caf\u00e9".encode(), 1))
    res = ingest(corpus, tmp_path / "out2", progress=False)
    assert res.stats["dropped"] == {} and res.stats["steps_kept"] == 2


def test_report_records_options_and_provenance(tmp_path):
    lines = episode("f/a", "T", STEPS)
    _, _, _, report = run(
        tmp_path,
        {"internal_android_navigation_1": ("android", "navigation", lines)},
        hswipe="reference",
        platforms=("android",),
    )
    assert report["hswipe"] == "reference" and report["platforms"] == ["android"]
    assert report["run"]["hivig"] and "sha" in report["run"]["git"]


def test_record_helper_is_used_consistently():
    # Guards the helpers above: a quoted history renders with the quotes the test relies on.
    rec = record("f/images/1.png", "T", ["'a'"], "b", "click(x=0.1, y=0.1)", quote=True)
    assert "Step 1: \"'a'\"" in rec["conversations"][0]["value"]


# ------------------------------------------------------------------------ command line


@pytest.mark.parametrize(
    "argv",
    [
        ["ingest", "--root", "{root}", "--out", "{file}"],
        ["split", "--in", "{file}", "--out", "{file}"],
        ["make-sample", "--out", "{file}", "--trajectories", "1"],
    ],
)
def test_out_that_is_a_file_is_refused_up_front(tmp_path, capsys, monkeypatch, argv):
    import data_gen.ingest as ingest_module
    from data_gen.__main__ import main

    def no_work(*a, **k):
        raise AssertionError("the work must not start")

    monkeypatch.setattr(ingest_module, "ingest", no_work)
    file = tmp_path / "taken"
    file.write_text("x")
    args = [a.format(root=tmp_path, file=file) for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert file.read_text() == "x"


def test_help_shows_defaults_and_examples(capsys):
    from data_gen.__main__ import main

    for command, needles in {
        "ingest": ["(default: header)", "examples:", "--shard 0/4"],
        "split": ["(default: 0.05)", "examples:"],
        "make-sample": [
            "(default: 540x1200)",
            "screenshot size in pixels of android",
            "instruction variants per episode",
            "cross-file copy",
            "examples:",
        ],
    }.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for needle in needles:
            assert " ".join(needle.split()) in text, (command, needle)


def test_cli_summary_reports_truncation_and_copies(tmp_path, capsys):
    from data_gen.__main__ import main

    corpus = tmp_path / "corpus"
    write_corpus(corpus, _copies())
    assert main(["ingest", "--root", str(corpus), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"cross-file copies dropped +1\n", out)
    assert re.search(r"truncated +0\n", out)


def test_both_passes_have_a_progress_bar(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, _copies())
    ingest(corpus, tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert re.search(r"parse: .*4\.00line", err) and re.search(
        r"normalise\+images: .*4\.00line", err
    )
    ingest(corpus, tmp_path / "out2", progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "image", ["../x.png", "/abs/x.png", "a/../../x.png", "..\\x.png", "C:\\x.png"]
)
def test_image_paths_that_escape_the_corpus_are_bad_records(image):
    rec = record(image, "Open the file", [], "Click OK", "click(x=0.5, y=0.5)")
    got = parse_line(json.dumps(rec), 1)
    assert got.error is not None and got.error[0] == "bad_record" and "escapes" in got.error[1]
