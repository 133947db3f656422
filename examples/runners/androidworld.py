"""AndroidWorld with the critic: an M3A-style agent that acts by element index.

python examples/runners/androidworld.py --selftest                  # scripted gateway here
python examples/runners/androidworld.py --gateway http://127.0.0.1:8080

The agent owns the environment, so the wrapper sits inside ``agent.step(goal)``: the action the
agent hands to ``env.execute_action`` is reviewed first (an index action at its element's
centre, so the marker sits on the element) and runs only when accepted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from _loopback import gateway, parser, rejected, report

from serve.adapters import GuardedAndroidWorldAgent

W, H = 1080, 2400


@dataclasses.dataclass(frozen=True)
class BoundingBox:
    """android_world's box: x_min, x_max, y_min, y_max in device pixels."""

    x_min: int
    x_max: int
    y_min: int
    y_max: int


@dataclasses.dataclass
class UIElement:
    """One element of the device's UI tree."""

    text: str
    bbox_pixels: BoundingBox


@dataclasses.dataclass
class State:
    """What ``env.get_state()`` returns: the screen and its elements."""

    pixels: np.ndarray
    ui_elements: list[UIElement]


class DeviceStandIn:
    """A device whose screen has two buttons; records what ran."""

    def __init__(self) -> None:
        self.executed: list[dict[str, Any]] = []
        # Element 0's centre is the scripted critic's rejected grid point [250, 250].
        self.elements = [
            UIElement("Cancel", BoundingBox(220, 320, 560, 640)),
            UIElement("OK", BoundingBox(700, 900, 1800, 1900)),
        ]

    def get_state(self, wait_to_stabilize: bool = False) -> State:
        """The current screen (changes after each action)."""
        pixels = np.full((H, W, 3), 230, dtype=np.uint8)
        pixels[: 40 + 60 * len(self.executed)] = (40, 60, 90)
        return State(pixels, self.elements)

    def execute_action(self, action: dict[str, Any]) -> None:
        """Actuation: an index click taps the element's centre."""
        self.executed.append(action)


class M3AStandIn:
    """Proposes ``click`` by index: the wrong button first, the right one after feedback."""

    def __init__(self, env: DeviceStandIn) -> None:
        self.env = env
        self.history: list[dict[str, Any]] = []

    def reset(self, go_home: bool = False) -> None:
        """New task."""
        self.history = []

    def step(self, goal: str) -> Any:
        """One agent step: read the state, pick an element, execute."""
        self.env.get_state(wait_to_stabilize=True)
        index = 1 if "critic judged" in goal else 0
        action = {"action_type": "click", "index": index}
        self.env.execute_action(action)
        self.history.append({"action_output_json": action})
        return type("Result", (), {"done": False, "data": {"action": action}})()


def main() -> None:
    """Run one step of a task through the guarded agent."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument(
        "--inject-history",
        action="store_true",
        help="add the critic's progress summary to every prompt (off: the prompt changes only "
        "after a rejection)",
    )
    args = cli.parse_args()
    env = DeviceStandIn()
    with gateway(args) as client:
        agent = GuardedAndroidWorldAgent(
            M3AStandIn(env), client, screen=(W, H), inject_history=args.inject_history
        )
        agent.reset()
        agent.step("Confirm the dialog")
        report(rejected(agent.log), env.executed)


if __name__ == "__main__":
    main()
