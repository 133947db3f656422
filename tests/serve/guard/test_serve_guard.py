"""CriticGuard: re-proposal on bad, exhaustion policies, escalation, best-of-N, fail-open,
R3 (Reset, Reroute, Restore) and ReTrace recovery, against the in-process fake gateway."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import httpx
import pytest

from serve.guard import CriticGuard, GuardConfig, PolicyContext, R3Config, RecoveryLoopConfig
from tests.serve.client.test_serve_client import (
    FakeGateway,
    _closed_sessions_are_unknown,
    make_client,
    png,
)


class Env:
    """Screens are names; ``transitions[(screen, action)]`` is the next screen, else no change."""

    def __init__(self, start: str, transitions: dict[tuple[str, str], str]) -> None:
        self.screen = start
        self.transitions = transitions
        self.executed: list[str] = []

    def shot(self) -> bytes:
        return png(self.screen)

    def execute(self, proposal: str) -> bytes:
        self.executed.append(proposal)
        self.screen = self.transitions.get((self.screen, proposal), self.screen)
        return self.shot()


class Scripted:
    """A policy that answers from a function of the context and records every context."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.contexts: list[PolicyContext] = []

    def __call__(self, ctx: PolicyContext) -> Any:
        self.contexts.append(ctx)
        return self.answer(ctx)


def judge_by(table: dict[str, tuple[str, float]]):
    def judge(action: dict[str, Any]) -> dict[str, Any]:
        verdict, conf = table.get(action["raw"], ("good", 0.9))
        out = {"verdict": verdict, "confidence": conf}
        if verdict == "bad":
            out |= {"error_dimension": "Wrong Target", "explanation": f"{action['raw']} is wrong."}
        return out

    return judge


def guard_for(gw: FakeGateway, policy, **cfg: Any) -> CriticGuard:
    return CriticGuard(
        make_client(gw),
        policy,
        task="Open the menu",
        platform="ubuntu",
        screen=(1920, 1080),
        config=GuardConfig(**cfg),
    )


def ref_of(screen: str) -> str:
    encoded = base64.b64encode(png(screen)).decode()
    return "sha256:" + hashlib.sha256(encoded.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# The per-step loop


def test_good_proposal_is_executed_and_history_is_injected():
    gw = FakeGateway()
    env = Env("A", {("A", "go"): "B", ("B", "go"): "C"})
    policy = Scripted(lambda ctx: "go")
    guard = guard_for(gw, policy)
    decisions = guard.run(env.execute, env.shot(), max_steps=2)
    assert [d.outcome for d in decisions] == ["accepted", "accepted"]
    assert env.executed == ["go", "go"]
    # The second observe carried the executed action; the policy saw the macro history.
    assert gw.bodies("/observe")[1]["prev_action"] == {"raw": "go", "format": "auto"}
    assert "1 steps done" in policy.contexts[1].history_text
    assert policy.contexts[1].history == ("go",)
    assert guard.log[1]["proposals"][0]["verdict"]["verdict"] == "good"
    # The exchange is plain JSON for a harness log or a demo page.
    logged = json.loads(json.dumps(guard.log))
    assert logged[0]["outcome"] == "accepted" and logged[0]["executed"]["raw"] == "go"


def test_bad_proposal_gets_feedback_and_is_reproposed():
    gw = FakeGateway()
    gw.judge = judge_by({"help": ("bad", 0.8)})
    policy = Scripted(lambda ctx: "menu" if ctx.feedback else "help")
    guard = guard_for(gw, policy)
    d = guard.step(png("A"))
    assert d.proposal == "menu" and d.outcome == "accepted"
    assert len(policy.contexts) == 2 and policy.contexts[0].feedback == ()
    fb = policy.contexts[1].feedback[0]
    assert "Wrong Target" in fb and "help is wrong." in fb and fb.endswith("different action.")
    rulings = [p["ruling"] for p in guard.log[0]["proposals"]]
    assert rulings == ["rejected", "accepted"]
    assert guard.log[0]["feedback"] == [fb]


@pytest.mark.parametrize(
    ("how", "expected", "stop"),
    [("execute_last", "b", False), ("execute_first", "a", False), ("stop", None, True)],
)
def test_exhausted_policies(how, expected, stop):
    gw = FakeGateway()
    gw.judge = judge_by({"a": ("bad", 0.9), "b": ("bad", 0.7)})
    policy = Scripted(lambda ctx: "b" if ctx.feedback else "a")
    d = guard_for(gw, policy, on_exhausted=how).step(png("A"))
    assert d.proposal == expected and d.stop is stop
    assert d.outcome == ("stopped" if stop else "critic_overridden")
    assert len(policy.contexts) == 2  # K = 1: one re-proposal


def test_k_two_allows_three_proposals():
    gw = FakeGateway()
    gw.judge = judge_by({"a": ("bad", 0.9), "b": ("bad", 0.9)})
    answers = iter(["a", "b", "c"])
    policy = Scripted(lambda ctx: next(answers))
    d = guard_for(gw, policy, max_reproposals=2).step(png("A"))
    assert d.proposal == "c" and d.outcome == "accepted"
    assert len(policy.contexts[2].feedback) == 2


def test_three_rejections_at_one_screen_escalate():
    gw = FakeGateway()
    gw.judge = judge_by({"bad": ("bad", 0.9)})
    env = Env("A", {})  # nothing ever changes the screen
    policy = Scripted(lambda ctx: "bad")
    guard = guard_for(gw, policy, r3=R3Config(enabled=False))
    decisions = guard.run(env.execute, env.shot(), max_steps=2)
    # Step 0: rejected twice (overridden); step 1: one more rejection, then the next proposal
    # is accepted without critique.
    assert [d.outcome for d in decisions] == ["critic_overridden", "escalated"]
    assert guard.events["escalation"] == 1
    assert len(gw.bodies("/critique")) == 3


def test_best_of_n_ranks_by_verdict_then_confidence():
    gw = FakeGateway()
    gw.judge = judge_by({"x": ("bad", 0.9), "y": ("good", 0.6), "z": ("good", 0.8)})
    policy = Scripted(lambda ctx: ["x", "y", "z"][: ctx.n])
    guard = guard_for(gw, policy, candidates=3)
    d = guard.step(png("A"))
    assert d.proposal == "z" and d.outcome == "ranked"
    assert len(gw.bodies("/critique")) == 1
    assert gw.bodies("/critique")[0]["candidates"][0] == {"raw": "x", "format": "auto"}
    assert [p["rank"] for p in guard.log[0]["proposals"]] == [2, 1, 0]


def test_best_of_n_calls_a_single_answer_policy_n_times():
    gw = FakeGateway()
    answers = iter(["p", "q"])
    policy = Scripted(lambda ctx: next(answers))
    d = guard_for(gw, policy, candidates=2).step(png("A"))
    assert len(policy.contexts) == 2 and d.proposal in ("p", "q")


def test_best_of_n_flattens_list_answers():
    gw = FakeGateway()
    gw.judge = judge_by({"c1": ("bad", 0.9)})
    calls = iter([["c1"], [["c2"], "c3"], ["c4"]])
    policy = Scripted(lambda ctx: next(calls))
    d = guard_for(gw, policy, candidates=3).step(png("A"))
    sent = [c["raw"] for c in gw.bodies("/critique")[0]["candidates"]]
    assert sent == ["c1", "c2", "c3"] and len(policy.contexts) == 2
    assert d.proposal in ("c2", "c3") and d.outcome == "ranked"


def test_best_of_n_policy_that_returns_nothing_is_called_at_most_n_times():
    gw = FakeGateway()
    policy = Scripted(lambda ctx: [])
    d = guard_for(gw, policy, candidates=3).step(png("A"))
    assert len(policy.contexts) == 3 and d.proposal is None


@pytest.mark.parametrize(
    ("how", "expected", "stop"),
    [("execute_last", "b", False), ("execute_first", "b", False), ("stop", None, True)],
)
def test_best_of_n_all_bad_follows_on_exhausted(how, expected, stop):
    gw = FakeGateway()
    gw.judge = judge_by({"a": ("bad", 0.9), "b": ("bad", 0.6), "c": ("bad", 0.8)})
    guard = guard_for(gw, Scripted(lambda ctx: ["a", "b", "c"]), candidates=3, on_exhausted=how)
    d = guard.step(png("A"))
    assert d.proposal == expected and d.stop is stop  # the best-ranked (least sure bad)
    assert d.outcome == ("stopped" if stop else "critic_overridden")
    assert guard.events["critic_stopped" if stop else "critic_overridden"] == 1


def test_best_of_n_rejections_count_towards_escalation():
    gw = FakeGateway()
    gw.judge = judge_by({"a": ("bad", 0.9), "b": ("bad", 0.6)})
    env = Env("A", {})
    guard = guard_for(
        gw, Scripted(lambda ctx: ["a", "b"]), candidates=2, r3=R3Config(enabled=False)
    )
    decisions = guard.run(env.execute, env.shot(), max_steps=3)
    assert [d.outcome for d in decisions] == [
        "critic_overridden",
        "critic_overridden",
        "escalated",
    ]
    assert guard.events["escalation"] == 1 and len(gw.bodies("/critique")) == 2


def test_guard_level_fail_opens_are_counted():
    gw = FakeGateway()
    guard = guard_for(gw, Scripted(lambda ctx: "go"))
    guard.observe(png("A"))

    class Broken:
        def critique(self, *a, **k):
            raise RuntimeError("boom")

        def close(self):
            return True

    real, guard.session = guard.session, Broken()
    d = guard.decide()
    assert d.outcome == "fail_open" and guard.events["critique_client_error"] == 1
    guard.session = real


def test_critic_errors_fail_open():
    gw = FakeGateway()
    gw.faults = [("/critique", 500)]
    policy = Scripted(lambda ctx: "go")
    d = guard_for(gw, policy).step(png("A"))
    assert d.proposal == "go" and d.outcome == "fail_open"
    assert d.verdict.reason == "backend"


def test_a_broken_action_converter_still_sends_the_proposal_as_text():
    gw = FakeGateway()

    def to_action(proposal):
        raise ValueError("adapter bug")

    guard = CriticGuard(
        make_client(gw),
        Scripted(lambda ctx: "go"),
        task="t",
        platform="ubuntu",
        screen=(10, 10),
        to_action=to_action,
    )
    d = guard.step(png("A"))
    assert d.proposal == "go" and d.action == {"raw": "go", "format": "auto"}
    assert gw.bodies("/critique")[0]["action"] == {"raw": "go", "format": "auto"}


def test_gateway_down_the_whole_episode_still_runs():
    gw = FakeGateway()
    gw.faults = [("/", "connect")] * 1000
    env = Env("A", {("A", "go"): "B", ("B", "go"): "C"})
    guard = guard_for(gw, Scripted(lambda ctx: "go"))
    decisions = guard.run(env.execute, env.shot(), max_steps=3)
    assert env.executed == ["go", "go", "go"]
    assert all(d.outcome == "fail_open" and not d.stop for d in decisions)
    assert guard.log[0]["observe"]["status"] == "stale"


def test_guard_review_commit_api():
    gw = FakeGateway()
    gw.judge = judge_by({"a": ("bad", 0.9)})
    guard = guard_for(gw, Scripted(lambda ctx: "unused"))
    guard.observe(png("A"))
    first = guard.review("a")
    assert not first.accept and first.feedback and guard.context().feedback == (first.feedback,)
    second = guard.review("b")
    assert second.accept
    d = guard.commit(second)
    assert d.proposal == "b" and guard.history == ["b"]
    with pytest.raises(RuntimeError):
        guard.review("c")  # no observe yet for the next step


def test_reset_starts_a_new_session():
    gw = FakeGateway()
    guard = guard_for(gw, Scripted(lambda ctx: "go"))
    guard.step(png("A"))
    guard.reset("Another task")
    guard.step(png("A"))
    assert [b["task"] for b in gw.creates()] == ["Open the menu", "Another task"]
    assert gw.sessions["s1"]["closed"] and guard.log[0]["step_idx"] == 0


def test_config_is_validated_and_loads_from_overrides():
    from hivig.config import ConfigError, load_config

    with pytest.raises(ValueError):
        GuardConfig(on_exhausted="panic")
    with pytest.raises(ValueError):
        GuardConfig(max_reproposals=-1)
    with pytest.raises(ValueError):
        R3Config(reroute_attempts=0)
    with pytest.raises(ValueError):
        RecoveryLoopConfig(budget=0)
    cfg = load_config(GuardConfig, None, ["r3.on_failure=continue", "recovery.budget=5"])
    assert cfg.r3.on_failure == "continue" and cfg.recovery.budget == 5
    with pytest.raises(ConfigError):
        load_config(GuardConfig, None, ["on_exhausted=panic"])


# ---------------------------------------------------------------------------------------------
# R3


def dead_spot_policy():
    """Goes to B, clicks a dead spot until told to start afresh; then tries the dead spot once
    more and then the menu."""
    fresh_answers = iter(["dead", "menu", "menu", "menu"])

    def answer(ctx: PolicyContext) -> str:
        if ctx.mode == "reroute":
            return next(fresh_answers)
        if not ctx.history:
            return "go"
        return "dead" if ctx.history[-1] in ("go", "dead") else "next"

    return Scripted(answer)


R3_ENV = {("A", "go"): "B", ("B", "menu"): "C", ("C", "next"): "D"}


def test_r3_triggers_reroutes_and_restores_without_a_trace_of_the_loop():
    gw = FakeGateway(r3_k=2)
    env = Env("A", dict(R3_ENV))
    policy = dead_spot_policy()
    guard = guard_for(gw, policy)
    decisions = guard.run(env.execute, env.shot(), max_steps=7)
    # go, dead, dead -> trigger at step 3; reroute: dead (no effect), menu (changes) -> restore.
    assert env.executed[:6] == ["go", "dead", "dead", "dead", "menu", "next"]
    assert guard.log[3]["r3"]["event"] == "trigger" and guard.log[3]["r3"]["loop_steps"] == 2
    assert [c.mode for c in policy.contexts[3:5]] == ["reroute", "reroute"]
    # Reset: the reroute proposals were made from the task and screen only.
    assert all(c.history == () and c.history_text == "" for c in policy.contexts[3:5])
    assert guard.log[5]["r3"]["event"] == "restored"
    # Restore: the history before the loop plus the accepted step, no dead clicks.
    assert policy.contexts[5].history == ("go", "menu")
    assert "dead" not in " ".join(policy.contexts[5].history)
    assert guard.history[:3] == ["go", "menu", "next"]
    assert guard.r3_events == [
        {
            "event": "restored",
            "attempts": 2,
            "trigger_step": 3,
            "loop_start": 1,
            "gateway_rebuilt": True,
            "accepted": "menu",
        }
    ]
    # The gateway's history was rebuilt too: re-seeded before the loop, the accepted step
    # observed again, and the steps after it numbered without the loop.
    sess = gw.sessions["s1"]
    assert [st["intent"] for st in sess["echo"]["steps"]] == ["go", "menu", "next"]
    assert guard.log[5]["gateway_step"] == 2 and guard.log[6]["gateway_step"] == 3
    assert policy.contexts[5].history_text == (
        "Progress so far: 2 steps done\nResult of the last action: ok"
    )
    assert gw.bodies("/critique")[-1]["step_idx"] == 3  # critiques follow the new numbering
    assert not decisions[-1].stop


def test_r3_restore_without_the_gateway_rebuild_restores_the_policy_text():
    gw = FakeGateway(r3_k=2)
    env = Env("A", dict(R3_ENV))
    policy = dead_spot_policy()
    guard = guard_for(gw, policy, r3=R3Config(rebuild_gateway_history=False))
    guard.run(env.execute, env.shot(), max_steps=6)
    assert guard.r3_events[0]["gateway_rebuilt"] is False
    assert policy.contexts[5].history == ("go", "menu")
    # The text seen before the loop, plus the accepted step's result; no loop results.
    text = policy.contexts[5].history_text
    assert text.startswith(guard.notes.texts[1]) and "nothing changed" not in text
    # The gateway kept its own history (loop included) and its numbering.
    assert "gateway_step" not in guard.log[5]


def test_r3_restored_text_is_dropped_once_the_gateway_history_moves_on():
    gw = FakeGateway(r3_k=2)
    env = Env("A", {**R3_ENV, ("D", "next"): "E", ("E", "next"): "F"})
    policy = dead_spot_policy()
    guard = guard_for(gw, policy, r3=R3Config(rebuild_gateway_history=False))
    guard.run(env.execute, env.shot(), max_steps=8)
    assert policy.contexts[5].history_text.startswith(guard.notes.texts[1])  # restored at step 5
    # The next history update is newer than the loop's: the gateway's own text again.
    for ctx in policy.contexts[6:]:
        assert ctx.history_text == guard.notes.texts[ctx.step_idx]
    assert "6 steps done" in policy.contexts[6].history_text
    assert guard.events["r3_text_released"] == 1


def test_r3_rebuild_failure_falls_back_to_the_policy_text():
    gw = FakeGateway(r3_k=2)
    env = Env("A", dict(R3_ENV))
    policy = dead_spot_policy()
    guard = guard_for(gw, policy)
    inner = gw.route

    def no_delete(method, path, body):
        if method == "DELETE":
            return httpx.Response(500, json={"error": {"code": "internal", "message": "x"}})
        return inner(method, path, body)

    gw.route = no_delete
    decisions = guard.run(env.execute, env.shot(), max_steps=6)
    assert guard.r3_events[0]["gateway_rebuilt"] is False
    assert guard.events["r3_rebuild_failed"] == 1
    assert policy.contexts[5].history == ("go", "menu") and not decisions[-1].stop


@pytest.mark.parametrize(("failures", "rebuilt"), [(1, True), (2, False)])
def test_r3_rebuild_whose_recreate_fails_never_forces_a_gap(failures, rebuilt):
    gw = FakeGateway(r3_k=2)
    _closed_sessions_are_unknown(gw, create_failures=failures)
    env = Env("A", dict(R3_ENV))
    policy = dead_spot_policy()
    guard = guard_for(gw, policy)
    decisions = guard.run(env.execute, env.shot(), max_steps=7)
    assert guard.r3_events[0]["gateway_rebuilt"] is rebuilt and not decisions[-1].stop
    assert not any(b.get("force") for b in gw.bodies("/observe"))
    steps = [st["intent"] for st in gw.sessions["s1"]["echo"]["steps"]]
    if rebuilt:  # the create was retried: the loop is gone from the gateway
        assert steps == ["go", "menu", "next"]
    else:  # lost: re-created from the current echo, loop included, numbering unchanged
        assert guard.events["r3_rebuild_lost"] == 1
        assert steps == ["go", "dead", "dead", "dead", "menu", "next"]
        assert gw.creates()[-1]["echo"]["step_idx"] == 5
        assert "gateway_step" not in guard.log[6]


def test_r3_trigger_needs_k_repeats():
    gw = FakeGateway(r3_k=3)
    env = Env("A", dict(R3_ENV))
    guard = guard_for(gw, dead_spot_policy())
    guard.run(env.execute, env.shot(), max_steps=4)  # go, then dead three times
    assert guard.events["r3_trigger"] == 0 and guard.mode == "normal"
    guard.run(env.execute, env.shot(), max_steps=1)  # observes the third no-effect repeat
    assert guard.events["r3_trigger"] == 1 and guard.mode == "reroute"


def test_r3_reroute_that_never_changes_the_screen_terminates_when_configured_to():
    gw = FakeGateway()
    env = Env("A", {("A", "go"): "B"})  # nothing changes B
    policy = Scripted(lambda ctx: "go" if not ctx.history and ctx.mode == "normal" else "dead")
    # Ending the episode is opt-in (the default fails open, see test_r3_failure_can_continue).
    guard = guard_for(gw, policy, r3=R3Config(reroute_attempts=3, on_failure="terminate"))
    decisions = guard.run(env.execute, env.shot(), max_steps=10)
    assert decisions[-1].stop and decisions[-1].outcome == "r3_failed"
    assert env.executed == ["go", "dead", "dead", "dead", "dead", "dead"]
    assert guard.events["r3_failed"] == 1
    assert guard.history == ["go"]  # the loop and the failed reroutes left out


def test_r3_failure_can_continue():
    gw = FakeGateway()
    env = Env("A", {("A", "go"): "B"})
    policy = Scripted(lambda ctx: "go" if not ctx.history and ctx.mode == "normal" else "dead")
    guard = guard_for(gw, policy, r3=R3Config(reroute_attempts=2))  # the default: continue
    decisions = guard.run(env.execute, env.shot(), max_steps=7)
    assert not any(d.stop for d in decisions)
    assert guard.events["r3_failed"] >= 1 and len(decisions) == 7
    # The give-up is on record, and the policy's own proposal ran at that step.
    assert guard.events["gave_up"] == guard.events["r3_failed"]
    gave_up = [r for r in guard.log if r.get("gave_up") == "r3_failed"]
    assert gave_up and all(r["outcome"] != "r3_failed" for r in gave_up)


def test_r3_bad_reroute_proposal_is_not_executed():
    gw = FakeGateway()
    gw.judge = judge_by({"delete all": ("bad", 0.95)})
    env = Env("A", dict(R3_ENV))
    fresh = iter(["delete all", "menu"])

    def answer(ctx):
        if ctx.mode == "reroute":
            return next(fresh)
        return "go" if not ctx.history else "dead"

    guard = guard_for(gw, Scripted(answer))
    guard.run(env.execute, env.shot(), max_steps=5)
    assert "delete all" not in env.executed
    assert guard.r3_events[0]["event"] == "restored" and guard.r3_events[0]["accepted"] == "menu"


def test_r3_disabled_ignores_the_trigger():
    gw = FakeGateway()
    env = Env("A", dict(R3_ENV))
    guard = guard_for(gw, dead_spot_policy(), r3=R3Config(enabled=False))
    guard.run(env.execute, env.shot(), max_steps=5)
    assert env.executed == ["go", "dead", "dead", "dead", "dead"]
    assert guard.events["r3_trigger"] == 0


# ---------------------------------------------------------------------------------------------
# ReTrace recovery


def recovery_setup(policy_answer, budget=3):
    gw = FakeGateway()
    # Inbox -> open mail (error: the wrong mail) -> the gateway proposes going back to step 1.
    env = Env(
        "start",
        {
            ("start", "inbox"): "inbox",
            ("inbox", "open"): "mail",
            ("mail", "back"): "inbox",
            ("mail", "wander"): "other",
        },
    )
    gw.recovery_at[2] = {
        "target_step": 1,
        "target_image_ref": ref_of("inbox"),
        "reason": "wrong mail opened",
        "brief": "Go back to the inbox list you saw at step 1.",
    }
    policy = Scripted(policy_answer)
    guard = guard_for(gw, policy, recovery=RecoveryLoopConfig(budget=budget))
    return gw, env, policy, guard


def test_recovery_reaches_the_target_screen():
    def answer(ctx):
        if ctx.mode == "recovery":
            return "back"
        return {0: "inbox", 1: "open"}.get(ctx.step_idx, "done")

    gw, env, policy, guard = recovery_setup(answer)
    guard.run(env.execute, env.shot(), max_steps=4)
    assert policy.contexts[2].mode == "recovery"
    assert policy.contexts[2].brief == "Go back to the inbox list you saw at step 1."
    assert "Recovery: Go back" in policy.contexts[2].prompt_addendum()
    assert guard.recoveries == [{"target_step": 1, "reached": True, "steps": 1}]
    assert policy.contexts[3].mode == "normal" and env.screen == "inbox"


def test_recovery_gives_up_after_its_budget():
    def answer(ctx):
        return "wander" if ctx.mode == "recovery" else {0: "inbox", 1: "open"}.get(ctx.step_idx)

    gw, env, policy, guard = recovery_setup(answer, budget=3)
    guard.run(env.execute, env.shot(), max_steps=6)
    assert guard.recoveries == [{"target_step": 1, "reached": False, "steps": 3}]
    assert [c.mode for c in policy.contexts[2:6]] == ["recovery"] * 3 + ["normal"]
    assert guard.events["recovery_failed"] == 1


def test_recovery_without_image_ref_compares_the_frames():
    def answer(ctx):
        if ctx.mode == "recovery":
            return "back"
        return {0: "inbox", 1: "open"}.get(ctx.step_idx, "done")

    gw, env, policy, guard = recovery_setup(answer)
    inner = gw.observe

    def no_ref(sid, sess, body):
        resp = inner(sid, sess, body)
        data = resp.json()
        data.pop("image_ref")
        return type(resp)(200, json=data)

    gw.observe = no_ref
    guard.run(env.execute, env.shot(), max_steps=4)
    assert guard.recoveries == [{"target_step": 1, "reached": True, "steps": 1}]


def test_recovery_disabled():
    gw, env, policy, guard = recovery_setup(lambda ctx: {0: "inbox", 1: "open"}.get(ctx.step_idx))
    guard.config = GuardConfig(recovery=RecoveryLoopConfig(enabled=False))
    guard.run(env.execute, env.shot(), max_steps=4)
    assert guard.recoveries == [] and all(c.mode == "normal" for c in policy.contexts)


def _real_screens() -> dict[str, bytes]:
    from PIL import Image, ImageDraw

    from hivig.vision import encode_png

    def draw(clock: str, dialog: bool) -> bytes:
        img = Image.new("RGB", (320, 200), (235, 235, 240))
        d = ImageDraw.Draw(img)
        d.rectangle((0, 0, 320, 18), fill=(40, 60, 120))
        for row in range(5):
            d.rectangle((20, 30 + row * 30, 300, 50 + row * 30), fill=(200, 200 + row * 10, 210))
        if dialog:
            d.rectangle((0, 20, 200, 200), fill=(30, 30, 30))
        d.text((280, 4), clock, fill=(255, 255, 255))  # the clock changes between visits
        return encode_png(img)

    return {
        "inbox": draw("10:01", False),
        "mail": draw("10:02", True),
        "inbox_later": draw("10:03", False),
    }


@pytest.mark.parametrize(("back_to", "reached"), [("inbox_later", True), ("mail", False)])
def test_recovery_arrival_ignores_a_clock_but_not_a_dialog(back_to, reached):
    screens = _real_screens()
    # The premise: the inbox's bytes differ between visits (the clock), so only the frames
    # themselves, judged by hivig.screens, can tell that the target screen is back.
    assert screens["inbox"] != screens["inbox_later"]
    gw = FakeGateway()
    state = {"screen": "inbox"}
    moves = {("inbox", "open"): "mail", ("mail", "back"): back_to}
    gw.recovery_at[1] = {
        "target_step": 0,
        "target_image_ref": "sha256:" + "0" * 64,  # the bytes differ anyway (the clock)
        "reason": "wrong mail",
        "brief": "Back to the inbox.",
    }

    def execute(proposal):
        state["screen"] = moves.get((state["screen"], proposal), state["screen"])
        return screens[state["screen"]]

    policy = Scripted(lambda ctx: "back" if ctx.mode == "recovery" else "open")
    guard = guard_for(gw, policy, recovery=RecoveryLoopConfig(budget=1))
    guard.run(execute, screens["inbox"], max_steps=3)
    assert guard.recoveries == [{"target_step": 0, "reached": reached, "steps": 1}]
