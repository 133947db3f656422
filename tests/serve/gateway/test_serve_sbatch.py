"""The train -> serve handoff: a checkpoint ``train/`` wrote, read by both transformers lines,
and ``slurm/serve.sbatch`` run with stub ``vllm``/``curl`` up to ``vllm serve`` and the gateway."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hivig.checkpoint_files import (
    CheckpointError,
    read_context_length,
    read_frame,
    write_reader_compat,
)
from tests._sample_run import tiny_final_checkpoint

ROOT = Path(__file__).resolve().parents[3]
SBATCH = ROOT / "slurm" / "serve.sbatch"
MIN_PX, MAX_PX = 3136, 40_000  # not the defaults, so a default could not pass for the frame

_VLLM = """#!/bin/bash
printf '%s\\n' "$@" > "$STUB_DIR/vllm.args"
exec sleep 60
"""
_CURL = "#!/bin/bash\nexit 0\n"


@pytest.fixture(scope="module")
def final_ckpt(tmp_path_factory) -> Path:
    """The final checkpoint of a one-step tiny run, as ``python -m train`` writes it."""
    root = tmp_path_factory.mktemp("handoff")
    return tiny_final_checkpoint(root, MIN_PX, MAX_PX)


def test_final_checkpoint_carries_both_processor_layouts(final_ckpt):
    nested = json.loads((final_ckpt / "processor_config.json").read_text())
    flat = json.loads((final_ckpt / "preprocessor_config.json").read_text())
    assert nested["image_processor"]["size"] == flat["size"]
    assert flat["size"] == {"shortest_edge": MIN_PX, "longest_edge": MAX_PX}
    tokenizer = json.loads((final_ckpt / "tokenizer_config.json").read_text())
    assert "extra_special_tokens" not in tokenizer
    assert "<|vision_start|>" in tokenizer["additional_special_tokens"]
    text = json.loads((final_ckpt / "config.json").read_text())["text_config"]
    assert text["rope_scaling"]["mrope_section"] == text["rope_parameters"]["mrope_section"]
    assert read_frame(final_ckpt) == (MIN_PX, MAX_PX)


def test_transformers_5_reads_the_compat_files_as_its_own(final_ckpt, tmp_path):
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(final_ckpt)
    assert processor.image_processor.size["longest_edge"] == MAX_PX
    assert "<|vision_start|>" in processor.tokenizer.all_special_tokens
    config = AutoConfig.from_pretrained(final_ckpt)
    saved = json.loads((final_ckpt / "config.json").read_text())["text_config"]
    assert (
        config.text_config.rope_parameters["mrope_section"]
        == saved["rope_parameters"]["mrope_section"]
    )
    # Idempotent: a second pass changes no byte.
    before = {p.name: p.read_bytes() for p in final_ckpt.iterdir() if p.suffix == ".json"}
    write_reader_compat(final_ckpt)
    assert before == {p.name: p.read_bytes() for p in final_ckpt.iterdir() if p.suffix == ".json"}


def test_read_frame_falls_back_to_the_flat_file_and_compat_follows_the_nested_one(tmp_path):
    (tmp_path / "processor_config.json").write_text('{"processor_class": "Qwen3VLProcessor"}')
    flat = {"size": {"shortest_edge": 1024, "longest_edge": 4096}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(flat))
    assert read_frame(tmp_path) == (1024, 4096)
    # A stale flat file from an earlier save is replaced by the nested processor's values.
    nested = {"image_processor": {"size": {"shortest_edge": 3136, "longest_edge": 9999}}}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    write_reader_compat(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["size"] == nested["image_processor"]["size"]
    assert read_frame(tmp_path) == (3136, 9999)


def test_read_frame_names_the_missing_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no processor_config.json or preprocessor"):
        read_frame(tmp_path)
    (tmp_path / "processor_config.json").write_text('{"processor_class": "Qwen3VLProcessor"}')
    with pytest.raises(CheckpointError, match="has no image_processor"):
        read_frame(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text('{"size": {"shortest_edge": "x"}}')
    with pytest.raises(CheckpointError, match="positive pixel counts"):
        read_frame(tmp_path)


def test_read_context_length_is_the_models_limit_capped(tmp_path):
    (tmp_path / "config.json").write_text('{"text_config": {"max_position_embeddings": 262144}}')
    assert read_context_length(tmp_path) == 16_384
    assert read_context_length(tmp_path, cap=300_000) == 262_144
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert read_context_length(tmp_path) == 2048
    (tmp_path / "config.json").write_text('{"text_config": {}}')
    with pytest.raises(CheckpointError, match="max_position_embeddings"):
        read_context_length(tmp_path)
    with pytest.raises(CheckpointError, match="no config.json"):
        read_context_length(tmp_path / "missing")


def _job_env(tmp_path: Path, ckpt: Path, **extra: str) -> dict[str, str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in (("vllm", _VLLM), ("curl", _CURL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod((stubs / name).stat().st_mode | stat.S_IEXEC)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python_dir = Path(sys.executable).parent
    (venv / "bin" / "activate").write_text(f'export PATH="{stubs}:{python_dir}:$PATH"\n')
    return {
        **os.environ,
        "HIVIG_REPO": str(ROOT),
        "HIVIG_VENV": str(venv),
        "CKPT": str(ckpt),
        "STATE_DIR": str(tmp_path / "state"),
        "STUB_DIR": str(stubs),
        "HIVIG_SERVE_TOKEN": "t",
        **extra,
    }


def _job(tmp_path: Path, ckpt: Path, *gateway_args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SBATCH), *gateway_args],
        env=_job_env(tmp_path, ckpt),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_sbatch_starts_vllm_and_the_gateway_on_the_checkpoint_frame(final_ckpt, tmp_path):
    port = _free_port()
    env = _job_env(tmp_path, final_ckpt, GATEWAY_PORT=str(port))
    # The gateway binds 0.0.0.0 in the job; its warm-up against the stub vLLM fails, which only
    # keeps /readyz unready. /v1/info reports the frame it serves with.
    job = subprocess.Popen(
        ["bash", str(SBATCH), "warmup=false"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline, info = time.monotonic() + 90, None
        while info is None:
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            try:
                reply = httpx.get(
                    f"http://127.0.0.1:{port}/v1/info", headers={"Authorization": "Bearer t"}
                )
                info = reply.json() if reply.status_code == 200 else None
            except httpx.TransportError:
                time.sleep(0.2)
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.communicate(timeout=30)
    assert info["frame"]["min_pixels"] == MIN_PX and info["frame"]["max_pixels"] == MAX_PX
    assert info["backend"] == "openai"
    args = (tmp_path / "stubs" / "vllm.args").read_text().splitlines()
    assert args[:2] == ["serve", str(final_ckpt)]
    kwargs = json.loads(args[args.index("--mm-processor-kwargs") + 1])
    assert kwargs == {"size": {"shortest_edge": MIN_PX, "longest_edge": MAX_PX}}
    assert args[args.index("--chat-template") + 1] == str(final_ckpt / "chat_template.jinja")
    # The checkpoint's own context limit (the tiny model allows 4,096), never a hard-coded one
    # that vLLM would refuse at start.
    assert args[args.index("--max-model-len") + 1] == "4096"
    # The checkpoint's own profile is served: its chat template, and the gateway checks it.
    assert info["profile"]["name"] == "hivig-v1"


def test_serve_sbatch_refuses_a_checkpoint_without_a_frame(final_ckpt, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_bytes((final_ckpt / "config.json").read_bytes())
    job = _job(tmp_path, bare)
    assert job.returncode == 2
    assert "no processor_config.json or preprocessor_config.json" in job.stderr
    assert not (tmp_path / "stubs" / "vllm.args").exists()  # vLLM never started


def test_gateway_refuses_a_local_checkpoint_without_a_frame(final_ckpt, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_bytes((final_ckpt / "config.json").read_bytes())
    run = subprocess.run(
        [sys.executable, "-m", "serve", "--config", "configs/serve/local.yaml", f"model={bare}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HIVIG_STATE": str(tmp_path)},
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "trained with" in run.stderr


_LOAD = """
import json, sys, torch, transformers
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
path = sys.argv[1]
text = AutoConfig.from_pretrained(path).text_config
processor = AutoProcessor.from_pretrained(path)
model = AutoModelForImageTextToText.from_pretrained(path).eval()
ids = processor.tokenizer("<|im_start|>user hi<|vision_start|><|im_end|>")["input_ids"]
with torch.no_grad():
    logits = model(input_ids=torch.tensor([ids])).logits.double()
print(json.dumps({
    "version": transformers.__version__, "ids": ids, "logit_sum": float(logits.sum()),
    "mrope": (getattr(text, "rope_scaling", None) or text.rope_parameters)["mrope_section"],
    "size": dict(processor.image_processor.size),
}))
"""


def _load(env: dict[str, str], ckpt: Path) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", _LOAD, str(ckpt)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_transformers_4_57_loads_the_checkpoint_to_the_same_logits(final_ckpt, tmp_path):
    """What vLLM < 0.19.1 runs on: transformers 4.57 (and its hub and tokenizers pins)."""
    site = tmp_path / "tf457"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         "transformers==4.57.6", "huggingface-hub==0.36.2", "tokenizers==0.22.2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if pip.returncode != 0:
        pytest.skip(f"transformers 4.57 not installable here: {pip.stderr.strip()[-300:]}")
    new = _load(dict(os.environ), final_ckpt)
    old = _load({**os.environ, "PYTHONPATH": str(site)}, final_ckpt)
    assert old["version"].startswith("4.57") and new["version"].startswith("5.")
    assert old["ids"] == new["ids"] and old["mrope"] == new["mrope"]
    assert old["size"] == new["size"] == {"shortest_edge": MIN_PX, "longest_edge": MAX_PX}
    assert old["logit_sum"] == pytest.approx(new["logit_sum"], rel=1e-6)


def test_a_corrupt_processor_file_is_one_line_and_exit_2_everywhere(final_ckpt, tmp_path):
    """Provoked: a half-written processor_config.json (a killed save) in a checkpoint folder."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_bytes((final_ckpt / "config.json").read_bytes())
    (broken / "processor_config.json").write_text('{"image_processor": {"si')
    with pytest.raises(CheckpointError, match="not readable JSON"):
        read_frame(broken)
    cli = subprocess.run(
        [sys.executable, "-m", "hivig.cli", "checkpoint", "frame", str(broken)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "not readable JSON" in cli.stderr
    gateway = subprocess.run(
        [sys.executable, "-m", "serve", "--config", "configs/serve/local.yaml", f"model={broken}",
         f"sessions.state_dir={tmp_path / 'state'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert gateway.returncode == 2 and gateway.stderr.count("\n") == 1
    job = _job(tmp_path, broken)
    assert job.returncode == 2 and "not readable JSON" in job.stderr
    assert not (tmp_path / "stubs" / "vllm.args").exists()


# ---------------------------------------------------------------------------------------------
# The checkpoint records the profile it was trained with; serving it with another is refused


def _other_profile(tmp_path: Path) -> Path:
    from hivig.profiles import default_profile

    folder = default_profile().write(tmp_path / "other")
    (folder / "initial_summary.txt").write_text("A different opening summary.")
    return folder


def test_the_checkpoint_records_its_profile(final_ckpt):
    from hivig.profiles import checkpoint_profile, default_profile

    recorded = checkpoint_profile(final_ckpt)
    assert recorded is not None and recorded.digest == default_profile().digest


def test_a_checkpoint_served_with_another_profile_is_one_line_and_exit_2(final_ckpt, tmp_path):
    other = _other_profile(tmp_path)
    check = subprocess.run(
        [sys.executable, "-m", "hivig.cli", "profile", "check", "--checkpoint",
         str(final_ckpt), "--profile", str(other)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 2 and check.stderr.count("\n") == 1
    assert "was trained with profile hivig-v1" in check.stderr
    assert "critic.allow_profile_mismatch=true" in check.stderr
    same = subprocess.run(
        [sys.executable, "-m", "hivig.cli", "profile", "check", "--checkpoint",
         str(final_ckpt)], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert same.returncode == 0, same.stderr
    # The gateway itself refuses too (in-process backend), unless told to on purpose.
    serve = [sys.executable, "-m", "serve", "--config", "configs/serve/local.yaml",
             f"model={final_ckpt}", f"critic.profile={other}",
             f"sessions.state_dir={tmp_path / 's'}"]  # fmt: skip
    run = subprocess.run(serve, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "was trained with profile" in run.stderr
    # A remote backend names the checkpoint it serves (serve.sbatch does) and is checked too.
    remote = [sys.executable, "-m", "serve", "--config", "configs/serve/vllm.yaml", "model=c",
              "backend.base_url=http://127.0.0.1:9/v1", f"critic.checkpoint={final_ckpt}",
              f"critic.profile={other}", f"sessions.state_dir={tmp_path / 's'}"]  # fmt: skip
    run = subprocess.run(remote, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "was trained with profile" in run.stderr, run.stderr


def test_serve_sbatch_refuses_a_profile_the_checkpoint_was_not_trained_with(final_ckpt, tmp_path):
    env = _job_env(tmp_path, final_ckpt, PROFILE=str(_other_profile(tmp_path)))
    job = subprocess.run(
        ["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=120
    )
    assert job.returncode == 2, job.stderr
    assert "was trained with profile" in job.stderr
    assert not (tmp_path / "stubs" / "vllm.args").exists()  # vLLM never started
