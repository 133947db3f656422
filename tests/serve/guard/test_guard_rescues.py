"""The guard's rescues (R3, ReTrace recovery) own their state: ``reset`` starts the next episode
with fresh ones, so nothing of a rescue that was running carries over."""

from __future__ import annotations

from tests.serve.client.test_serve_client import FakeGateway
from tests.serve.guard.test_serve_guard import (
    R3_ENV,
    Env,
    dead_spot_policy,
    guard_for,
    recovery_setup,
)


def test_reset_in_the_middle_of_a_reroute_starts_the_next_episode_in_normal_mode():
    gw = FakeGateway(r3_k=2)
    env = Env("A", dict(R3_ENV))
    policy = dead_spot_policy()
    guard = guard_for(gw, policy)
    guard.run(env.execute, env.shot(), max_steps=4)  # the trigger at step 3, one reroute ran
    assert guard.mode == "reroute" and guard.history == ["go", "dead", "dead"]
    guard.reset("Another task")
    assert guard.mode == "normal" and guard.r3_events == [] and not guard.terminating
    env = Env("A", dict(R3_ENV))
    guard.step(env.shot())
    ctx = policy.contexts[-1]
    assert ctx.mode == "normal" and ctx.history == () and ctx.step_idx == 0
    assert guard.log[0]["mode"] == "normal" and "r3" not in guard.log[0]


def test_reset_in_the_middle_of_a_recovery_forgets_its_target_and_tries():
    def answer(ctx):
        if ctx.mode == "recovery":
            return "wander"
        return {0: "inbox", 1: "open"}.get(ctx.step_idx, "done")

    gw, env, policy, guard = recovery_setup(answer)
    guard.run(env.execute, env.shot(), max_steps=3)
    assert guard.mode == "recovery" and guard.recoveries == []
    guard.reset()
    assert guard.mode == "normal" and guard.recoveries == []
    # The new episode may recover to the same target step again: the tried targets were the
    # old episode's.
    env.screen = "start"
    guard.run(env.execute, env.shot(), max_steps=3)
    assert [c.mode for c in policy.contexts[-3:]] == ["normal", "normal", "recovery"]
    assert guard.events["recovery_start"] == 1
