"""Training data path: collator throughput and packing efficiency on a generated dataset.

    python benchmarks/bench_train_data.py                       # defaults: 48 samples, 1920x1080
    python benchmarks/bench_train_data.py --samples 96 --workers 2 --budget 16384

What it measures, per sample at the default canonical frame (max 1,048,576 px):

- encode throughput in process (decode PNG → canonical frame + marker → chat template →
  processor → labels → MRoPE positions), in samples/s, and the workers a node needs to feed
  8 GPUs at 0.8 samples/s/GPU;
- end-to-end packed batches through the training DataLoader with ``--workers`` processes, in
  samples/s per worker (median of ``--repeats`` runs);
- token efficiency measured on the batch tensors the loaders yield (tokens that belong to
  samples / elements of ``input_ids``): padding-free packed rows versus pad-to-longest with
  batch 2 (the original release's collation);
- budget fill of the packed rows (tokens / rows x budget: the compute a row's budget buys),
  per packing strategy and window, against the bound of the fewest rows that could hold them.

The processor is the offline one with the real Qwen tokenizer (``hivig.tiny.tiny_processor``),
so text and image token counts are the production ones.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from hivig.config import FrameConfig, screen_size
from hivig.tiny import tiny_processor
from train.collate import collate_pack
from train.data import Quarantine, build_loader, compute_lengths, load_samples
from train.encode import RecordEncoder
from train.packing import pad_to_longest_efficiency, plan_packs
from train.synthetic import write_dataset

GPUS_PER_NODE = 8
DEMAND_PER_GPU = 0.8  # samples/s/GPU at ~50 % MFU for the 4-shot mix


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=48)
    p.add_argument(
        "--screen",
        default="1920x1080",
        type=screen_size(),
        help="screenshot size WxH before resizing",
    )
    p.add_argument("--budget", type=int, default=16384, help="tokens per packed row")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers for the e2e pass")
    p.add_argument("--repeats", type=int, default=3, help="timed passes; the median is reported")
    p.add_argument("--words", default="150,600", help="answer length range in words")
    p.add_argument("--data", default=None, help="existing data_gen output (default: generate)")
    p.add_argument(
        "--scale", type=int, default=10_000, help="also pack this many lengths resampled (seeded)"
    )
    return p.parse_args()


class _Encoded(Dataset):
    """Encoded samples one by one: the pad-to-longest baseline's loader input."""

    def __init__(self, samples: list, encoder: RecordEncoder):
        self.samples, self.encoder = samples, encoder

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.as_tensor(self.encoder(self.samples[i].payload).input_ids).reshape(-1)


def _pad_batch(ids: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    # The original release's collation: right-pad every row to the longest in the batch.
    return pad_sequence(ids, batch_first=True, padding_value=0), sum(x.numel() for x in ids)


def _loader_efficiency(batches) -> float:
    """Tokens that belong to samples / elements of the batch tensors, over all batches."""
    real = total = 0
    for tensor, tokens in batches:
        real += tokens
        total += tensor.numel()
    return real / total


def _pack_report(lengths: list[int], budget: int) -> None:
    total = sum(n for n in lengths if n <= budget)
    bound = total / (math.ceil(total / budget) * budget)
    print(f"  fill upper bound (sum of tokens / fewest rows): {bound:.3f}")
    for strategy, window in (("first_fit", 1024), ("best_fit", 1024), ("best_fit", len(lengths))):
        t0 = time.perf_counter()
        plan = plan_packs(lengths, budget, strategy=strategy, window=window)
        ms = 1000 * (time.perf_counter() - t0)
        print(
            f"  {strategy:9s} window {window:6d}: {len(plan.packs)} rows, "
            f"{plan.num_samples / len(plan.packs):.2f} samples/row, fill {plan.fill:.3f} "
            f"({ms:.0f} ms)"
        )


def main() -> None:
    args = _parse()
    frame = FrameConfig()
    w, h = args.screen
    lo, hi = (int(v) for v in args.words.split(","))
    tmp = tempfile.TemporaryDirectory()
    data = Path(args.data) if args.data else Path(tmp.name)
    if not args.data:
        sizes = ((w, h), (w, h), (w, h), (w, h))  # four distinct screens of the same size
        write_dataset(data, n_train=args.samples, n_val=0, sizes=sizes, words=(lo, hi))
    processor = tiny_processor(min_pixels=frame.min_pixels, max_pixels=frame.max_pixels)
    encoder = RecordEncoder(processor, frame, data)
    samples = load_samples(data, "train")
    print(f"{len(samples)} samples, screens {w}x{h}, frame max {frame.max_pixels} px")

    # One worker, in process: encode + collate every sample, repeated; median samples/s.
    rates = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for s in samples:
            collate_pack([encoder(s.payload)])
        rates.append(len(samples) / (time.perf_counter() - t0))
    per_worker = statistics.median(rates)
    demand = GPUS_PER_NODE * DEMAND_PER_GPU
    print(f"encode+collate, in process: median {per_worker:.2f} samples/s (runs {_fmt(rates)})")
    print(f"workers per 8-GPU node for {demand:.1f} samples/s: {demand / per_worker:.1f}")

    lengths = compute_lengths(samples, encoder, Quarantine())
    plan = plan_packs(lengths, args.budget, strategy="best_fit")
    print(
        f"tokens/sample: median {statistics.median(lengths):.0f}, "
        f"min {min(lengths)}, max {max(lengths)}; too long for the budget: {len(plan.too_long)}"
    )

    # End to end through the training DataLoader; efficiency from the batch tensors it yields.
    rates, packed_eff = [], 0.0
    for _ in range(args.repeats):
        loader = build_loader(
            samples, plan.packs, encoder, num_workers=args.workers, prefetch_factor=2,
            pin_memory=False,
        )  # fmt: skip
        t0 = time.perf_counter()
        batches = [(b.inputs["input_ids"], sum(b.meta.seq_lens)) for b in loader]
        rates.append(plan.num_samples / (time.perf_counter() - t0))
        packed_eff = _loader_efficiency(batches)
    per_worker_e2e = [r / max(1, args.workers) for r in rates]
    print(
        f"DataLoader, {args.workers} workers: median {statistics.median(rates):.2f} samples/s, "
        f"{statistics.median(per_worker_e2e):.2f} samples/s per worker "
        f"(runs {_fmt(per_worker_e2e)} per worker)"
    )
    padded = DataLoader(
        _Encoded(samples, encoder), batch_size=2, num_workers=args.workers, collate_fn=_pad_batch
    )
    padded_eff = _loader_efficiency(list(padded))
    print(
        f"token efficiency from loader batches (sample tokens / batch tensor elements): "
        f"packed rows {packed_eff:.3f}, pad-to-longest batch 2 {padded_eff:.3f}"
    )
    print(
        f"packed rows (best fit, budget {args.budget}): {len(plan.packs)} rows, "
        f"{plan.num_samples / len(plan.packs):.2f} samples/row, budget fill {plan.fill:.3f}"
    )
    print(f"packing these {len(lengths)} lengths, budget {args.budget}:")
    _pack_report(lengths, args.budget)
    if args.scale:
        # A full dataset packs better than a few dozen samples (fewer partial rows at the end of
        # each window); resample the measured lengths to see the steady-state fill.
        rng = random.Random(0)
        big = [rng.choice(lengths) for _ in range(args.scale)]
        print(
            f"packing {args.scale} resampled lengths, budget {args.budget} "
            f"(pad-to-longest batch 2: {pad_to_longest_efficiency(big, 2):.3f}):"
        )
        _pack_report(big, args.budget)
    tmp.cleanup()


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
