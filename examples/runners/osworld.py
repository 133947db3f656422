"""OSWorld with the critic: a tiny stand-in of ``lib_run_single.py``'s loop.

python examples/runners/osworld.py --selftest                  # scripted gateway here
python examples/runners/osworld.py --gateway http://127.0.0.1:8080
"""

from __future__ import annotations

from typing import Any

from _loopback import gateway, parser, rejected, report, screen_png

from serve.adapters import GuardedOSWorldAgent


class PromptAgentStandIn:
    """pyautogui code in 1920x1080 screen pixels: off target first, then right, then DONE."""

    def __init__(self) -> None:
        self.actions: list[Any] = []

    def reset(self, _logger: Any = None) -> None:
        """New task."""
        self.actions = []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        """``(response, actions)``."""
        if self.actions:
            out = ["DONE"]
        elif "critic judged" in instruction:
            out = ["pyautogui.click(960, 540)"]
        else:
            out = ["pyautogui.click(480, 270)"]
        self.actions.append(out)
        return "response", out


def main() -> None:
    """Run one short task through the guarded agent."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument(
        "--inject-history",
        action="store_true",
        help="add the critic's progress summary to every prompt (off: the prompt changes only "
        "after a rejection)",
    )
    args = cli.parse_args()
    executed: list[str] = []
    with gateway(args) as client:
        agent = GuardedOSWorldAgent(
            PromptAgentStandIn(),
            client,
            screen=(1920, 1080),
            inject_history=args.inject_history,
        )
        agent.reset()
        for step in range(5):
            _, actions = agent.predict(
                "Save the file", {"screenshot": screen_png(1920, 1080, step)}
            )
            executed.extend(actions)  # env.step(action) in the harness
            if actions[-1] in ("DONE", "FAIL"):
                break
        report(rejected(agent.log), executed)


if __name__ == "__main__":
    main()
