"""Periodic evaluation: held-out loss on packed batches and generation-based verdict accuracy.

Both run on every rank (held-out packs are sharded like training packs) and return metric dicts
for the run's ``MetricLogger``; the recipe calls ``run_evaluation`` every
``loop.eval_every_n_steps`` and at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hivig.contracts import ContractError, parse_critique
from hivig.distributed import rank_and_world
from hivig.logging import get_logger
from hivig.models.qwen_vl import encode_sample
from train.collate import collate_pack
from train.metrics import all_reduce_sum
from train.packing import plan_packs

log = get_logger(__name__)


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module,
    samples: Sequence[Any],
    lengths: Sequence[int],
    encoder: Any,
    *,
    budget: int,
    max_packs: int,
    device: torch.device | str,
) -> dict[str, float]:
    """Token-weighted held-out loss (Σ CE / Σ supervised tokens over all ranks).

    Every rank runs the same number of packs (ZeRO-3 needs identical module calls on all ranks).

    Args:
        model: The ``CriticLoss`` module (possibly engine-wrapped): ``model(inputs)`` returns
            ``(loss_sum, supervised_tokens)``.
        samples: Held-out samples (``train.data.Sample``).
        lengths: Their token lengths (-1 = quarantined, skipped).
        encoder: ``RecordEncoder``.
        budget: Tokens per pack.
        max_packs: Packs per rank at most.
        device: Where the model lives.

    Returns:
        ``{"eval_loss", "eval_tokens", "eval_samples"}``.
    """
    rank, world = rank_and_world()
    order = [i for i, n in enumerate(lengths) if n >= 0]
    plan = plan_packs(lengths, budget, order=order, strategy="first_fit")
    per_rank = min(max_packs, len(plan.packs) // world)
    mine = plan.packs[rank::world][:per_rank]
    if not mine:
        log.warning("held-out split too small: %d packs for %d ranks", len(plan.packs), world)
        return {}
    was_training = model.training
    model.eval()
    loss = tokens = count = 0.0
    for pack in mine:
        encoded = [encoder(samples[i].payload) for i in pack]
        batch = collate_pack(encoded, [samples[i].id for i in pack]).to(device)
        loss_sum, n = model(batch.inputs)
        loss, tokens, count = loss + float(loss_sum), tokens + float(n), count + len(pack)
    model.train(was_training)
    loss, tokens, count = all_reduce_sum([loss, tokens, count], device)
    return {
        "eval_loss": loss / tokens if tokens else float("nan"),
        "eval_tokens": tokens,
        "eval_samples": count,
    }


def _expected_verdict(sample: Any, target: str) -> str | None:
    labels = getattr(sample.payload, "labels", None)
    if labels is not None and getattr(labels, "verdict", None):
        return str(labels.verdict)
    parsed = parse_critique(target)
    return None if isinstance(parsed, ContractError) else str(parsed.verdict)


@torch.no_grad()
def verdict_accuracy(
    model: torch.nn.Module,
    processor: Any,
    samples: Sequence[Any],
    encoder: Any,
    *,
    limit: int,
    max_new_tokens: int,
    time_limit_s: float = float("inf"),
    stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """Greedy-generate answers for up to ``limit`` critique samples and score the verdicts.

    The samples are spread over the ranks (rank r takes every W-th one) and the counts summed,
    so no rank waits near the process-group timeout while one generates alone. Unparseable
    outputs count as wrong and are counted separately. Call on every rank (a collective).

    Args:
        model: The unwrapped model (replicated weights: not under ZeRO-3).
        processor: The run's processor.
        samples: Held-out samples.
        encoder: The run's ``RecordEncoder``.
        limit: Critique samples scored in total.
        max_new_tokens: Generation budget; 0 = the longest chosen target plus a margin.
        time_limit_s: Wall-clock cap on this rank, in seconds: past it the rank stops
            generating and joins the sum with what it scored (counted in
            ``eval_verdict_cut``).
        stop: Checked before each sample; ``True`` stops this rank the same way (a signal).

    Returns:
        ``{"eval_verdict_accuracy", "eval_verdict_unparsed", "eval_verdict_n",
        "eval_verdict_cut", "eval_max_new_tokens"}``.
    """
    rank, world = rank_and_world()
    chosen = [s for s in samples if s.kind == "critique"][:limit]
    if max_new_tokens <= 0:
        max_new_tokens = generation_budget(processor, encoder, chosen)
    chosen = chosen[rank::world]
    right = unparsed = scored = cut = 0
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    deadline = time.monotonic() + time_limit_s
    for i, sample in enumerate(chosen):
        if time.monotonic() > deadline or (stop is not None and stop()):
            cut = len(chosen) - i
            break
        messages, target = encoder.prompt_and_target(sample.payload)
        expected = _expected_verdict(sample, target)
        if expected is None:
            continue
        prompt = encode_sample(processor, encoder.materialise(messages))
        inputs = {k: v.to(device) for k, v in prompt.model_inputs().items()}
        # The 4-row training positions are for packed rows; generation computes its own.
        inputs.pop("position_ids", None)
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True
        )
        text = processor.tokenizer.decode(
            out[0, prompt.input_ids.numel() :], skip_special_tokens=False
        )
        parsed = parse_critique(text.split("<|im_end|>")[0])
        scored += 1
        if isinstance(parsed, ContractError):
            unparsed += 1
        elif str(parsed.verdict) == expected:
            right += 1
    model.train(was_training)
    right, unparsed, scored, cut = all_reduce_sum([right, unparsed, scored, cut], device)
    return {
        "eval_verdict_accuracy": right / scored if scored else float("nan"),
        "eval_verdict_unparsed": float(unparsed),
        "eval_verdict_n": float(scored),
        "eval_verdict_cut": float(cut),
        "eval_max_new_tokens": float(max_new_tokens),
    }


GENERATION_MARGIN = 16
"""Tokens allowed beyond the longest held-out target (a model may phrase slightly longer)."""


def generation_budget(processor: Any, encoder: Any, samples: Sequence[Any]) -> int:
    """Longest target of ``samples`` in tokens plus ``GENERATION_MARGIN`` (same on every rank)."""
    longest = 0
    for sample in samples:
        _, target = encoder.prompt_and_target(sample.payload)
        longest = max(longest, len(processor.tokenizer.encode(target, add_special_tokens=False)))
    return longest + GENERATION_MARGIN
