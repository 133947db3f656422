"""The SFT recipe end to end on the tiny model: CLI, freezing, checkpoints, resume, LoRA."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hivig.config import ConfigError, load_config
from hivig.tiny import save_tiny_checkpoint, tiny_model, tiny_processor
from train.config import TrainConfig
from train.sft import setup, train
from train.signals import PreemptionFlag
from train.synthetic import write_dataset

ROOT = Path(__file__).resolve().parents[2]
TINY_YAML = ROOT / "configs" / "train" / "tiny_cpu.yaml"
GOLDEN_LOSSES = [11.916653, 11.749214]  # real Qwen vocabulary: ln(151669) ≈ 11.93 at init


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    return write_dataset(out, n_train=12, n_val=2, sizes=((64, 64), (96, 64)), words=(2, 12))


def _cfg(data: Path, out: Path, *overrides: str) -> TrainConfig:
    base = [
        f"data={data}",
        f"out={out}",
        "dataset.token_budget=1024",
        "optim.global_batch_samples=4",
    ]
    return load_config(TrainConfig, TINY_YAML, [*base, *overrides])


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_dry_run_prints_the_resolved_config(data_dir, tmp_path, capsys):
    from train.cli import main

    assert main(["--config", str(TINY_YAML), f"data={data_dir}", "optim.lr=0.5", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "lr: 0.5" in printed and str(data_dir) in printed
    assert main(["--config", str(TINY_YAML), "optim.warmup_ratio=2", "--dry-run"]) == 2
    # `python -m train.sft` is the documented second entry point.
    cmd = [sys.executable, "-m", "train.sft", "--config", str(TINY_YAML), "--dry-run", "out=X"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "out: X" in proc.stdout


@pytest.mark.slow
def test_trains_freezes_and_writes_a_loadable_hf_checkpoint(data_dir, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "run"
    # One worker process: the encoder and processor must survive pickling into it.
    c = setup(_cfg(data_dir, out, "loop.max_steps=2", "dataset.num_workers=1"))
    initial = _state(tiny_model(tiny_processor(), seed=0))
    result = train(c)
    assert result.state.step == 2 and len(result.losses) == 2
    assert all(torch.isfinite(torch.tensor(result.losses)))
    # Golden per-step losses (fp32, fixed seeds). A change here means the model, data, template
    # or loss changed: re-pin only after checking why.
    assert result.losses == pytest.approx(GOLDEN_LOSSES, abs=1e-4)
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("lr", "grad_norm", "tokens_per_s_per_device", "mfu", "dataloader_wait_frac"):
        assert key in rows[0]
    # The LR each step was taken with (2 steps, no warmup: cosine factor 1, then 0.55).
    assert [r["lr"] for r in rows] == pytest.approx([1e-3, 0.55e-3])
    # No peak FLOP/s on CPU: MFU is unavailable, not a made-up number.
    assert rows[0]["mfu"] is None and rows[0]["mfu_non_causal"] is None
    # Every trainable parameter changed; every frozen one (ViT, DeepStack) did not.
    trained = {k: p for k, p in c.model.model.named_parameters()}
    changed = {k for k, p in trained.items() if not torch.equal(p.detach(), initial[k])}
    trainable = {k for k, p in trained.items() if p.requires_grad}
    assert trainable and changed == trainable
    assert any(".deepstack_merger_list." in k for k in trained if k not in trainable)
    assert any(".visual.blocks." in k for k in trained if k not in trainable)
    # Resumable checkpoint and the HF export.
    ckpt = out / "checkpoints" / "step_000002"
    for name in ("state.pt", "scheduler.pt", "rng_0.pt", "trainer_state.json", "config.yaml"):
        assert (ckpt / name).is_file(), name
    final = out / "final"
    # Trained without the cache, shipped with it: inference needs the KV cache.
    config = json.loads((final / "config.json").read_text())
    assert config["text_config"]["use_cache"] is True
    assert json.loads((final / "generation_config.json").read_text()).get("use_cache", True)
    model = AutoModelForImageTextToText.from_pretrained(final)
    processor = AutoProcessor.from_pretrained(final)
    assert processor.chat_template == c.processor.chat_template
    assert processor.image_processor.size["longest_edge"] == 65536
    reloaded = dict(model.named_parameters())
    for k, p in trained.items():
        torch.testing.assert_close(reloaded[k], p.detach(), msg=k)
    ledger = [json.loads(x) for x in (out / "ledger" / "rank_0.jsonl").read_text().splitlines()]
    assert sum(len(r["samples"]) for r in ledger) == sum(r["samples"] for r in rows)


@pytest.mark.slow
@pytest.mark.invariant
def test_one_pack_of_four_equals_four_accumulated_packs(data_dir, tmp_path):
    common = (
        "loop.max_steps=1",
        "optim.max_grad_norm=0",
        "dataset.pack_strategy=first_fit",
        "dataset.token_budget=4096",
        # A large Adam eps makes the first update ∝ the gradient instead of ≈ lr · sign(g), so
        # the weight comparison sees a wrong gradient scale.
        "optim.eps=1.0",
    )
    a = setup(
        _cfg(
            data_dir,
            tmp_path / "a",
            *common,
            "dataset.max_samples_per_pack=4",
            "optim.grad_accum=1",
        )
    )
    b = setup(
        _cfg(
            data_dir,
            tmp_path / "b",
            *common,
            "dataset.max_samples_per_pack=1",
            "optim.grad_accum=4",
        )
    )
    ra, rb = train(a), train(b)
    ma, mb = _metrics(tmp_path / "a")[0], _metrics(tmp_path / "b")[0]
    assert ma["samples"] == mb["samples"] == 4
    assert ra.losses[0] == pytest.approx(rb.losses[0], rel=1e-6)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-5)
    pa, pb = dict(a.model.model.named_parameters()), dict(b.model.model.named_parameters())
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6, msg=k)


def _lora_cfg(data: Path, out: Path, base: Path, *overrides: str) -> TrainConfig:
    return _cfg(
        data,
        out,
        f"model.path={base}",
        "model.tiny=false",
        "model.attn_implementation=sdpa",
        "model.train_merger=false",
        "lora.enabled=true",
        "lora.r=4",
        "lora.alpha=8",
        "optim.lr=1e-2",
        *overrides,
    )


def _sigterm_at(step: int):
    def hook(state) -> None:
        if state.step == step:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, through the real handler

    return hook


@pytest.mark.slow
def test_sigterm_then_resume_matches_an_uninterrupted_run_with_dropout(
    data_dir, tmp_path, monkeypatch
):
    # LoRA dropout makes every step draw from the global torch RNG: the resumed losses match
    # only if the RNG state is restored exactly and nothing draws from it before step 3.
    base = save_tiny_checkpoint(tmp_path / "base")
    extra = (
        "lora.dropout=0.2",
        "dataset.max_samples_per_pack=1",
        "optim.grad_accum=2",
        "loop.save_every_n_steps=0",
    )  # 12 samples → 6 steps of 2 micro-batches
    ref = train(setup(_lora_cfg(data_dir, tmp_path / "ref", base, *extra)))
    assert len(ref.losses) == 6
    out = tmp_path / "cut"
    handler = signal.getsignal(signal.SIGTERM)
    flag = PreemptionFlag()  # what `python -m train` installs at process start
    first = train(
        setup(_lora_cfg(data_dir, out, base, *extra)), signals=flag, on_step=_sigterm_at(2)
    )
    assert first.preempted and first.state.step == 2 and first.final_dir is None
    assert signal.getsignal(signal.SIGTERM) is handler  # the recipe's handler is uninstalled
    saved = out / "checkpoints" / "step_000002"
    assert json.loads((saved / "trainer_state.json").read_text())["step"] == 2
    second = train(setup(_lora_cfg(data_dir, out, base, *extra)))
    assert second.final_dir is not None
    assert first.losses + second.losses == ref.losses  # exact: fp32, same data position and RNG
    assert [r["step"] for r in _metrics(out)] == list(range(1, 7))
    # Negative control: without the RNG restore the dropout masks (and losses) differ.
    import train.checkpoint as ckpt

    monkeypatch.setattr(ckpt, "_set_rng_state", lambda state: None)
    resume = f"loop.resume={saved}"
    third = train(setup(_lora_cfg(data_dir, tmp_path / "norng", base, *extra, resume)))
    assert third.losses != ref.losses[2:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sigusr1_to_torchrun_reaches_the_worker_which_checkpoints_and_exits(data_dir, tmp_path):
    # What slurm/train.sbatch relies on: the elastic agent forwards SIGUSR1 only when it is in
    # PET_SIGNALS_TO_HANDLE (torchrun overwrites TORCHELASTIC_SIGNALS_TO_HANDLE from that).
    out = tmp_path / "usr1"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "true",
        "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "PET_SHUTDOWN_TIMEOUT": "60",
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
        "--master_port", str(_free_port()), "-m", "train", "--config", str(TINY_YAML),
        f"data={data_dir}", f"out={out}", "dataset.token_budget=1024",
        "dataset.max_samples_per_pack=1", "optim.grad_accum=1", "loop.save_every_n_steps=0",
        "loop.epochs=100",  # 1200 steps: the signal always lands mid-run
    ]  # fmt: skip
    launcher = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 180
    while not (out / "metrics.jsonl").is_file() or not _metrics(out):  # a step has finished
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0]
        time.sleep(0.05)
    launcher.send_signal(signal.SIGUSR1)
    log = launcher.communicate(timeout=120)[0]
    # The agent re-raises the signal after its workers exit (non-zero); the worker itself
    # checkpointed and returned normally, and was never killed.
    assert "closing signal SIGUSR1" in log, log[-3000:]
    assert "preempted at step" in log and "SIGKILL" not in log, log[-3000:]
    assert "exit 75" in log  # the worker's status: "preempted, requeue me"
    # Scheduled saves are off, so the one checkpoint is the signal's, taken at the step where
    # the worker stopped: the last step it logged, well before the end of the 1,200 steps.
    (saved,) = (out / "checkpoints").iterdir()
    step = json.loads((saved / "trainer_state.json").read_text())["step"]
    logged = [row["step"] for row in _metrics(out)]
    assert step == logged[-1]
    assert step < 1200
    assert not (out / "final").exists()


@pytest.mark.slow
def test_resume_refuses_another_data_plan(data_dir, tmp_path):
    out = tmp_path / "plan"
    train(setup(_cfg(data_dir, out, "loop.max_steps=1", "optim.grad_accum=1")))
    # The changed key is named before any weights load...
    with pytest.raises(ConfigError, match=r"optim.grad_accum: 1 -> 2"):
        setup(_cfg(data_dir, out, "loop.max_steps=2", "optim.grad_accum=2"))
    # ...and a plan changed by the data alone (no config key differs) is caught by its hash.
    other = write_dataset(tmp_path / "other", n_train=8, n_val=0, sizes=((64, 64),), words=(3, 9))
    with pytest.raises(ConfigError, match=r"data plan changed \(plan_hash"):
        setup(_cfg(other, out, "loop.max_steps=1", "optim.grad_accum=1"))


@pytest.mark.slow
def test_lora_trains_only_adapters_and_merges_to_the_same_logits(data_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from hivig.models.qwen_vl import encode_sample
    from hivig.tiny import synthetic_conversation
    from train.cli import main

    base = save_tiny_checkpoint(tmp_path / "base")
    out = tmp_path / "lora"
    c = setup(_lora_cfg(data_dir, out, base, "loop.max_steps=2"))
    before = _state(c.model.model)
    train(c)
    peft_model = c.model.model
    trainable = {k for k, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    after = peft_model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    # Merge through the CLI and compare logits with the adapter model.
    assert (
        main(
            [
                "merge-lora",
                "--adapter",
                str(out / "final"),
                "--out",
                str(tmp_path / "m"),
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    merged = AutoModelForImageTextToText.from_pretrained(tmp_path / "m").eval()
    adapter = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(base), str(out / "final")
    ).eval()
    messages, target = synthetic_conversation(2, seed=3)
    inputs = encode_sample(c.processor, messages, target).model_inputs()
    with torch.no_grad():
        a, m = adapter(**inputs).logits, merged(**inputs).logits
        plain = AutoModelForImageTextToText.from_pretrained(base).eval()(**inputs).logits
    torch.testing.assert_close(m, a, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain, a, atol=1e-4), "the adapter changed nothing"


def test_non_finite_loss_stops_training_with_the_sample_ids(data_dir, tmp_path):
    c = setup(_cfg(data_dir, tmp_path / "nan", "loop.max_steps=1"))
    with torch.no_grad():
        c.model.model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 1; samples \['train-"):
        train(c)


def test_generation_eval_scores_verdicts_and_counts_unparsed(data_dir):
    from hivig.config import FrameConfig
    from train.data import load_samples
    from train.encode import RecordEncoder
    from train.evaluate import verdict_accuracy

    processor = tiny_processor(min_pixels=1024, max_pixels=65536)
    encoder = RecordEncoder(processor, FrameConfig(min_pixels=1024, max_pixels=65536), data_dir)
    samples = load_samples(data_dir, "train")
    model = tiny_model(processor, seed=0).eval()
    row = verdict_accuracy(model, processor, samples, encoder, limit=2, max_new_tokens=4)
    # A random model never writes a well-formed critique: scored, but unparsed and wrong.
    assert row == {
        "eval_verdict_accuracy": 0.0,
        "eval_verdict_unparsed": 2.0,
        "eval_verdict_n": 2.0,
        "eval_verdict_cut": 0.0,
        "eval_max_new_tokens": 4.0,
    }
    # A rank past its time cap stops and reports what it left out instead of lagging.
    cut = verdict_accuracy(
        model, processor, samples, encoder, limit=2, max_new_tokens=4, time_limit_s=0.0
    )
    assert cut["eval_verdict_n"] == 0.0 and cut["eval_verdict_cut"] == 2.0


def test_unreadable_samples_are_quarantined_with_a_reason(data_dir, tmp_path):
    import dataclasses

    from hivig.config import FrameConfig
    from hivig.messages import ImageRef
    from train.data import Quarantine, compute_lengths, load_samples, plan_epoch
    from train.encode import RecordEncoder

    processor = tiny_processor(min_pixels=1024, max_pixels=65536)
    encoder = RecordEncoder(processor, FrameConfig(min_pixels=1024, max_pixels=65536), data_dir)
    samples = load_samples(data_dir, "train")[:3]
    broken = dataclasses.replace(
        samples[1].payload,
        images=(ImageRef("images/missing.png"),) * len(samples[1].payload.images),
    )
    samples[1] = dataclasses.replace(samples[1], payload=broken)
    quarantine = Quarantine()
    lengths = compute_lengths(samples, encoder, quarantine)
    assert lengths[1] == -1 and lengths[0] > 0 and lengths[2] > 0
    assert [e["id"] for e in quarantine.entries] == [samples[1].id]
    assert quarantine.entries[0]["reason"] == "not_found"
    assert quarantine.counts() == {"dropped_not_found": 1}
    plan = plan_epoch(lengths, budget=4096, seed=0, epoch=0, world=1, grad_accum=1)
    assert sorted(i for p in plan.packs for i in p) == [0, 2]
    quarantine.write(tmp_path / "q.jsonl")
    assert "not_found" in (tmp_path / "q.jsonl").read_text()


def test_over_budget_samples_are_quarantined_by_id(data_dir, tmp_path):
    from train.data import Quarantine, Sample, plan_epoch, quarantine_too_long

    samples = [Sample(f"s{i}", "critique", None) for i in range(4)]
    lengths = [50, 300, 80, -1]
    plan = plan_epoch(lengths, budget=100, seed=0, epoch=0, world=1, grad_accum=1)
    quarantine = Quarantine()
    quarantine_too_long(quarantine, samples, lengths, plan, 100)
    assert [(e["id"], e["reason"]) for e in quarantine.entries] == [("s1", "too_long")]
    assert "300 tokens" in quarantine.entries[0]["message"]
    # Through the recipe: a budget between the shortest and the longest sample.
    lengths = setup(_cfg(data_dir, tmp_path / "q", "loop.max_steps=1")).lengths
    budget = sorted(lengths)[len(lengths) // 2]  # token counts are cached in out/: cheap
    c = setup(_cfg(data_dir, tmp_path / "q", f"dataset.token_budget={budget}", "loop.max_steps=1"))
    lines = (tmp_path / "q" / "quarantine.jsonl").read_text().splitlines()
    entries = [json.loads(x) for x in lines]
    too_long = [e["id"] for e in entries if e["reason"] == "too_long"]
    over = [s.id for s, n in zip(c.samples, c.lengths, strict=True) if n > budget]
    assert sorted(too_long) == sorted(over) and over and len(over) < len(c.samples)


def test_full_fine_tune_in_pure_bf16_without_deepspeed_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"`model.dtype` is bfloat16.*DeepSpeed"):
        setup(_cfg(data_dir, tmp_path / "bf16", "model.dtype=bfloat16"))


def test_deepspeed_engine_that_finds_no_state_is_an_error(tmp_path):
    from types import SimpleNamespace

    from train.checkpoint import TrainerState, load_checkpoint

    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 3}))
    engine = SimpleNamespace(load_checkpoint=lambda *a, **k: (None, None))
    accelerator = SimpleNamespace(deepspeed_engine_wrapped=SimpleNamespace(engine=engine))
    with pytest.raises(FileNotFoundError, match="no DeepSpeed engine state"):
        load_checkpoint(tmp_path, accelerator, None, None, None, current=TrainerState(step=0))
