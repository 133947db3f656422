"""Train = serve, proven end to end (slow tier).

A tiny random-weight Qwen3-VL is trained on the history and critique records of one generated
trajectory until it reproduces every target token, then served by ``python -m serve`` (the
in-process transformers backend, greedy) over real HTTP. A runner-style replay of the trajectory
must get back, for every model call, exactly what the records say: the history updates (whose
text the next update reads), the verdicts, the error dimensions, the explanations and the
reasoning. The model only reproduces a memorised target from the prompt it was trained on, so a
drift in prompt text, markers, frames, chat template or parsing fails here; the gateway's trace
adds a direct comparison of the served prompt's texts and marks with the records'.

``tests/_memorise.py`` holds the pieces, for a tier that serves the same checkpoint through vLLM.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests._memorise import (
    Memorised,
    gateway,
    replay,
    report,
    shared_memorised,
    shared_reference_profile,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOKEN = "memorise-test-token"


@pytest.fixture(scope="session", params=["hivig-v1", "reference"])
def memorised(request, tmp_path_factory) -> Memorised:
    """Both interfaces: hivig's own, and the released critic's shape (the profile imported from
    the reference-shaped fixture repository: images inline, LlamaFactory's frames, markers on
    the original screenshot, the model's own summary fed back)."""
    if request.param == "hivig-v1":
        return shared_memorised(tmp_path_factory)
    return shared_memorised(tmp_path_factory, str(shared_reference_profile(tmp_path_factory)))


def test_the_records_are_one_replayable_trajectory(memorised):
    records = memorised.records
    assert {r.trajectory_id for r in records} == {memorised.trajectory.id}
    assert [r.step_index for r in memorised.history] == list(range(memorised.k))
    assert not any(r.labels.intent_masked for r in memorised.history)
    verdicts = {c.verdict for c in memorised.cases}
    assert verdicts == {"good", "bad"}
    assert all(c.dimension for c in memorised.cases if c.verdict == "bad")
    assert all(c.step <= memorised.k for c in memorised.cases)


def test_training_memorised_every_target_token(memorised):
    t = memorised.train
    assert t.wrong_tokens == 0, report(memorised, [])
    assert t.min_margin > 0, report(memorised, [])


def test_the_gateway_answers_what_the_records_say(memorised, tmp_path):
    start = time.perf_counter()
    with gateway(memorised, tmp_path / "gateway", token=TOKEN) as gw:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        info = httpx.get(f"{gw.url}/v1/info", headers=auth, timeout=30).json()
        f = memorised.frame
        frame = {"min_pixels": f.min_pixels, "max_pixels": f.max_pixels, "factor": f.factor}
        assert info["frame"] == frame and info["backend"] == "transformers", info
        if memorised.profile:
            from hivig.profiles import load_profile

            assert info["profile"]["digest"] == load_profile(memorised.profile).digest
        assert httpx.get(f"{gw.url}/v1/info", timeout=30).status_code == 401
        replay_start = time.perf_counter()
        outcomes = replay(gw.url, memorised, TOKEN, traces=gw.traces)
        replay_s = time.perf_counter() - replay_start
    calls = [(o.kind, o.step) for o in outcomes]
    expected_calls = sorted(
        [("history", i) for i in range(1, memorised.k + 1)]
        + [("critique", c.step) for c in memorised.cases],
        key=lambda call: (call[1], call[0] == "critique"),
    )
    assert calls == expected_calls
    account = report(memorised, outcomes)
    print(
        f"\n{account}\ngateway ready in {gw.started_s} s, replay {replay_s:.1f} s, "
        f"served in all {time.perf_counter() - start:.1f} s"
    )
    # The labels first (what a runner acts on), then the whole text and the prompt.
    for o in outcomes:
        assert o.labels_ok, account
    for o in outcomes:
        assert o.prompt_drift is None, account
    assert all(o.ok for o in outcomes), account
