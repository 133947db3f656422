"""The whole loop on real screens: headless Chromium, the gateway over HTTP, ``CriticGuard``.

The disabled *Publish* button clicked twice is a no-effect repeat: the gateway's recurrence
detector fires on the real screenshots and the guard reroutes (R3) to an action that changes the
screen. The slow panel's spinner, watched with wait actions, is not taken for a loop.
"""

from __future__ import annotations

import pytest

from serve.app import create_app
from serve.client import ClientConfig, CriticClient
from serve.demo.episode import ScriptedPolicy, env_action
from serve.guard import CriticGuard, GuardConfig
from serve.webenv import BrowserEnv, find_browser
from tests.fakes.gateway import LiveServer, ScriptedBackend, serve_config

pytestmark = pytest.mark.skipif(
    find_browser() is None, reason="no Chromium executable (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def env():
    with BrowserEnv() as e:
        yield e


@pytest.fixture()
def gateway(tmp_path):
    with LiveServer(create_app(serve_config(tmp_path / "state"), ScriptedBackend())) as srv:
        client = CriticClient(config=ClientConfig(base_url=srv.url))
        yield client
        client.close()


def _guard(client, env, policy, task):
    return CriticGuard(
        client,
        policy,
        task=task,
        platform="web",
        screen=(env.width, env.height),
        coord_space="norm1000",
        config=GuardConfig(),
        session_kwargs={"volatile_regions": env.volatile_regions()},
    )


def _run(guard, policy, env, obs, steps):
    executed = []

    def execute(proposal):
        policy.executed(proposal)
        executed.append(proposal)
        if proposal["type"] == "terminate":
            return None
        return env.step(env_action(proposal))[0]["screenshot"]

    guard.run(execute, obs["screenshot"], steps)
    return executed


def test_disabled_button_twice_triggers_r3_and_reroute_changes_the_screen(env, gateway):
    obs = env.reset("dark_mode")

    publish = {"click": "#publish-btn", "intent": "Click Publish"}
    settings = {"click": "#settings-btn", "intent": "Open the settings"}
    plan = [
        publish,
        dict(publish),
        dict(publish),
        settings,
        {"type": "terminate", "status": "success"},
    ]
    policy = ScriptedPolicy(plan, reroute_to=3, env=env)
    guard = _guard(gateway, env, policy, "Turn on dark mode in the settings.")
    executed = _run(guard, policy, env, obs, 6)
    guard.close()

    triggers = [r for r in guard.log if (r.get("r3") or {}).get("event") == "trigger"]
    assert triggers, guard.log
    assert "reroute" in policy.calls
    restored = [e for e in guard.r3_events if e.get("event") == "restored"]
    assert restored and restored[0]["accepted"]
    # The reroute executed the Settings click, and the dialog really opened in the browser.
    intents = [p.get("intent") for p in executed]
    assert "Open the settings" in intents
    assert env.page.evaluate("document.getElementById('settings-dialog').open") is True
    # Only two or three Publish clicks ran before the reroute (k=2 no-effect repeats).
    assert intents.index("Open the settings") <= 3


def test_the_spinner_of_a_slow_panel_is_not_a_loop(env, gateway):
    obs = env.reset("q3_revenue")  # starts on the reports page, the spinner up
    session = gateway.start(
        "What was the Q3 revenue in the report?",
        "web",
        (env.width, env.height),
        "norm1000",
        volatile_regions=env.volatile_regions(),
    )
    wait = {"type": "wait", "time": 0.5}
    seen, shot = [], obs["screenshot"]
    for k in range(6):  # three seconds of waiting: the spinner, then the table
        o = session.observe(k, shot, None if k == 0 else wait)
        assert o.ok, o
        seen.append(o.body.get("recurrence") or {})
        shot = env.step(env_action(wait))[0]["screenshot"]
    session.close()
    assert not any(r.get("r3_trigger") for r in seen), seen
    assert not any(r.get("cycle_len") for r in seen), seen
    assert all(r.get("same_key_no_effect_run", 0) == 0 for r in seen), seen
    assert env.page.evaluate("!document.getElementById('report-content').hidden")
