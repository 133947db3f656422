"""The runner side installs light: ``pip install "hivig[agent]"`` in a fresh venv gives numpy,
Pillow and httpx, and a guarded episode against a real gateway runs there without ever
importing torch, transformers or deepspeed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.gateway import LiveServer, ScriptedBackend, serve_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "deepspeed", "pyarrow", "accelerate", "fastapi")

# An OSWorld-shaped agent: first a click the critic rejects, then (told why) another one.
_EPISODE = """
import io, json, sys
from PIL import Image
import serve.adapters, serve.client, serve.guard
from serve.adapters import GuardedOSWorldAgent
from serve.client import CriticClient

class Agent:
    action_space = "pyautogui"
    def __init__(self):
        self.instructions = []
    def reset(self, _logger=None):
        pass
    def predict(self, instruction, obs):
        self.instructions.append(instruction)
        if "critic judged" in instruction:
            return "retry", ["pyautogui.click(960, 540)"]
        return "first", ["pyautogui.click(96, 54)"]

def shot(seed):
    buf = io.BytesIO()
    Image.new("RGB", (1920, 1080), (seed * 40, 90, 200)).save(buf, format="PNG")
    return buf.getvalue()

agent = Agent()
guarded = GuardedOSWorldAgent(agent, CriticClient(base_url=sys.argv[1]), screen=(1920, 1080))
guarded.reset()
executed = [guarded.predict("Open the menu", {"screenshot": shot(k)})[1] for k in range(2)]
from serve.guard import _frames_match  # the recovery arrival check compares screenshots
same = _frames_match(shot(1), shot(1), "ubuntu") and not _frames_match(shot(1), shot(5), "ubuntu")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({"executed": executed, "asked": len(agent.instructions), "heavy": heavy,
                  "frames_compare": same}))
""".replace("HEAVY", repr(HEAVY))


def test_runner_side_extra_runs_a_guarded_episode_without_the_training_stack(tmp_path):
    # Built from a copy: pip writes build/ and *.egg-info into the source folder.
    src = tmp_path / "src"
    for part in ("hivig", "data_gen", "train", "serve"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp_path / "agent-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", f"{src}[agent]"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if pip.returncode != 0 and "No matching distribution" in pip.stderr:
        pytest.skip(f"no package registry here: {pip.stderr.strip()[-300:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    listed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"hivig", "numpy", "pillow", "httpx"} <= installed
    assert not installed & {"torch", "transformers", "deepspeed", "pyarrow", "fastapi"}

    backend = ScriptedBackend(bad_if="[50, 50]")  # the first click, on the 0-1000 grid
    cfg = serve_config(tmp_path / "state", "frame.max_pixels=262144")
    from serve.app import create_app

    with LiveServer(create_app(cfg, backend)) as server:
        run = subprocess.run(
            [str(py), "-c", _EPISODE, server.url], capture_output=True, text=True, timeout=120,
            cwd=tmp_path,  # not the repository: only the installed package is importable
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert result["frames_compare"]  # fingerprints work without torch (they needed it before)
    # Each step: the first click rejected, the agent re-asked, its second proposal executed.
    assert result["executed"] == [["pyautogui.click(960, 540)"]] * 2
    assert result["asked"] == 4
    assert [kind for kind, _ in backend.calls].count("critique") >= 3
