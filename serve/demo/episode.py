"""The demo's agent episode: a scripted policy behind ``CriticGuard``, on a real or drawn screen.

The task is "turn on dark mode in the settings". The script makes two mistakes on purpose:

1. an injected Bad step: typing a search text while no field has the focus (the keys go
   nowhere; Procedural Prerequisite Neglect);
2. a no-effect repeat: clicking the disabled *Publish* button twice, which the gateway's
   recurrence detector flags, so ``CriticGuard`` runs R3 (a fresh-context Reroute that must change
   the screen, then a Restore of the history without the loop).

Then it opens *Settings*, ticks *Dark mode*, saves and terminates. The same loop runs against any
environment with the runner interface ``reset(task) -> obs`` and ``step(action) -> (obs, reward,
done, info)``: ``serve.webenv.BrowserEnv`` (headless Chromium) or ``serve.demo.desk``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serve.client import ClientConfig, CriticClient
from serve.guard import CriticGuard, GuardConfig, PolicyContext

TASK = "Turn on dark mode in the settings."


Planned = dict[str, Any]
"""A planned step: an API action, or ``{"click": selector, "intent": ...}`` placed on the screen
when it is proposed (dialog controls have no position before the dialog opens)."""


@dataclass
class ScriptedPolicy:
    """Proposes the next planned step; from a fresh R3 context, the first step past the loop."""

    plan: list[Planned]
    reroute_to: int
    env: Any = None
    heed_feedback: bool = False
    """Re-propose the next planned step when the critic rejected this one (the scripted-critic
    run); off, the policy proposes the same step again, as a policy deaf to feedback would."""
    cursor: int = 0
    calls: list[str] = field(default_factory=list)
    _issued: dict[int, int] = field(default_factory=dict)

    def __call__(self, ctx: PolicyContext) -> dict[str, Any]:
        self.calls.append(ctx.mode)
        i = self.reroute_to if ctx.mode == "reroute" else min(self.cursor, len(self.plan) - 1)
        if self.heed_feedback and ctx.feedback and ctx.mode == "normal":
            i = min(i + 1, len(self.plan) - 1)  # the rejected step is dropped from the plan
        action = self._place(self.plan[i])
        self._issued[id(action)] = i
        return action

    def _place(self, step: Planned) -> dict[str, Any]:
        if "click" not in step:
            return dict(step)
        x, y = self.env.center_grid(step["click"])
        return {"type": "left_click", "x": x, "y": y, "intent": step["intent"]}

    def executed(self, proposal: dict[str, Any]) -> None:
        """Move past the step that was executed."""
        self.cursor = self._issued[id(proposal)] + 1


def demo_plan() -> tuple[list[Planned], int]:
    """The scripted steps and where a Reroute resumes."""
    publish = {"click": "#publish-btn", "intent": "Click Publish to apply the new theme"}
    plan = [
        {"type": "type", "text": "dark mode", "intent": "Type 'dark mode' into the search field"},
        publish,
        dict(publish),  # the no-effect repeat
        {"click": "#settings-btn", "intent": "Open the Settings dialog"},
        {"click": "#dark-toggle", "intent": "Tick the Dark mode checkbox"},
        {"click": "#settings-save", "intent": "Save the settings"},
        {"type": "terminate", "status": "success", "intent": "Dark mode is on; the task is done"},
    ]
    return plan, 3


def env_action(action: dict[str, Any]) -> dict[str, Any]:
    """API action (``type``, ``x``, ``y``) -> the environment's Qwen ``arguments`` dict."""
    args: dict[str, Any] = {"action": action["type"]}
    if "x" in action:
        args["coordinate"] = [action["x"], action["y"]]
    for key in ("text", "status", "time", "pixels"):
        if key in action:
            args[key] = action[key]
    return args


@dataclass
class EpisodeResult:
    """What the demo pages show."""

    session_id: str | None
    log: list[dict[str, Any]]
    r3_events: list[dict[str, Any]]
    events: dict[str, int]
    rewards: list[float]
    success: bool


def run_episode(
    env: Any,
    gateway_url: str,
    *,
    deadline_s: float = 300.0,
    max_steps: int = 12,
    heed_feedback: bool = False,
) -> EpisodeResult:
    """Run the scripted episode through the gateway at ``gateway_url``.

    ``heed_feedback``: after a Bad verdict the policy re-proposes the next planned step
    (``ScriptedPolicy.heed_feedback``).
    """
    obs = env.reset("dark_mode")
    plan, reroute_to = demo_plan()
    policy = ScriptedPolicy(plan, reroute_to, env, heed_feedback=heed_feedback)
    config = ClientConfig(
        base_url=gateway_url,
        observe_deadline_s=deadline_s,
        critique_deadline_s=deadline_s,
        session_deadline_s=60.0,
    )
    client = CriticClient(config=config)
    guard = CriticGuard(
        client,
        policy,
        task=TASK,
        platform="web",
        screen=(env.width, env.height),
        coord_space="norm1000",
        config=GuardConfig(max_reproposals=1),
        session_kwargs={"volatile_regions": env.volatile_regions()},
    )
    rewards: list[float] = []

    def execute(proposal: dict[str, Any]) -> bytes | None:
        policy.executed(proposal)
        if proposal["type"] == "terminate":
            return None
        nxt, reward, _done, _info = env.step(env_action(proposal))
        rewards.append(reward)
        return nxt["screenshot"]

    outcome = None
    try:
        guard.run(execute, obs["screenshot"], max_steps)
        session_id = guard.session.session_id if guard.session is not None else None
        # The environment's score, reported on close: the trace (and so the diagnosis) then
        # knows the episode's outcome instead of assuming a failure.
        outcome = "success" if _succeeded(rewards) else "failure"
    finally:
        guard.close(outcome)
        client.close()
    return EpisodeResult(
        session_id=session_id,
        log=list(guard.log),
        r3_events=list(getattr(guard, "r3_events", [])),
        events=dict(guard.events),
        rewards=rewards,
        success=_succeeded(rewards),
    )


def _succeeded(rewards: list[float]) -> bool:
    return bool(rewards and rewards[-1] >= 1.0)
