"""The ``hivig`` command line: action conversion, marking, taxonomy; exit 2 on bad input."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from hivig.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_convert_scalecua_drag_to_qwen(capsys):
    code, out, _ = _run(
        capsys,
        "action", "convert", "--from", "scalecua", "--to", "json", "--platform", "windows",
        "--width", "1920", "--height", "1080", "moveTo(x=0.1, y=0.2)\ndragTo(x=0.5, y=0.2)",
    )  # fmt: skip
    assert code == 0
    calls = json.loads(out)
    assert calls == [
        {"action": "mouse_move", "coordinate": [100, 200]},
        {"action": "left_click_drag", "coordinate": [500, 200]},
    ]


def test_convert_osworld_pixels_to_grid(capsys):
    code, out, _ = _run(
        capsys,
        "action", "convert", "--from", "osworld", "--to", "qwen",
        "--width", "1920", "--height", "1080", "pyautogui.click(960, 540)",
    )  # fmt: skip
    assert code == 0
    assert out.strip().startswith("<tool_call>")
    assert '"coordinate": [500, 500]' in out


def test_convert_bad_input_exits_2_with_reason(capsys):
    code, out, err = _run(
        capsys, "action", "convert", "--from", "scalecua", "--platform", "web", "launch_rockets()"
    )
    assert code == 2 and out == ""
    assert "hivig: error:" in err


def test_mark_writes_canonical_frame_with_marker(tmp_path, capsys):
    src = tmp_path / "in.png"
    Image.new("RGB", (1920, 1080), (255, 255, 255)).save(src)
    out = tmp_path / "out.png"
    call = (
        '<tool_call>\n{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [500, 500]}}\n</tool_call>'
    )
    code, _, _ = _run(capsys, "mark", "--image", str(src), "--action", call, "--out", str(out))
    assert code == 0
    img = Image.open(out).convert("RGB")
    assert img.size == (1344, 768)
    # Some red marker pixels exist, near the centre but not at it (open centre).
    reds = [
        (x, y)
        for x in range(640, 704)
        for y in range(352, 416)
        if img.getpixel((x, y)) == (255, 0, 0)
    ]
    assert reds
    assert img.getpixel((672, 384)) == (255, 255, 255)


def test_mark_rejects_python_literal_tool_call(tmp_path, capsys):
    src = tmp_path / "in.png"
    Image.new("RGB", (64, 64)).save(src)
    call = "<tool_call>{'name': 'computer_use', 'arguments': {'action': 'left_click'}}</tool_call>"
    code, _, err = _run(
        capsys, "mark", "--image", str(src), "--action", call, "--out", str(tmp_path / "o.png")
    )
    assert code == 2 and "error" in err


def test_taxonomy_lists_twelve(capsys):
    code, out, _ = _run(capsys, "taxonomy", "--json")
    assert code == 0 and len(json.loads(out)) == 12


def test_help_explains_itself(capsys):
    with pytest.raises(SystemExit) as e:
        main(["action", "convert", "--help"])
    assert e.value.code == 0
    assert "tool_call" in capsys.readouterr().out


def test_convert_action_without_qwen_form_exits_2(capsys):
    code, out, err = _run(
        capsys, "action", "convert", "--from", "scalecua", "--platform", "windows", "call_user()"
    )
    assert code == 2 and out == ""
    assert "unsupported_action" in err


def test_convert_keeps_escapes_inside_strings(capsys):
    code, out, _ = _run(
        capsys, "action", "convert", "--from", "scalecua", "--to", "json",
        "write(message='a\\nb')",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == [{"action": "type", "text": "a\nb"}]


def test_convert_qwen_mobile_block_keeps_its_space(capsys):
    call = (
        '<tool_call>\n{"name": "mobile_use", "arguments": '
        '{"action": "click", "coordinate": [10, 20]}}\n</tool_call>'
    )
    code, out, _ = _run(capsys, "action", "convert", "--from", "qwen", "--to", "qwen", call)
    assert code == 0 and '"name": "mobile_use"' in out


def test_convert_reads_stdin(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("click(x=0.5, y=0.5)\n"))
    code, out, _ = _run(capsys, "action", "convert", "--from", "scalecua", "--to", "json", "-")
    assert code == 0 and json.loads(out)[0]["coordinate"] == [500, 500]


@pytest.mark.parametrize(
    "extra",
    [["--max-pixels", "0"], ["--max-pixels", "1000"], ["--min-pixels", "5000000"]],
)
def test_mark_bad_budget_exits_2(tmp_path, capsys, extra):
    src = tmp_path / "in.png"
    Image.new("RGB", (640, 360)).save(src)
    call = (
        '<tool_call>{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [1, 2]}}</tool_call>'
    )
    code, _, err = _run(
        capsys, "mark", "--image", str(src), "--action", call,
        "--out", str(tmp_path / "o.png"), *extra,
    )  # fmt: skip
    assert code == 2 and "hivig: error:" in err


def test_mark_unwritable_or_lossy_out_exits_2(tmp_path, capsys):
    src = tmp_path / "in.png"
    Image.new("RGB", (640, 360)).save(src)
    call = (
        '<tool_call>{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [1, 2]}}</tool_call>'
    )
    for out in (tmp_path / "missing" / "o.png", tmp_path / "o.jpg"):
        code, _, err = _run(
            capsys, "mark", "--image", str(src), "--action", call, "--out", str(out)
        )
        assert code == 2 and "hivig: error:" in err
