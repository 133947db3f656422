"""Trajectory/Step JSON round trip, stable keys, validation and JSONL files."""

from __future__ import annotations

import copy
import json

import pytest

from hivig.actions import (
    Click,
    Key,
    LeftClick,
    LeftClickDrag,
    MouseMove,
    Swipe,
    Terminate,
    Type,
    action_from_arguments,
)
from hivig.trajectory import (
    Source,
    Step,
    Trajectory,
    TrajectoryError,
    episode_key,
    read_trajectories,
    scan_trajectories,
    trajectory_id,
    write_trajectories,
)

FOLDER = "settings/free_task_20250605_101622"
TASK = "Turn on  dark mode\nin Settings"


def _desktop() -> Trajectory:
    shots = [f"{FOLDER}/images/{i}.png" for i in range(3)]
    steps = [
        Step(
            0,
            shots[0],
            "The Settings icon is visible.",
            "Open Settings",
            [LeftClick((501, 874))],
            "click(x=0.501, y=0.874)",
        ),
        Step(
            1,
            shots[1],
            None,
            "Drag the slider to the right",
            [MouseMove((300, 400)), LeftClickDrag((700, 400), start=(300, 400))],
            "moveTo(x=0.3, y=0.4)\ndragTo(x=0.7, y=0.4)",
        ),
        Step(
            2,
            shots[2],
            "Done — réglages appliqués ✓",
            None,
            [Key(("ctrl", "s")), Type("naïve café"), Terminate("success", info="all good")],
            "hotkey('ctrl', 's')\nwrite(message='naïve café')\nterminate(status='success')",
        ),
    ]
    return Trajectory(
        id=trajectory_id(FOLDER, TASK),
        episode_key=episode_key(FOLDER, shots),
        source=Source("ScaleCUA-Data", "annotations/data_20250612_windows.jsonl"),
        platform="windows",
        task=TASK,
        screen_w=1920,
        screen_h=1080,
        steps=steps,
        outcome="success",
    )


def _mobile() -> Trajectory:
    steps = [
        Step(
            0,
            "phone/ep1/0.png",
            "t",
            "Swipe up",
            [Swipe((500, 800), (500, 200), synthetic=True)],
            "swipe(direction='up')",
        ),
        Step(1, "phone/ep1/1.png", "t", "Tap", [Click((10, 990))], "click(x=10, y=990)"),
    ]
    return Trajectory(
        "m1", "e1", Source("ds", "f.jsonl"), "android", "Open app", 1080, 2400, steps, "unknown"
    )


def test_round_trip_preserves_everything():
    for traj in (_desktop(), _mobile()):
        obj = traj.to_json()
        back = Trajectory.from_json(json.loads(json.dumps(obj)))
        assert back == traj
        assert back.to_json() == obj


def test_json_form_is_exact():
    obj = _desktop().to_json()
    assert list(obj) == [
        "id",
        "episode_key",
        "source",
        "platform",
        "task",
        "screen",
        "outcome",
        "steps",
    ]
    assert obj["source"] == {
        "dataset": "ScaleCUA-Data",
        "file": "annotations/data_20250612_windows.jsonl",
    }
    assert obj["screen"] == {"width": 1920, "height": 1080}
    step0 = obj["steps"][0]
    assert step0 == {
        "index": 0,
        "screenshot": f"{FOLDER}/images/0.png",
        "think": "The Settings icon is visible.",
        "intent": "Open Settings",
        "actions": [{"action": "left_click", "coordinate": [501, 874]}],
        "raw_action": "click(x=0.501, y=0.874)",
    }
    assert "action_meta" not in step0  # only written when some action carries metadata


def test_drag_start_and_other_metadata_survive():
    obj = _desktop().to_json()
    step1 = obj["steps"][1]
    assert step1["actions"][1] == {"action": "left_click_drag", "coordinate": [700, 400]}
    assert step1["action_meta"] == [{}, {"start": [300, 400]}]
    back = Trajectory.from_json(obj)
    drag = back.steps[1].actions[1]
    assert isinstance(drag, LeftClickDrag) and drag.start == (300, 400)
    assert back.steps[2].actions[2].info == "all good"
    assert back.steps[0].actions[0].to_arguments() == {
        "action": "left_click",
        "coordinate": [501, 874],
    }
    mobile = Trajectory.from_json(_mobile().to_json())
    assert mobile.steps[0].actions[0].synthetic is True
    # Negative control: without action_meta the start is lost.
    del step1["action_meta"]
    assert Trajectory.from_json(obj).steps[1].actions[1].start is None


def test_actions_are_qwen_arguments():
    for step in _desktop().to_json()["steps"]:
        for args in step["actions"]:
            assert action_from_arguments(args, "computer_use").to_arguments() == args


def test_ids_are_stable_and_normalised():
    tid = trajectory_id(FOLDER, TASK)
    assert tid == trajectory_id(FOLDER + "/", "Turn on dark mode in Settings")
    assert tid == trajectory_id(FOLDER.replace("/", "\\"), TASK)
    assert len(tid) == 16 and int(tid, 16) >= 0
    assert tid != trajectory_id(FOLDER, "Turn on light mode in Settings")
    assert tid != trajectory_id("settings/other", TASK)
    # Pinned: the id must not change between releases (data splits depend on it).
    assert tid == "d40a3ea406e895ed"


def test_episode_key_groups_variants_and_orders_screens():
    shots = ["a/0.png", "a/1.png"]
    assert episode_key("a", shots) == episode_key("a/", list(shots))
    assert episode_key("a", shots) != episode_key("a", shots[::-1])
    assert episode_key("a", shots) != episode_key("a", shots[:1])
    assert episode_key("a", shots) != trajectory_id("a", "\0".join(shots))
    assert episode_key("a", shots) == "7810f335fda74b96"  # pinned across releases


def _bad(mutate) -> TrajectoryError:
    obj = copy.deepcopy(_desktop().to_json())
    mutate(obj)
    with pytest.raises(TrajectoryError) as info:
        Trajectory.from_json(obj)
    return info.value


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda o: o.update(platform="linux"), "unknown_platform"),
        (lambda o: o.update(outcome="maybe"), "bad_outcome"),
        (lambda o: o.pop("task"), "missing_field"),
        (lambda o: o.update(task="  "), "bad_field"),
        (lambda o: o["screen"].update(width=0), "bad_field"),
        (lambda o: o["screen"].update(height="1080"), "bad_field"),
        (lambda o: o.update(steps=[]), "no_steps"),
        (lambda o: o["steps"][1].update(index=2), "bad_step_index"),
        (lambda o: o["steps"].reverse(), "bad_step_index"),
        (lambda o: o["steps"][0].update(index=-1), "bad_step_index"),
        (lambda o: o["steps"][0].update(screenshot="/abs/0.png"), "absolute_path"),
        (lambda o: o["steps"][0].update(screenshot="C:\\shots\\0.png"), "absolute_path"),
        (lambda o: o["steps"][0].pop("screenshot"), "missing_field"),
        (lambda o: o["steps"][0]["actions"].append({"action": "fly"}), "bad_action"),
        (
            lambda o: o["steps"][0]["actions"].append({"action": "click", "coordinate": [1, 2]}),
            "bad_action",
        ),  # mobile action on a desktop platform
        (lambda o: o["steps"][0]["actions"][0].update(coordinate=[1200, 5]), "bad_action"),
        (lambda o: o["steps"][1].update(action_meta=[{}]), "bad_action_meta"),
        (lambda o: o["steps"][1].update(action_meta=[{}, {"colour": 1}]), "bad_action_meta"),
        (
            lambda o: o["steps"][1].update(action_meta=[{}, {"coordinate": [1, 1]}]),
            "bad_action_meta",
        ),
        (lambda o: o.update(source="ScaleCUA"), "bad_field"),
        (lambda o: o["steps"][0].update(think=3), "bad_field"),
    ],
)
def test_validation_errors_are_typed(mutate, reason):
    assert _bad(mutate).reason == reason


def test_constructor_validates_too():
    with pytest.raises(TrajectoryError) as info:
        Step(0, "a.png", None, None, [("left_click", 1, 2)], "")  # type: ignore[list-item]
    assert info.value.reason == "bad_action"
    steps = [Step(0, "a.png", None, None, [], ""), Step(0, "b.png", None, None, [], "")]
    with pytest.raises(TrajectoryError, match="0..1"):
        Trajectory("x", "e", Source("d", "f"), "web", "task", 1280, 720, steps)


def test_jsonl_round_trip_and_atomic_write(tmp_path):
    path = tmp_path / "traj.jsonl"
    trajectories = [_desktop(), _mobile()]
    assert write_trajectories(trajectories, path) == 2
    text = path.read_text(encoding="utf-8")
    assert text.count("\n") == 2
    assert "réglages appliqués ✓" in text  # UTF-8, not \u escapes
    assert read_trajectories(path) == trajectories
    assert [p.name for p in tmp_path.iterdir()] == ["traj.jsonl"]  # no temporary left over


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "traj.jsonl"
    write_trajectories([_mobile()], path)
    before = path.read_bytes()

    def broken():
        yield _desktop()
        raise RuntimeError("upstream failure")

    with pytest.raises(RuntimeError):
        write_trajectories(broken(), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["traj.jsonl"]


def test_bad_lines_are_reported_with_line_numbers(tmp_path):
    path = tmp_path / "traj.jsonl"
    good = json.dumps(_mobile().to_json())
    bad_platform = json.dumps({**_mobile().to_json(), "platform": "beos"})
    path.write_text(f"{good}\n\n{{not json\n{bad_platform}\n[1, 2]\n", encoding="utf-8")
    results = list(scan_trajectories(path))
    assert [n for n, _ in results] == [1, 3, 4, 5]
    assert isinstance(results[0][1], Trajectory)
    assert [r.reason for _, r in results[1:]] == ["bad_json", "unknown_platform", "bad_json"]
    with pytest.raises(TrajectoryError, match=r"traj.jsonl:3"):
        read_trajectories(path)


@pytest.mark.parametrize("path", ["/abs/x.png", "\\\\server\\x.png", "C:\\x.png", "c:/x.png"])
def test_absolute_screenshot_paths_rejected(path):
    with pytest.raises(TrajectoryError) as e:
        Step(0, path, None, None, [LeftClick((1, 2))], "")
    assert e.value.reason == "absolute_path"


@pytest.mark.parametrize(
    "meta",
    [{"start": {"x": 1}}, {"start": [1, 2, 3, 4]}, {"start": [1, 2000]}, {"start": ["a", 1]}],
)
def test_bad_drag_start_metadata_rejected(meta):
    obj = _desktop().to_json()
    obj["steps"][1]["action_meta"] = [{}, meta]
    with pytest.raises(TrajectoryError) as e:
        Trajectory.from_json(obj)
    assert e.value.reason == "bad_action_meta"


def test_deeply_nested_line_is_a_bad_json_error(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps(_desktop().to_json())
    path.write_text(good + "\n" + "[" * 100_000 + "\n" + good + "\n", encoding="utf-8")
    results = list(scan_trajectories(path))
    assert [n for n, _ in results] == [1, 2, 3]
    assert isinstance(results[1][1], TrajectoryError) and results[1][1].reason == "bad_json"
    assert isinstance(results[2][1], Trajectory)
