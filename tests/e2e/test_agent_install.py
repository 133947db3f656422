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

ROOT = Path(__file__).resolve().parents[2]
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
from serve.guard import frames_match  # the recovery arrival check compares screenshots
same = frames_match(shot(1), shot(1), "ubuntu") and not frames_match(shot(1), shot(5), "ubuntu")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({"executed": executed, "asked": len(agent.instructions), "heavy": heavy,
                  "frames_compare": same}))
""".replace("HEAVY", repr(HEAVY))


def _source_copy(tmp_path: Path) -> Path:
    # Built from a copy: pip writes build/ and *.egg-info into the source folder.
    src = tmp_path / "src"
    for part in ("hivig", "data_gen", "train", "serve", "examples"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    return src


def _pip_install(py: Path, target: str) -> None:
    """``pip install target`` as the documented line has it (skipped without a registry)."""
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", target],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if pip.returncode != 0 and "No matching distribution" in pip.stderr:
        pytest.skip(f"no package registry here: {pip.stderr.strip()[-300:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]


def _agent_venv(tmp_path: Path, src: Path) -> Path:
    """A fresh venv holding ``pip install "hivig[agent]"`` only; returns its python."""
    venv = tmp_path / "agent-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    _pip_install(py, f"{src}[agent]")
    return py


def _installed(py: Path) -> set[str]:
    listed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True
    )
    return {p["name"].lower() for p in json.loads(listed.stdout)}


def test_runner_side_extra_runs_a_guarded_episode_without_the_training_stack(tmp_path):
    py = _agent_venv(tmp_path, _source_copy(tmp_path))
    installed = _installed(py)
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


# What a newcomer runs in that venv: each stage's console script (its stack is not there), and
# the runner examples' self-test, before and after the documented `gateway` extra.
_SCRIPTS = {
    "hivig-gen": (["make-sample", "--out", "corpus", "--trajectories", "2"], "data"),
    "hivig-train": (["--config", "train.yaml", "data=d", "out=o"], "train"),
    "hivig-serve": (["--config", "serve.yaml", "model=ckpt"], "gateway"),
}


def _one_line_exit_2(run: subprocess.CompletedProcess, extra: str) -> None:
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert f'pip install "hivig[{extra}]"' in line, line


def test_console_scripts_name_their_extra_and_the_selftests_pass_with_the_gateway_extra(tmp_path):
    src = _source_copy(tmp_path)
    py = _agent_venv(tmp_path, src)
    work = tmp_path / "work"  # not the repository: only the installed package is importable
    work.mkdir()
    for script, (args, extra) in _SCRIPTS.items():
        run = subprocess.run(
            [str(py.parent / script), *args], capture_output=True, text=True, timeout=120, cwd=work
        )  # fmt: skip
        _one_line_exit_2(run, extra)
    examples = sorted((src / "examples" / "runners").glob("[a-z]*.py"))
    assert len(examples) == 5, examples
    run = subprocess.run(
        [str(py), str(examples[0]), "--selftest"], capture_output=True, text=True, timeout=120,
        cwd=work,
    )  # fmt: skip
    _one_line_exit_2(run, "gateway")

    # The documented line for the self-test: the torch-free gateway beside the agent side.
    _pip_install(py, f"{src}[agent,gateway]")
    assert not _installed(py) & {"torch", "transformers", "deepspeed", "pyarrow"}
    for example in examples:
        run = subprocess.run(
            [str(py), str(example), "--selftest"], capture_output=True, text=True, timeout=300,
            cwd=work,
        )  # fmt: skip
        assert run.returncode == 0, f"{example.name}: {run.stderr[-3000:]}"
        summary = json.loads(run.stdout.strip().splitlines()[-1])
        assert summary["rejected"] >= 1 and summary["executed"], (example.name, summary)
