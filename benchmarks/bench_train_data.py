"""Training data path: collator throughput and packing efficiency on a generated dataset.

    python benchmarks/bench_train_data.py                       # defaults: 48 samples, 1920x1080
    python benchmarks/bench_train_data.py --samples 96 --workers 2 --budget 16384

What it measures, per sample at the default canonical frame (max 1,048,576 px):

- encode throughput of one worker (decode PNG → canonical frame + marker → chat template →
  processor → labels → MRoPE positions), in samples/s, and the workers a node needs to feed
  8 GPUs at 0.8 samples/s/GPU (qwen3vl_training.md §16.3);
- end-to-end packed batches through the real DataLoader with ``--workers`` processes;
- packing: tokens in padding-free packs / token budget (fill), versus the pad-to-longest
  efficiency of the original release's batch of 2 (real tokens / allocated tokens).

The processor is the offline tiny one (byte-level tokenizer), so text token counts are ~3-4x
those of the real Qwen tokenizer; image token counts and pixel work are the real ones.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from hivig.config import FrameConfig
from hivig.models.qwen_vl import build_processor
from train.collate import collate_pack
from train.data import Quarantine, build_loader, compute_lengths, load_samples
from train.encode import RecordEncoder
from train.packing import pad_to_longest_efficiency, plan_packs
from train.synthetic import write_dataset

GPUS_PER_NODE = 8
DEMAND_PER_GPU = 0.8  # samples/s/GPU at ~50 % MFU for the 4-shot mix (§16.3)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=48)
    p.add_argument("--screen", default="1920x1080", help="screenshot size WxH before resizing")
    p.add_argument("--budget", type=int, default=16384, help="tokens per packed row")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers for the e2e pass")
    p.add_argument("--repeats", type=int, default=3, help="timed passes; the median is reported")
    p.add_argument("--words", default="150,600", help="answer length range in words")
    p.add_argument("--data", default=None, help="existing data_gen output (default: generate)")
    p.add_argument(
        "--scale", type=int, default=10_000, help="also pack this many lengths resampled (seeded)"
    )
    return p.parse_args()


def main() -> None:
    args = _parse()
    frame = FrameConfig()
    w, h = (int(v) for v in args.screen.split("x"))
    lo, hi = (int(v) for v in args.words.split(","))
    tmp = tempfile.TemporaryDirectory()
    data = Path(args.data) if args.data else Path(tmp.name)
    if not args.data:
        sizes = ((w, h), (w, h), (w, h), (w, h))  # four distinct screens of the same size
        write_dataset(data, n_train=args.samples, n_val=0, sizes=sizes, words=(lo, hi))
    processor = build_processor(None, min_pixels=frame.min_pixels, max_pixels=frame.max_pixels)
    encoder = RecordEncoder(processor, frame, data)
    samples = load_samples(data, "train")
    print(f"{len(samples)} samples, screens {args.screen}, frame max {frame.max_pixels} px")

    # One worker: encode + collate every sample, repeated; median samples/s.
    rates = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for s in samples:
            collate_pack([encoder(s.payload)])
        rates.append(len(samples) / (time.perf_counter() - t0))
    per_worker = statistics.median(rates)
    demand = GPUS_PER_NODE * DEMAND_PER_GPU
    print(f"encode+collate, 1 worker: median {per_worker:.2f} samples/s (runs {_fmt(rates)})")
    print(f"workers per 8-GPU node for {demand:.1f} samples/s: {demand / per_worker:.1f}")

    # Packing versus pad-to-longest with batch 2.
    lengths = compute_lengths(samples, encoder, Quarantine())
    plan = plan_packs(lengths, args.budget, strategy="best_fit")
    print(
        f"tokens/sample: median {statistics.median(lengths):.0f}, "
        f"min {min(lengths)}, max {max(lengths)}; too long for the budget: {len(plan.too_long)}"
    )
    print(
        f"packing (best fit, budget {args.budget}): {len(plan.packs)} packs, "
        f"{plan.num_samples / len(plan.packs):.2f} samples/pack, budget fill {plan.fill:.3f}, "
        "padding-free token efficiency 1.000"
    )
    print(f"pad-to-longest, batch 2: token efficiency {pad_to_longest_efficiency(lengths, 2):.3f}")
    if args.scale:
        # A full dataset packs better than a few dozen samples (fewer partial rows at the end of
        # each window); resample the measured lengths to see the steady-state fill.
        rng = random.Random(0)
        big = [rng.choice(lengths) for _ in range(args.scale)]
        sim = plan_packs(big, args.budget, strategy="best_fit")
        print(
            f"packing {args.scale} resampled lengths: budget fill {sim.fill:.3f}, "
            f"pad-to-longest batch 2: {pad_to_longest_efficiency(big, 2):.3f}"
        )

    # End to end: the training DataLoader over the pack plan.
    rates = []
    for _ in range(args.repeats):
        loader = build_loader(
            samples,
            plan.packs,
            encoder,
            num_workers=args.workers,
            prefetch_factor=2,
            pin_memory=False,
        )
        t0 = time.perf_counter()
        n = sum(len(b.meta.sample_ids) for b in loader)
        rates.append(n / (time.perf_counter() - t0))
    print(
        f"DataLoader, {args.workers} workers: median {statistics.median(rates):.2f} samples/s "
        f"(runs {_fmt(rates)})"
    )
    tmp.cleanup()


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
