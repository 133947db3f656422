"""AndroidLab with the critic: two tasks in a thread pool sharing one wrapped agent.

    python examples/runners/androidlab.py --selftest               # scripted gateway here
    python examples/runners/androidlab.py --gateway http://127.0.0.1:8080

Each task builds ``PixellevelTask``-style messages (screenshot as a ``data:`` URL, ``Task:`` and
``Previous operations:``), calls ``agent.act`` and taps the ``<action>`` point rescaled from the
980x2128 frame to the 1440x3120 device.
"""

from __future__ import annotations

import base64
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _loopback import gateway, parser, rejected, report, screen_png

from serve.adapters import GuardedAndroidLabAgent

SCREEN = screen_png(1440, 3120)


class AgentStandIn:
    """Stateless, like AndroidLab's agents: off target, on target once told, then stop."""

    name = "AgentStandIn"

    def prompt_to_message(self, prompt: str, images: list[bytes]) -> dict[str, Any]:
        """The user message (images inline as ``data:`` URLs)."""
        urls = ["data:image/png;base64," + base64.b64encode(i).decode() for i in images]
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return {"role": "user", "content": [*parts, {"type": "text", "text": prompt}]}

    def act(self, messages: list[dict[str, Any]]) -> str:
        """One response in ScaleCUA's sections."""
        text = messages[-1]["content"][-1]["text"]
        if "Step 0:" in text:
            return '<operation>Finish</operation><action>terminate(status="success")</action>'
        if "critic judged" in text:
            return "<operation>Tap OK</operation><action>click(x=490, y=1064)</action>"
        return "<operation>Tap the logo</operation><action>click(x=245, y=532)</action>"


def run_task(agent: GuardedAndroidLabAgent, instruction: str) -> list[Any]:
    """``PixellevelTask.run_step`` until ``finish``; the device taps it made."""
    operations, taps = "", []
    for turn in range(4):
        prompt = f"Task:\n{instruction}\n\nPrevious operations:\n{operations}"
        rsp = agent.act(
            [{"role": "system", "content": "..."}, agent.prompt_to_message(prompt, [SCREEN])]
        )
        op = re.search(r"<operation>(.*?)</operation>", rsp, re.S)
        action = re.search(r"<action>(.*?)</action>", rsp, re.S)
        operations += f"Step {turn}: {op[1] if op else None}\n"
        call = action[1].strip() if action else ""
        if m := re.match(r"click\(x=(\d+), y=(\d+)\)", call):
            taps.append((int(m[1]) * 1440 / 980, int(m[2]) * 3120 / 2128))
        if call.startswith("terminate("):
            break
    agent.end_task()
    return taps


def main() -> None:
    """Two tasks at once through one guarded agent."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument(
        "--inject-history",
        action="store_true",
        help="add the critic's progress summary to every prompt (off: the prompt changes only "
        "after a rejection)",
    )
    args = cli.parse_args()
    with gateway(args) as client:
        # The with block closes every thread's last episode (the harness never says a task
        # ended).
        agent = GuardedAndroidLabAgent(AgentStandIn(), client, inject_history=args.inject_history)
        with agent, ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(run_task, agent, t) for t in ("Open the clock", "Open Maps")]
            taps = [f.result() for f in futures]
        report(sum(rejected(e["log"]) for e in agent.logs), taps)


if __name__ == "__main__":
    main()
