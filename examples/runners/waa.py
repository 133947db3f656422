"""WindowsAgentArena with the critic: a tiny stand-in of ``lib_run_single.py``'s loop.

    python examples/runners/waa.py --selftest                      # scripted gateway here
    python examples/runners/waa.py --gateway http://127.0.0.1:8080

The fake agent answers like WAA's ScaleCUA agent (a 4-tuple; pyautogui code in 1280x800 screen
pixels converted from its 1288x812 frame; ``DONE`` at the end; operations kept in ``history``).
"""

from __future__ import annotations

from typing import Any

from _loopback import gateway, parser, rejected, report, screen_png

from serve.adapters import GuardedWAAAgent


class ScaleCUAStandIn:
    """Proposes a click off target first, the right one when the critic objects, then DONE."""

    def __init__(self) -> None:
        self.history: list[str] = []

    def reset(self, _logger: Any = None) -> None:
        """New task."""
        self.history = []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list, dict, None]:
        """``(response, actions, logs, computer_update_args)``."""
        if self.history:
            op, actions = "Done", ["DONE"]
        else:
            fx, fy = (644, 406) if "critic judged" in instruction else (322, 203)
            op = "Click Save" if fx == 644 else "Click the title bar"
            x, y = fx / 1288 * 1280, fy / 812 * 800
            actions = [f'pyautogui.click(x={x:.4f}, y={y:.4f}, clicks=1, button="left")']
        self.history.append(op)
        response = f"<operation>{op}</operation>"
        return response, actions, {"agent_raw_response": response}, None


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
        agent = GuardedWAAAgent(ScaleCUAStandIn(), client, inject_history=args.inject_history)
        agent.reset()
        done = False
        for step in range(5):
            obs = {"screenshot": screen_png(1280, 800, seed=step), "accessibility_tree": None}
            response, actions, logs, _ = agent.predict("Save the file", obs)
            for action in actions:  # env.step(action) in the harness
                executed.append(action)
                done = action in ("DONE", "FAIL")
            if done:
                break
        report(rejected(agent.log), executed)


if __name__ == "__main__":
    main()
