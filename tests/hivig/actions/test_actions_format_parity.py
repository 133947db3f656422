"""One action-format detector: the gateway reads an agent's text as the runner adapters do.

The gateway had a detector of its own, whose rules had drifted from the library's the adapters
use: ScaleCUA's own answer (``<action>pyautogui.click(x=0.5, y=0.5)</action>``) was OSWorld code
at the gateway, unparsed, and judged as raw text with no marker. The property below runs every
agent-output string the test suite holds through both doors.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hivig.actions import ActionError, ElementAction, LeftClick, detect_format, parse_agent_output
from serve.actions import CoordinateSpace, resolve

TESTS = Path(__file__).resolve().parents[2]
W, H = 1920, 1080
MARKERS = ("<tool_call>", "pyautogui.", "action_type", "<action>", "click(", '"parameters"')
MARKERS += ("tap(", "swipe(", "type(", "write(")


def _agent_strings() -> list[str]:
    """Every string literal in the tests that looks like an agent's action output."""
    found: set[str] = set()
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if 4 < len(text) < 2000 and any(m in text for m in MARKERS):
                    found.add(text)
    return sorted(found)


def _platform(text: str) -> str:
    phone = ("mobile_use", "action_type", "tap(", "swipe(")
    return "android" if any(m in text for m in phone) else "ubuntu"


def test_scalecua_text_is_read_at_the_gateway_as_the_adapters_read_it():
    raw = "<operation>Click OK</operation>\n<action>pyautogui.click(x=0.5, y=0.5)</action>"
    assert detect_format(raw) == "scalecua"
    got = resolve(
        {"raw": raw, "format": "auto", "coord_space": "norm01"},
        "ubuntu",
        CoordinateSpace("norm01", W, H),
    )
    assert got.error is None and got.actions == (LeftClick((500, 500)),)
    lib = parse_agent_output(
        raw, "auto", platform="ubuntu", width=W, height=H, coord_space="norm01"
    )
    assert list(got.actions) == lib


def test_every_agent_string_of_the_suite_reads_the_same_through_both_doors():
    strings = _agent_strings()
    assert len(strings) > 300  # the suite's real outputs, not a handful
    compared = 0
    for text in strings:
        platform = _platform(text)
        lib = parse_agent_output(
            text,
            "auto",
            platform=platform,
            width=W,
            height=H,
            coord_space="screen_px",
            frame=(W, H),
        )
        got = resolve({"raw": text, "format": "auto"}, platform, CoordinateSpace("screen_px", W, H))
        if isinstance(lib, ActionError):
            continue
        if any(isinstance(a, ElementAction) for a in lib):
            # An element index has no point: the gateway judges it as the text it is, by design.
            assert got.actions is None and got.error, text
            continue
        assert got.actions is not None and list(got.actions) == lib, text
        compared += 1
    assert compared > 150


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ('[{"name": "click", "parameters": {"x": 1, "y": 2}}]', "webarena_code"),
        ("<action>mobile.tap(x=1, y=2)</action>", "scalecua"),
        ("pyautogui.click(10, 20)", "osworld"),
        ("Action: {'action_type': 'navigate_back'}", "androidworld"),
        ('<tool_call>{"name": "computer_use", "arguments": {}}</tool_call>', "qwen"),
    ],
)
def test_one_detector(text, fmt):
    import serve.actions

    assert serve.actions.detect_format is detect_format
    assert detect_format(text) == fmt
