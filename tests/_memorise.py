"""Train = serve, end to end: a tiny critic that memorised one trajectory, replayed over HTTP.

``memorised_checkpoint(root)`` generates a small data_gen dataset, picks one trajectory and the
records a runner meets when it replays that trajectory to a step ``k`` (the history records of
steps ``0..k-1``, one Good and one Bad critique), trains the tiny random-weight Qwen3-VL on those
records only until it reproduces every target token (teacher-forced argmax, checked on the
trained model), and returns the checkpoint with what it learnt.

``gateway(...)`` starts ``python -m serve`` on that checkpoint as a subprocess on loopback;
``replay(base_url, memorised)`` then drives the gateway the way an agent runner does (session,
observe with base64 PNG screenshots and the executed step's raw tool calls, critique of each
memorised proposal) and returns, per model call, what the gateway answered next to what the
record says. Greedy decoding reproduces a memorised target only when the served prompt is the
trained prompt token for token (text, frames, markers, chat template), and the answer only comes
back as the record's labels when the gateway parses it as training wrote it: any drift between
train and serve shows as an outcome that is not ``ok``.

The replay needs a backend URL only: another tier can serve the same checkpoint through vLLM's
OpenAI server (``gateway(..., backend=openai_backend(url, name, memorised))``) and reuse it.

Why these records:

- history records whose intent is masked are left out: a masked record's prompt lacks the
  executed step's ``Action:`` line, while the critique records of later steps show that step
  with it, so no runner can replay both; the trajectory chosen has an unmasked chain;
- the Good and the Bad critique are at different steps: two proposals on the same screen differ
  by a few tokens only, and the tiny model needs far more steps to tell them apart (one token of
  such a pair was still wrong after 250 steps).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import torch

from data_gen.run import run as generate
from hivig.actions import render_tool_calls, space_for_platform
from hivig.backends import split_reasoning
from hivig.config import FrameConfig, load_config
from hivig.contracts import CritiqueOutput, HistoryOutput, parse_critique, parse_history
from hivig.records import (
    SPLITS,
    SFTRecord,
    read_image_root,
    read_profile,
    read_records,
    record_messages,
    records_dir,
    write_manifest,
    write_profile,
    write_records,
)
from hivig.trajectory import Trajectory, read_trajectories
from tests._sample_run import ingested_demo_config
from tests.e2e.test_serve_parity import _history_chain
from tests.fakes.gateway import b64
from train.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
TRAIN_CONFIG = REPO / "configs" / "train" / "tiny_cpu.yaml"
LOCAL_SERVE = REPO / "configs" / "serve" / "local.yaml"

SAMPLE = (6, 1)
"""(trajectories, seed) of the generated corpus: it holds a trajectory with an unmasked history
chain of two steps and Good/Bad critiques at different steps."""
STEPS = 2
"""``k``: the replay observes steps 0..k; the history records of steps 0..k-1 are memorised."""

TRAIN_OVERRIDES = (
    # One record per optimizer step, 50 passes: 200 steps for the 4 records. The tiny model has
    # every target token right after about 140 steps (lr 1e-2; with 2 CPU threads and with 1)
    # and the rest widens the smallest logit margin to about 3.5, so another machine's float
    # rounding cannot tip a token. Two records per step or a higher lr (2e-2) learn slower.
    "optim.global_batch_samples=1",
    # A row per record too: short prompts (a profile's) would otherwise share one packed row.
    "dataset.max_samples_per_pack=1",
    "loop.epochs=50",
    "optim.lr=1.0e-2",
    "optim.scheduler=cosine",
    "optim.warmup_ratio=0.02",
    "optim.min_lr_ratio=0.1",
    "optim.betas=[0.9,0.95]",
    "loop.seed=1234",
    "model.tiny_seed=0",
    "loop.save_every_n_steps=0",
    "loop.progress_bar=false",
    "metrics.sinks=[jsonl]",
)
"""Overrides of ``configs/train/tiny_cpu.yaml`` (its frame: 1,024..65,536 px, factor 32)."""

DEADLINE_S = 120.0
"""Gateway deadline of each model call: generous, CPU runs share two cores with other work."""


# ---------------------------------------------------------------------------------------------
# What is memorised


@dataclass(frozen=True)
class CritiqueCase:
    """A memorised critique record and the proposal a runner sends for it."""

    record: SFTRecord
    intent: str | None
    """The proposal's ``Action:`` line, ``None`` where the record masks it."""
    calls: str
    """The proposal's raw tool calls, as the record shows them."""

    @property
    def step(self) -> int:
        return self.record.step_index

    @property
    def verdict(self) -> str:
        """The record's verdict as the gateway spells it (``good``/``bad``)."""
        return str(self.record.labels.verdict).lower()

    @property
    def dimension(self) -> str | None:
        return self.record.labels.error_dimension


@dataclass(frozen=True)
class TrainStats:
    """How the memorising run went."""

    steps: int
    seconds: float
    last_losses: tuple[float, ...]
    wrong_tokens: int
    """Supervised target tokens whose teacher-forced argmax is not the target token."""
    supervised_tokens: int
    min_margin: float
    """Smallest (target logit - best other logit) over every supervised token."""


@dataclass(frozen=True)
class Memorised:
    """A checkpoint that memorised the records of one trajectory, and how to replay it."""

    checkpoint: Path
    """The final checkpoint (``python -m train``'s ``out/final``)."""
    data: Path
    """The filtered data_gen folder it was trained on (only ``records``)."""
    image_root: Path
    """Where the corpus screenshots (record and trajectory paths) resolve."""
    trajectory: Trajectory
    k: int
    """The last step the replay observes."""
    history: tuple[SFTRecord, ...]
    """History records of steps 0..k-1, in order: the gateway's update after step ``i + 1``."""
    cases: tuple[CritiqueCase, ...]
    """Critique records at steps <= k, in step order."""
    frame: FrameConfig
    """The training frame (the gateway must serve the same)."""
    max_tokens: int
    """Token cap for both gateway calls: the longest target plus a margin."""
    train: TrainStats
    profile: str | None = None
    """The critic profile folder the data was written in (``None``: hivig's own); passed to
    data_gen (``profile=``) and to the gateway (``critic.profile=``)."""

    @property
    def records(self) -> tuple[SFTRecord, ...]:
        return (*self.history, *(c.record for c in self.cases))


def _select(
    records: Sequence[SFTRecord], trajectories: dict[str, Trajectory], k: int
) -> tuple[Trajectory, list[SFTRecord], list[SFTRecord]]:
    """The first trajectory (by id) with an unmasked history chain 0..k-1, a Good critique at
    step ``k`` and a Bad one with a dimension at an earlier step past 0 (so both critiques
    follow a history update and carry a trajectory text)."""
    for tid in sorted(trajectories):
        mine = [r for r in records if r.trajectory_id == tid]
        chain = _history_chain(mine, tid, k)
        if chain is None or any(r.labels.intent_masked for r in chain):
            continue
        critiques = sorted((r for r in mine if r.kind == "critique"), key=lambda r: r.id)
        good = [r for r in critiques if r.labels.verdict == "Good" and r.step_index == k]
        bad = [
            r
            for r in critiques
            if r.labels.verdict == "Bad" and r.labels.error_dimension and 0 < r.step_index < k
        ]
        if good and bad:
            return trajectories[tid], chain, [bad[0], good[0]]
    raise AssertionError(f"no trajectory with an unmasked history chain to step {k} and critiques")


def _proposal_label(profile: str | None) -> str:
    """The text the critique prompt puts right before the proposed step (``$step``)."""
    from hivig.profiles import resolve_profile

    user = resolve_profile(profile).templates["critic_critique"].user
    before = user.split("$step")[0]
    # The literal text between the placeholder before ``$step`` and ``$step`` itself.
    return re.split(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", before)[-1]


def _proposed_in(record: SFTRecord, label: str) -> tuple[str | None, str]:
    """``(intent, calls)`` of a critique record's proposed step, read after ``label``."""
    text = "".join(p.text for p in record.user if hasattr(p, "text"))
    step = text.split(label, 1)[1]
    if step.startswith("Action: "):
        intent, _, calls = step.partition("\n")
        return intent[len("Action: ") :], calls
    return None, step


def _case(record: SFTRecord, label: str = "Current Proposed Step:\n") -> CritiqueCase:
    intent, calls = _proposed_in(record, label)
    if (intent is None) != record.labels.intent_masked:
        raise AssertionError(f"{record.id}: the proposal's Action line disagrees with its labels")
    return CritiqueCase(record, intent, calls)


def _write_subset(source_records: Path, out: Path, chosen: Sequence[SFTRecord]) -> None:
    """A data_gen-shaped folder holding ``chosen`` only, all in the train split (with the
    source's manifest and recorded profile, so training reads the same images and interface)."""
    root = records_dir(out)
    write_records([replace(r, split="train") for r in chosen], root / "train")
    image_root = read_image_root(source_records)
    assert image_root is not None, f"{source_records} has no manifest"
    write_manifest(root, image_root)
    write_profile(root, read_profile(source_records))


def _teacher_forced(c: Any) -> tuple[int, int, float]:
    """(wrong tokens, supervised tokens, min margin) of the trained model on its own samples."""
    from train.collate import collate_pack
    from train.loss import supervised_positions

    module = getattr(c.model, "module", c.model)
    head = module.model.lm_head
    wrong, total, margin = 0, 0, float("inf")
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for sample in c.samples:
                batch = collate_pack([c.encoder(sample.payload)])
                hidden, labels = supervised_positions(
                    module.hidden_states(batch.inputs), batch.inputs["labels"]
                )
                logits = head(hidden).float()
                target = logits.gather(1, labels[:, None])[:, 0]
                others = logits.scatter(1, labels[:, None], float("-inf")).max(dim=1).values
                wrong += int((target <= others).sum())
                total += labels.numel()
                margin = min(margin, float((target - others).min()))
    finally:
        module.train(was_training)
    return wrong, total, margin


def _train(data: Path, out: Path) -> tuple[Path, TrainStats, FrameConfig]:
    from train import sft

    cfg = load_config(TrainConfig, TRAIN_CONFIG, [f"data={data}", f"out={out}", *TRAIN_OVERRIDES])
    start = time.perf_counter()
    components = sft.setup(cfg)
    result = sft.train(components)
    seconds = time.perf_counter() - start
    assert result.final_dir is not None, "training ended without a final checkpoint"
    wrong, total, margin = _teacher_forced(components)
    stats = TrainStats(
        steps=result.state.step,
        seconds=round(seconds, 1),
        last_losses=tuple(round(x, 4) for x in result.losses[-4:]),
        wrong_tokens=wrong,
        supervised_tokens=total,
        min_margin=round(margin, 3),
    )
    return Path(result.final_dir), stats, cfg.dataset.frame


def memorised_checkpoint(root: Path, profile: str | None = None) -> Memorised:
    """Generate records under ``root``, pick one trajectory's, train until memorised.

    Args:
        root: An empty working folder (corpus, data_gen output, subset, training run).
        profile: A critic profile folder to write the records in and serve with; ``None`` is
            hivig's own interface. The replay reads proposals in the default layout.

    Returns:
        The checkpoint and what it memorised; ``train.wrong_tokens`` is 0 when it worked (the
        caller asserts it, so a failed memorisation fails the test, never skips it).
    """
    extra = [f"profile={profile}"] if profile else []
    cfg = ingested_demo_config(root / "gen", *SAMPLE, *extra)
    generate(cfg, None)
    source = records_dir(cfg.out)
    records = [r for s in SPLITS if (source / s).is_dir() for r in read_records(source / s)]
    trajectories = {t.id: t for t in read_trajectories(root / "gen" / "i" / "trajectories.jsonl")}
    trajectory, chain, critiques = _select(records, trajectories, STEPS)
    label = _proposal_label(profile)
    cases = tuple(_case(r, label) for r in sorted(critiques, key=lambda r: r.step_index))
    data = root / "subset"
    _write_subset(source, data, [*chain, *(c.record for c in cases)])
    checkpoint, stats, frame = _train(data, root / "train")
    tokenizer = _tokenizer(checkpoint)
    longest = max(len(tokenizer(r.target)["input_ids"]) for r in [*chain, *critiques])
    image_root = read_image_root(source)
    assert image_root is not None
    return Memorised(
        checkpoint=checkpoint,
        data=data,
        image_root=image_root,
        trajectory=trajectory,
        k=STEPS,
        history=tuple(chain),
        cases=cases,
        frame=frame,
        max_tokens=longest + 32,
        train=stats,
        profile=profile,
    )


def _tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))


_CACHE: dict[str | None, Memorised] = {}


def shared_memorised(tmp_path_factory: Any, profile: str | None = None) -> Memorised:
    """``memorised_checkpoint`` once per pytest session and profile (training costs minutes
    of CPU): every test module that asks gets the same checkpoint."""
    if profile not in _CACHE:
        _CACHE[profile] = memorised_checkpoint(tmp_path_factory.mktemp("memorised"), profile)
    return _CACHE[profile]


# ---------------------------------------------------------------------------------------------
# The gateway


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_settings(memorised: Memorised, state_dir: Path, port: int) -> list[str]:
    """The gateway overrides that make serving equal training (any backend)."""
    f = memorised.frame
    settings = [
        "host=127.0.0.1",
        f"port={port}",
        "backend.sampling.temperature=0.0",  # greedy
        "backend.sampling.top_p=1.0",
        "critic.recurrence_note=false",  # training data never carries the note
        f"critic.history_max_tokens={memorised.max_tokens}",
        f"critic.critique_max_tokens={memorised.max_tokens}",
        f"critic.observe_deadline_s={DEADLINE_S}",
        f"critic.critique_deadline_s={DEADLINE_S}",
        f"frame.min_pixels={f.min_pixels}",
        f"frame.max_pixels={f.max_pixels}",
        f"frame.factor={f.factor}",
        "sessions.store=memory",
        f"sessions.state_dir={state_dir}",
        "warmup=true",
        "log_level=warning",
    ]
    if memorised.profile:
        settings.append(f"critic.profile={memorised.profile}")
    return settings


def transformers_backend(memorised: Memorised) -> list[str]:
    """Backend overrides: the checkpoint in the gateway's process (``configs/serve/local.yaml``)."""
    return ["backend.kind=transformers", f"model={memorised.checkpoint}"]


def openai_backend(base_url: str, served_name: str, memorised: Memorised) -> list[str]:
    """Backend overrides: the checkpoint behind an OpenAI-compatible server (vLLM) at
    ``base_url`` (``http://127.0.0.1:PORT/v1``) under ``served_name``; the gateway checks the
    checkpoint's recorded profile through ``critic.checkpoint``."""
    return [
        "backend.kind=openai",
        f"backend.base_url={base_url}",
        f"model={served_name}",
        f"critic.checkpoint={memorised.checkpoint}",
        "backend.max_retries=0",
    ]


@dataclass
class Gateway:
    """A running ``python -m serve`` subprocess."""

    url: str
    state_dir: Path
    argv: list[str]
    log: Path
    started_s: float
    """Seconds from the process start to ``/readyz`` answering 200 (warm-up included)."""

    @property
    def traces(self) -> Path:
        return self.state_dir / "traces"


@contextlib.contextmanager
def gateway(
    memorised: Memorised,
    state_dir: Path,
    *,
    backend: Sequence[str] | None = None,
    config: Path = LOCAL_SERVE,
    token: str | None = None,
    ready_timeout_s: float = 240.0,
) -> Iterator[Gateway]:
    """Serve ``memorised`` with ``python -m serve`` on a free loopback port until the block ends.

    Args:
        memorised: What to serve.
        state_dir: The gateway's ``sessions.state_dir`` (traces land in ``traces/``).
        backend: Backend overrides (``transformers_backend`` by default, ``openai_backend``).
        config: The serve YAML the overrides apply to.
        token: Bearer token the gateway requires (``None``: no auth).
        ready_timeout_s: How long start-up (model load and warm-up) may take.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    overrides = [*(backend or transformers_backend(memorised))]
    argv = [
        sys.executable,
        "-m",
        "serve",
        "--config",
        str(config),
        *gateway_settings(memorised, state_dir, port),
        *overrides,
    ]
    env = {**os.environ, "HIVIG_SERVE_TOKEN": token or ""}
    log = state_dir / "gateway.log"
    url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, url, log, ready_timeout_s)
        yield Gateway(url, state_dir, argv, log, round(time.perf_counter() - start, 1))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the gateway exited ({proc.returncode}):\n{_tail(log)}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/readyz").status_code == 200:
                    return
            time.sleep(0.5)
    raise AssertionError(f"the gateway was not ready after {timeout_s:.0f} s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# The replay


@dataclass
class Outcome:
    """One model call of the replay: what the record says next to what the gateway answered."""

    kind: str
    """``history`` (the update after observing ``step``) or ``critique`` (at ``step``)."""
    step: int
    record_id: str
    expected: dict[str, Any]
    got: dict[str, Any]
    status: str | None
    """The gateway's ``status`` (``ok``, ``degraded``)."""
    raw: dict[str, Any] | None = None
    """From the trace: the model's reasoning and answer text, and the target's (else ``None``)."""
    prompt_drift: str | None = None
    """From the trace: the first difference between the served prompt and the record's."""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def labels_ok(self) -> bool:
        """Critique: verdict and error dimension equal the record's labels; history: parsed."""
        if self.kind == "critique":
            keys = ("verdict", "error_dimension")
            return all(self.got.get(k) == self.expected[k] for k in keys)
        return self.status == "ok"

    @property
    def text_ok(self) -> bool:
        """Every parsed field of the answer equals the target's (and the raw text, if traced)."""
        raw_ok = self.raw is None or self.raw["got"] == self.raw["expected"]
        return self.got == self.expected and raw_ok

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.labels_ok and self.text_ok and not self.prompt_drift

    def describe(self) -> str:
        head = f"{self.kind} at step {self.step} ({self.record_id}): status {self.status}"
        if self.ok:
            return f"{head}, ok"
        lines = [head]
        for key, want in self.expected.items():
            if self.got.get(key) != want:
                lines.append(
                    f"  {key}: expected {want!r}\n  {' ' * len(key)}  got      "
                    f"{self.got.get(key)!r}"
                )
        if self.raw is not None and self.raw["got"] != self.raw["expected"]:
            lines.append(
                f"  raw text: expected {self.raw['expected']!r}\n"
                f"            got      {self.raw['got']!r}"
            )
        if self.prompt_drift:
            lines.append(f"  prompt drift: {self.prompt_drift}")
        return "\n".join(lines)


def _expected_critique(record: SFTRecord) -> dict[str, Any]:
    parsed = parse_critique(record.target)
    assert isinstance(parsed, CritiqueOutput), f"{record.id}: unparsable target: {parsed}"
    dimension = parsed.dimension.name if parsed.dimension else None
    assert dimension == record.labels.error_dimension, f"{record.id}: target and labels differ"
    assert parsed.verdict == record.labels.verdict, f"{record.id}: target and labels differ"
    return {
        "verdict": str(record.labels.verdict).lower(),
        "error_dimension": record.labels.error_dimension,
        "explanation": parsed.explanation,
        "thinking": parsed.think,
    }


def _expected_history(record: SFTRecord) -> dict[str, Any]:
    parsed = parse_history(record.target)
    assert isinstance(parsed, HistoryOutput), f"{record.id}: unparsable target: {parsed}"
    return {"progress_summary": parsed.progress, "last_action_result": parsed.last_result}


def _raw_pair(record: SFTRecord, reasoning: str | None, text: str | None) -> dict[str, Any]:
    want_reasoning, want_text = split_reasoning(record.target)
    return {
        "expected": [(want_reasoning or "").strip(), want_text.strip()],
        "got": [(reasoning or "").strip(), (text or "").strip()],
    }


def replay(
    base_url: str,
    memorised: Memorised,
    token: str | None = None,
    *,
    traces: Path | None = None,
    timeout_s: float = DEADLINE_S + 30,
) -> list[Outcome]:
    """Replay the memorised trajectory through a running gateway, as an agent runner would.

    Observes steps 0..k (screenshots as base64 PNG; from step 1 on, the executed step's raw
    tool calls in Qwen format with its intent) and, at each memorised critique's step, asks for
    a verdict on the record's proposal (``return_thinking``). The gateway runs a history update
    after each observe from step 1 on; each is compared with the history record of the step
    observed before.

    Args:
        base_url: The gateway root (``http://127.0.0.1:PORT``).
        memorised: What the checkpoint behind the gateway memorised.
        token: The gateway's bearer token, if it requires one.
        traces: The gateway's trace folder (``sessions.state_dir/traces``): adds the raw model
            text and the served prompt (texts and marks) to each outcome's comparison.
        timeout_s: Client timeout of each request.

    Returns:
        One outcome per model call, in call order (``k`` history updates, one per critique).
    """
    traj = memorised.trajectory
    space = space_for_platform(traj.platform)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    outcomes: list[Outcome] = []
    with httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers) as client:
        created = client.post(
            "/v1/sessions",
            json={
                "task": traj.task,
                "platform": traj.platform,
                "screen": {"w": traj.screen_w, "h": traj.screen_h},
                "coord_space": "norm1000",
            },
        )
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        for i in range(memorised.k + 1):
            shot = (memorised.image_root / traj.steps[i].screenshot).read_bytes()
            body: dict[str, Any] = {"step_idx": i, "screenshot": b64(shot)}
            if i > 0:
                prev = traj.steps[i - 1]
                action = {"raw": render_tool_calls(list(prev.actions), space), "format": "qwen"}
                if prev.intent:
                    action["intent"] = prev.intent
                body["prev_action"] = action
            start = time.perf_counter()
            r = client.post(f"/v1/sessions/{sid}/observe", json=body)
            assert r.status_code == 200, r.text
            if i > 0:
                record = memorised.history[i - 1]
                answer = r.json()
                got = {k: answer["history"][k] for k in ("progress_summary", "last_action_result")}
                outcomes.append(
                    Outcome(
                        "history",
                        i,
                        record.id,
                        _expected_history(record),
                        got,
                        answer["status"],
                        seconds=round(time.perf_counter() - start, 2),
                        extra={"reason": answer.get("reason"), "usage": answer.get("usage")},
                    )
                )
            for case in (c for c in memorised.cases if c.step == i):
                proposal = {"raw": case.calls, "format": "qwen"}
                if case.intent is not None:
                    proposal["intent"] = case.intent
                start = time.perf_counter()
                r = client.post(
                    f"/v1/sessions/{sid}/critique",
                    json={"step_idx": i, "action": proposal, "return_thinking": True},
                )
                assert r.status_code == 200, r.text
                answer = r.json()
                expected = _expected_critique(case.record)
                outcomes.append(
                    Outcome(
                        "critique",
                        i,
                        case.record.id,
                        expected,
                        {k: answer.get(k) for k in expected},
                        answer["status"],
                        seconds=round(time.perf_counter() - start, 2),
                        extra={"reason": answer.get("reason"), "usage": answer.get("usage")},
                    )
                )
    if traces is not None:
        _add_traces(outcomes, memorised, traces / f"{sid}.jsonl")
    return outcomes


# ---------------------------------------------------------------------------------------------
# Traces: the served prompt and the raw model text


def _normalised(messages: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """(role, parts) with adjacent texts joined and images as their marks."""
    out = []
    for message in messages:
        parts: list[Any] = []
        for part in message["content"]:
            if part["type"] == "text":
                if parts and isinstance(parts[-1], str):
                    parts[-1] += part["text"]
                else:
                    parts.append(part["text"])
            else:
                parts.append(("image", [dict(m) for m in part["marks"]]))
        out.append((message["role"], parts))
    return out


def _record_prompt(record: SFTRecord) -> list[dict[str, Any]]:
    messages = []
    for m in record_messages(record)[:-1]:
        content = []
        for part in m.content:
            image = getattr(part, "image", None)
            if image is None:
                content.append({"type": "text", "text": part.text})
            else:
                marks = [{"kind": type(x).__name__, **asdict(x)} for x in image.marks]
                content.append({"type": "image", "marks": marks})
        messages.append({"role": m.role, "content": content})
    return messages


def prompt_drift(record: SFTRecord, served: list[dict[str, Any]]) -> str | None:
    """The first difference between a record's prompt and a traced served one, or ``None``."""
    want, got = _normalised(_record_prompt(record)), _normalised(served)
    if [r for r, _ in want] != [r for r, _ in got]:
        return f"roles {[r for r, _ in want]} != {[r for r, _ in got]}"
    for (role, a), (_, b) in zip(want, got, strict=True):
        if len(a) != len(b):
            return f"{role}: {len(a)} parts trained, {len(b)} served"
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            if x == y:
                continue
            if isinstance(x, str) and isinstance(y, str):
                return f"{role} part {n}: {_first_difference(x, y)}"
            return f"{role} part {n}: trained {x!r}, served {y!r}"
    return None


def _first_difference(trained: str, served: str) -> str:
    same = (i for i, (p, q) in enumerate(zip(trained, served, strict=False)) if p != q)
    at = next(same, min(len(trained), len(served)))
    window = slice(max(0, at - 40), at + 40)
    return f"differs at char {at}: trained {trained[window]!r}, served {served[window]!r}"


def _events(path: Path) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _add_traces(outcomes: list[Outcome], memorised: Memorised, path: Path) -> None:
    records = {r.id: r for r in memorised.records}
    events = _events(path)
    observed = {e["step_idx"]: e for e in events if e["event"] == "observe"}
    critiques = iter([e for e in events if e["event"] == "critique"])
    for outcome in outcomes:
        record = records[outcome.record_id]
        if outcome.kind == "history":
            event = observed[outcome.step]
            outcome.raw = _raw_pair(record, event.get("reasoning"), event.get("raw_output"))
        else:
            event = next(critiques)
            # The trace keeps the answer text raw and the reasoning as parsed (``thinking``).
            thinking = event["verdicts"][0].get("thinking")
            outcome.raw = _raw_pair(record, thinking, event["raw_outputs"][0])
        outcome.prompt_drift = prompt_drift(record, event["prompt"])


def report(memorised: Memorised, outcomes: Sequence[Outcome]) -> str:
    """A readable account of a replay (for assertion messages)."""
    t = memorised.train
    head = (
        f"trajectory {memorised.trajectory.id}, k={memorised.k}; trained {t.steps} steps in "
        f"{t.seconds} s: {t.wrong_tokens}/{t.supervised_tokens} target tokens wrong "
        f"(teacher-forced), min margin {t.min_margin}"
    )
    return "\n".join([head, *(o.describe() for o in outcomes)])


REFERENCE_FIXTURE = REPO / "tests" / "fixtures" / "reference_repo"
_REFERENCE: dict[str, Path] = {}


def shared_reference_profile(tmp_path_factory: Any) -> Path:
    """The profile ``hivig profile import-reference`` writes from the reference-shaped fixture
    repository (images inline, LlamaFactory's frames, markers on the original, the model's own
    summaries fed back), once per pytest session."""
    if "profile" not in _REFERENCE:
        import hashlib

        from hivig.profiles.reference import SOURCES, import_reference

        root = REFERENCE_FIXTURE
        digests = {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in SOURCES}
        out = tmp_path_factory.mktemp("reference_profile") / "profile"
        import_reference(root, out, known={"fixture": digests})
        _REFERENCE["profile"] = out
    return _REFERENCE["profile"]
