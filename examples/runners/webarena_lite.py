"""WebArenaLiteV2 with the critic: a tiny stand-in of ``agent_run.py``'s loop.

    python examples/runners/webarena_lite.py --selftest            # scripted gateway here
    python examples/runners/webarena_lite.py --gateway http://127.0.0.1:8080

The fake agent answers like the ScaleCUA native agent (``<action>`` in 1288x728 frame pixels,
``code`` in 1280x720 screen pixels, ``previous_operations_list``); the loop calls it with
keyword arguments and executes ``code`` as Playwright would.
"""

from __future__ import annotations

from typing import Any

from _loopback import gateway, parser, rejected, report, screen_png

from serve.adapters import GuardedWebArenaLiteAgent


class NativeAgentStandIn:
    """Proposes a click off target first, the right one when the critic objects, then stops."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """New task."""
        self.previous_operations_list: list[str] = []

    def predict(self, *, instruction: str, observation: dict[str, Any]) -> tuple[dict, list]:
        """``(info, code)`` like the native agent."""
        if self.previous_operations_list:
            op, code = "Finish", [{"name": "terminate", "parameters": {"status": "success"}}]
        else:
            # Frame pixels -> screen pixels, as the agent's own parser does.
            fx, fy = (644, 364) if "critic judged" in instruction else (322, 182)
            x, y = fx / 1288 * 1280, fy / 728 * 720
            op = "Click Submit" if fx == 644 else "Click the header"
            code = [
                {"name": "click", "parameters": {"x": x, "y": y, "clicks": 1, "button": "left"}}
            ]
        self.previous_operations_list.append(op)
        return {"thought": "", "operation": op, "actions": ""}, code


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
    executed: list[Any] = []
    with gateway(args) as client:
        agent = GuardedWebArenaLiteAgent(
            NativeAgentStandIn(), client, inject_history=args.inject_history
        )
        agent.reset()
        for idx in range(5):
            obs = {"screenshot": screen_png(1280, 720, seed=idx)}
            info, code = agent.predict(instruction="Submit the form", observation=obs)
            executed.append(code)  # env.step(code) in the harness
            if code[0]["name"] == "terminate":  # the harness' own end test
                break
        report(rejected(agent.log), executed)


if __name__ == "__main__":
    main()
