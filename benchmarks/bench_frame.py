"""Time to turn a 1920×1080 PNG screenshot into a marked canonical frame, on one CPU core.

    python benchmarks/bench_frame.py                # 50 runs after 5 warm-up runs
    python benchmarks/bench_frame.py --runs 100 --resize pil-bicubic   # compare with Pillow
    HIVIG_RESIZE_KERNEL=numpy python benchmarks/bench_frame.py  # the torch-free kernel

Each run decodes the PNG from disk, converts to RGB, resizes to the smart_resize frame (1344×768 at
1,048,576 px) and draws one point marker and one arrow: ``hivig.vision.canonical_frame``. The
stages are also timed one by one for a breakdown. Pillow does not multi-thread decode or resize,
and torch is pinned to one thread (``torch.set_num_threads(1)``), so a run uses one core; pin the
process too (``taskset -c 0``) on a shared machine. Budget: median ≤ 25 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from hivig.messages import ArrowMark, PointMark
from hivig.vision import (
    _frame,
    canonical_frame,
    draw_marks,
    load_image,
    resize_kernel,
    smart_resize,
)

BUDGET_MS = 25.0
# Pillow filters for comparison with the library's resize (torch antialiased bicubic).
PIL_FILTERS = {
    "pil-bicubic": Image.Resampling.BICUBIC,
    "pil-bilinear": Image.Resampling.BILINEAR,
    "pil-lanczos": Image.Resampling.LANCZOS,
}


def synthetic_screenshot(width: int, height: int, seed: int) -> Image.Image:
    """A desktop-like screen: flat panels, a title bar, buttons, icons and many lines of text."""
    rng = random.Random(seed)
    img = Image.new("RGB", (width, height), (243, 243, 243))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=14)
    draw.rectangle((0, 0, width, 40), fill=(32, 33, 36))
    draw.rectangle((0, 40, 260, height - 48), fill=(225, 228, 232))
    draw.rectangle((0, height - 48, width, height), fill=(20, 20, 24))
    words = [
        "file",
        "edit",
        "view",
        "settings",
        "search",
        "open",
        "close",
        "save",
        "apply",
        "cancel",
        "network",
        "display",
    ]
    for y in range(60, height - 60, 22):
        x = 280
        while x < width - 200:
            word = " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
            draw.text((x, y), word, fill=(20, 20, 20), font=font)
            x += 40 + 9 * len(word)
    for _ in range(40):
        x, y = rng.randrange(0, width - 120), rng.randrange(40, height - 80)
        colour = tuple(rng.randrange(256) for _ in range(3))
        draw.rounded_rectangle((x, y, x + rng.randint(24, 120), y + 28), 6, fill=colour)
    for i in range(20):
        draw.text((12, 60 + 30 * i), f"Item {i}", fill=(0, 0, 0), font=font)
    return img


MARKS = (PointMark(503, 271), ArrowMark(120, 800, 640, 420))


def _time(fn, runs: int, warmup: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process-CPU milliseconds of ``fn()`` per run, after ``warmup`` runs.

    CPU time is reported next to wall time because a shared machine inflates wall time with
    other processes' work; with one thread the two agree on an idle core.
    """
    wall, cpu = [], []
    for i in range(warmup + runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if i >= warmup:
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
    return wall, cpu


def _stages(path: Path) -> dict[str, object]:
    """The pipeline split into its parts, each a zero-argument callable (for the breakdown)."""
    decoded = load_image(path)
    h, w = smart_resize(decoded.height, decoded.width, 32, 65_536, 1_048_576)
    resized = _frame.resize_rgb(decoded, w, h)
    return {
        "decode": lambda: load_image(path),
        "resize": lambda: _frame.resize_rgb(decoded, w, h),
        "draw marks": lambda: draw_marks(resized, MARKS),
        "canonical_frame": lambda: canonical_frame(
            path, min_pixels=65_536, max_pixels=1_048_576, marks=MARKS
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic screenshot")
    parser.add_argument(
        "--resize",
        choices=["library", *sorted(PIL_FILTERS)],
        default="library",
        help="resize implementation: the library's, or a Pillow filter for comparison",
    )
    args = parser.parse_args()

    # The resize runs in torch; one intra-op thread keeps the measurement on one core.
    torch.set_num_threads(1)
    if args.resize != "library":
        pil_filter = PIL_FILTERS[args.resize]
        _frame.resize_rgb = lambda img, w, h: img.resize((w, h), pil_filter)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "screen.png"
        synthetic_screenshot(1920, 1080, args.seed).save(path)
        size_kb = path.stat().st_size / 1024
        results = {name: _time(fn, args.runs, args.warmup) for name, fn in _stages(path).items()}

    resize = f"{resize_kernel()}-{_frame.RESAMPLE}" if args.resize == "library" else args.resize
    print(f"input: 1920x1080 PNG, {size_kb:.0f} KB; resize: {resize}; runs: {args.runs}")
    print(f"{'stage':<18}{'wall median ms':>16}{'wall p90 ms':>13}{'cpu median ms':>15}")
    for name, (wall, cpu) in results.items():
        p90 = statistics.quantiles(wall, n=10)[-1]
        print(
            f"{name:<18}{statistics.median(wall):>16.2f}{p90:>13.2f}{statistics.median(cpu):>15.2f}"
        )
    wall, cpu = results["canonical_frame"]
    median = statistics.median(wall)
    verdict = "within" if median <= BUDGET_MS else "OVER"
    print(
        f"result: canonical_frame median {median:.2f} ms wall, {statistics.median(cpu):.2f} ms "
        f"CPU per 1920x1080 frame ({verdict} the {BUDGET_MS:.0f} ms budget)"
    )


if __name__ == "__main__":
    main()
