"""A real vLLM in the loop: train -> vLLM -> gateway -> client, no stand-in anywhere (slow tier).

The tiny critic that memorised one trajectory (``tests/_memorise.py``) is served the way a GPU node
serves a critic: ``slurm/serve.sbatch`` starts vLLM (the CPU build of ``make vllm-venv``, through
its ``vllm serve`` wrapper) and the gateway in front of it, reading the checkpoint's frame, context
length and profile. The replay of the trajectory must get the memorised verdicts, dimensions and
history updates back, for hivig's own profile and for a profile imported from the reference-shaped
fixture repository; a ``CriticGuard`` episode must reject the memorised Bad proposal and run the
re-proposal; vLLM's own ``/metrics`` must show prefix-cache hits.

``make test-all`` sets ``HIVIG_VLLM_PYTHON``; without it these tests skip here and fail under CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests._memorise import (
    Memorised,
    free_port,
    gateway_settings,
    replay,
    report,
    shared_memorised,
    shared_reference_profile,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("HIVIG_VLLM_PYTHON", "")
TOKEN = "vllm-tier-token"
SERVED = "hivig-critic"


def _vllm_bin() -> Path:
    if not VLLM_PYTHON or not Path(VLLM_PYTHON).is_file():
        message = "needs HIVIG_VLLM_PYTHON (make test-all builds .venv-vllm and sets it)"
        if os.environ.get("CI"):
            pytest.fail(f"the real-vLLM tier never skips in CI: {message}")
        pytest.skip(message)
    return Path(VLLM_PYTHON).parent / "vllm"


@dataclass
class Stack:
    """vLLM and the gateway started by ``serve.sbatch``."""

    gateway: str
    vllm: str
    state_dir: Path
    log: Path
    ready_s: float


@contextlib.contextmanager
def sbatch_stack(memorised: Memorised, root: Path, profile: Path | None) -> Iterator[Stack]:
    """``bash slurm/serve.sbatch`` on the memorised checkpoint, until ``/readyz`` says ready."""
    vllm = _vllm_bin()
    root.mkdir(parents=True, exist_ok=True)
    vllm_port, gateway_port = free_port(), free_port()
    state = root / "state"
    env = {
        **os.environ,
        "HIVIG_REPO": str(REPO),
        "HIVIG_VENV": str(REPO / ".venv"),
        "CKPT": str(memorised.checkpoint),
        "VLLM": str(vllm),
        # float32 as the checkpoint was trained and checked (the CPU build downcasts otherwise);
        # one GiB of KV cache, not most of the machine.
        "VLLM_ARGS": "--dtype float32",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_PORT": str(vllm_port),
        "GATEWAY_PORT": str(gateway_port),
        "STATE_DIR": str(state),
        "HIVIG_SERVE_TOKEN": TOKEN,
        "HF_HUB_OFFLINE": "1",
    }
    if profile is not None:
        env["PROFILE"] = str(profile)
    # The job's own settings first; these (later on the command line) win: loopback only, and
    # the memorised run's budget and greedy decoding (tests/_memorise.py).
    keep = ("backend.", "critic.", "warmup", "log_level")
    settings = [s for s in gateway_settings(memorised, state, gateway_port) if s.startswith(keep)]
    settings = [s for s in settings if not s.startswith("critic.profile=")]  # PROFILE does it
    log = root / "job.log"
    start = time.perf_counter()
    with log.open("wb") as out:
        job = subprocess.Popen(
            ["bash", str(REPO / "slurm" / "serve.sbatch"), "host=127.0.0.1", *settings],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        _wait_ready(job, url, log, timeout_s=900)
        ready_s = round(time.perf_counter() - start, 1)
        yield Stack(url, f"http://127.0.0.1:{vllm_port}", state, log, ready_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)


def _wait_ready(job: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {TOKEN}"}
    while time.monotonic() < deadline:
        if job.poll() is not None:
            raise AssertionError(f"serve.sbatch exited ({job.returncode}):\n{_tail(log)}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", headers=headers, timeout=5).status_code == 200:
                return
        time.sleep(2)
    raise AssertionError(f"not ready after {timeout_s:.0f} s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def assert_memorised(memorised: Memorised, outcomes: list) -> str:
    """Every call came back as memorised: the labels first (what a runner acts on), then the
    served prompt, then the whole text. Returns the account."""
    account = report(memorised, outcomes)
    for o in outcomes:
        assert o.labels_ok, account
    for o in outcomes:
        assert o.prompt_drift is None, account
    assert all(o.ok for o in outcomes), account
    return account


def vllm_counters(stack: Stack) -> dict[str, float]:
    """vLLM's own counters from its ``/metrics`` (summed over label sets)."""
    text = httpx.get(f"{stack.vllm}/metrics", timeout=30).text
    names = (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
    )
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


# ---------------------------------------------------------------------------------------------
# hivig's own profile


@pytest.fixture(scope="module")
def memorised(tmp_path_factory) -> Memorised:
    _vllm_bin()  # before minutes of training
    return shared_memorised(tmp_path_factory)


@pytest.fixture(scope="module")
def stack(memorised, tmp_path_factory) -> Iterator[Stack]:
    with sbatch_stack(memorised, tmp_path_factory.mktemp("vllm_default"), None) as s:
        yield s


def test_serve_sbatch_brings_real_vllm_and_the_gateway_to_ready(stack, memorised):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    info = httpx.get(f"{stack.gateway}/v1/info", headers=auth, timeout=30).json()
    assert info["backend"] == "openai" and info["profile"]["name"] == "hivig-v1"
    f = memorised.frame
    assert (info["frame"]["min_pixels"], info["frame"]["max_pixels"]) == (
        f.min_pixels,
        f.max_pixels,
    )
    models = httpx.get(f"{stack.vllm}/v1/models", timeout=30).json()
    (served,) = models["data"]
    assert served["id"] == SERVED and served["max_model_len"] == 4096  # the checkpoint's limit
    print(f"\nserve.sbatch ready (vLLM start, gateway warm-up through it) in {stack.ready_s} s")


def test_the_memorised_verdicts_come_back_through_vllm(stack, memorised):
    before = vllm_counters(stack)
    outcomes = replay(stack.gateway, memorised, TOKEN, traces=stack.state_dir / "traces")
    after = vllm_counters(stack)
    print(f"\n{assert_memorised(memorised, outcomes)}")
    delta = {k: after[k] - before[k] for k in after}
    steps = memorised.k + 1
    figures = {
        "agent_steps": steps,
        "vllm_requests": delta["vllm:request_success_total"],
        "requests_per_agent_step": round(delta["vllm:request_success_total"] / steps, 2),
        "prefix_cache_queries": delta["vllm:prefix_cache_queries_total"],
        "prefix_cache_hits": delta["vllm:prefix_cache_hits_total"],
        "prefix_cache_hit_rate": round(
            delta["vllm:prefix_cache_hits_total"]
            / max(1.0, delta["vllm:prefix_cache_queries_total"]),
            3,
        ),
    }
    print("vLLM figures over the replay:", json.dumps(figures))
    # One history update per observed step after the first, one verdict per memorised proposal.
    assert delta["vllm:request_success_total"] == len(outcomes)
    # The system prompt and the screenshots of the step before are shared prefixes.
    assert delta["vllm:prefix_cache_hits_total"] > 0


def test_a_guarded_episode_through_vllm_rejects_the_bad_and_runs_the_reproposal(stack, memorised):
    from hivig.actions import render_tool_calls, space_for_platform
    from serve.client import CriticClient
    from serve.guard import CriticGuard, GuardConfig

    traj = memorised.trajectory
    space = space_for_platform(traj.platform)
    bad = next(c for c in memorised.cases if c.verdict == "bad")

    def true_step(i: int) -> dict:
        step = traj.steps[i]
        action = {"raw": render_tool_calls(list(step.actions), space), "format": "qwen"}
        return {**action, "intent": step.intent} if step.intent else action

    def policy(ctx):
        if ctx.step_idx == bad.step and not ctx.feedback:
            proposal = {"raw": bad.calls, "format": "qwen"}
            return {**proposal, "intent": bad.intent} if bad.intent is not None else proposal
        return true_step(ctx.step_idx)

    client = CriticClient(stack.gateway, token=TOKEN)
    guard = CriticGuard(
        client, policy, task=traj.task, platform=traj.platform,
        screen=(traj.screen_w, traj.screen_h), coord_space="norm1000",
        config=GuardConfig(max_reproposals=1), to_action=lambda p: p,
        describe=lambda p: p.get("intent") or p["raw"],
    )  # fmt: skip
    decisions = []
    try:
        for i in range(bad.step + 1):
            shot = (memorised.image_root / traj.steps[i].screenshot).read_bytes()
            decisions.append(guard.step(shot))
    finally:
        guard.close()
        client.close()
    last = decisions[-1]
    first, second = last.record["proposals"][:2]
    # The memorised Bad was judged Bad with its dimension, the policy was asked again with the
    # critic's feedback, and the re-proposal (the trajectory's own step) is what runs.
    assert first["verdict"]["verdict"] == "bad", last.record
    assert first["verdict"]["error_dimension"] == bad.dimension, last.record
    assert last.record.get("feedback"), last.record
    assert second["action"] == true_step(bad.step)
    assert last.proposal == true_step(bad.step) and not last.stop
    assert len(decisions) == bad.step + 1


# ---------------------------------------------------------------------------------------------
# A profile imported from the reference-shaped fixture repository (the released critic's shape:
# images inline, LlamaFactory's frames, markers on the original, its summaries fed back)


@pytest.fixture(scope="module")
def reference_profile(tmp_path_factory) -> Path:
    return shared_reference_profile(tmp_path_factory)


@pytest.fixture(scope="module")
def memorised_reference(reference_profile, tmp_path_factory) -> Memorised:
    _vllm_bin()
    return shared_memorised(tmp_path_factory, str(reference_profile))


def test_the_reference_profiles_memorised_verdicts_come_back_through_vllm(
    memorised_reference, reference_profile, tmp_path
):
    from hivig.profiles import checkpoint_profile, load_profile

    recorded = checkpoint_profile(memorised_reference.checkpoint)
    assert recorded is not None and recorded.digest == load_profile(reference_profile).digest
    assert recorded.frame.geometry == "llamafactory" and recorded.frame.markers == "original"
    with sbatch_stack(memorised_reference, tmp_path, reference_profile) as stack:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        info = httpx.get(f"{stack.gateway}/v1/info", headers=auth, timeout=30).json()
        assert info["profile"]["digest"] == recorded.digest
        outcomes = replay(
            stack.gateway, memorised_reference, TOKEN, traces=stack.state_dir / "traces"
        )
    print(f"\n{assert_memorised(memorised_reference, outcomes)}\nready in {stack.ready_s} s")
