"""The gateway in front of a remote model never imports torch: its frames are resized by the
numpy kernel, which gives torch's pixels bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hivig.vision import canonical_frame, resize_kernel

ROOT = Path(__file__).resolve().parents[3]

_EPISODE = textwrap.dedent(
    """
    import io, json, resource, sys, tempfile, pathlib
    from fastapi.testclient import TestClient
    from PIL import Image
    from serve.app import create_app
    from tests.fakes.gateway import CLICK, GOOD, SUMMARY, b64, serve_config, session_body
    from tests.fakes.openai_server import Reply, ScriptedServer, request_text

    def answer(body):
        return Reply(content=GOOD if "Current Proposed Step" in request_text(body) else SUMMARY)

    def shot(seed):
        img = Image.effect_noise((1920, 1080), 40 + seed).convert("RGB")
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return b64(buf.getvalue())

    with ScriptedServer(respond=answer) as server:
        cfg = serve_config(
            pathlib.Path(tempfile.mkdtemp()), "backend.kind=openai",
            f"backend.base_url={server.base_url}", "backend.model=m", "frame.max_pixels=1048576",
            "critic.observe_deadline_s=30", "critic.critique_deadline_s=30",
        )
        with TestClient(create_app(cfg)) as c:
            screen = {"w": 1920, "h": 1080}
            sid = c.post("/v1/sessions", json=session_body(screen=screen)).json()["session_id"]
            out = [c.post(f"/v1/sessions/{sid}/observe",
                          json={"step_idx": 0, "screenshot": shot(0)}).json()["status"]]
            out.append(c.post(f"/v1/sessions/{sid}/observe", json={
                "step_idx": 1, "screenshot": shot(1), "prev_action": CLICK}).json()["status"])
            body = {"step_idx": 1, "action": CLICK}
            out.append(c.post(f"/v1/sessions/{sid}/critique", json=body).json()["verdict"])
    heavy = [m for m in ("torch", "transformers", "deepspeed") if m in sys.modules]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps({"answers": out, "heavy": heavy, "rss_mb": rss}))
    """
)


def test_a_gateway_on_a_remote_backend_never_imports_torch(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", _EPISODE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["answers"] == ["ok", "ok", "good"]
    assert result["heavy"] == []


@pytest.mark.parametrize("size", [(1920, 1080), (1280, 800), (333, 2000), (200, 120)])
def test_both_kernels_give_the_same_frame(monkeypatch, size):
    rng = np.random.default_rng(size[0])
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    frames = {}
    for kernel in ("torch", "numpy"):
        monkeypatch.setenv("HIVIG_RESIZE_KERNEL", kernel)
        assert resize_kernel() == kernel
        frames[kernel] = np.asarray(canonical_frame(img, min_pixels=4096, max_pixels=262_144))
    assert np.array_equal(frames["torch"], frames["numpy"])


def test_auto_takes_torch_only_once_it_is_loaded(monkeypatch):
    monkeypatch.delenv("HIVIG_RESIZE_KERNEL", raising=False)
    import torch  # noqa: F401  (the test process has it)

    assert resize_kernel() == "torch"
    monkeypatch.delitem(sys.modules, "torch")
    assert resize_kernel() == "numpy"


def test_a_misspelt_kernel_fails_the_gateway_at_start(monkeypatch, tmp_path):
    from hivig.config import ConfigError
    from serve.app import create_app
    from tests.fakes.gateway import serve_config

    monkeypatch.setenv("HIVIG_RESIZE_KERNEL", "cuda")
    with pytest.raises(ConfigError, match="HIVIG_RESIZE_KERNEL"):
        create_app(serve_config(tmp_path))


def test_a_misspelt_kernel_is_one_line_and_exit_2_from_the_cli(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "serve", "--config", "configs/serve/vllm.yaml", "warmup=false",
         f"sessions.state_dir={tmp_path}", "backend.base_url=http://127.0.0.1:9/v1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
             "HIVIG_RESIZE_KERNEL": "cuda"},
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: HIVIG_RESIZE_KERNEL must be one of ('auto', 'torch', 'numpy'), got 'cuda'"
    ]


_CLIENT_HEAVY = ("pydantic", "pydantic_core", "fastapi", "starlette", "torch", "numpy", "PIL")


def test_the_runner_client_imports_no_pydantic_web_stack_torch_or_numpy(tmp_path):
    # What the ``agent`` extra installs: the client reads the gateway's answers without the
    # gateway's pydantic models, and shrinks a screenshot (PIL, numpy) only on a 413.
    code = (
        "import json, sys\n"
        "import serve.client, serve.client.aio, serve.client.sync\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {_CLIENT_HEAVY!r})))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
