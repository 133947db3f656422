"""A small synthetic data_gen output (SFT records + PNG screenshots) for CPU runs and benchmarks.

    python -c "from train.synthetic import write_dataset; write_dataset('runs/gen', n_train=32)"

Samples mix history and critique kinds, 1-3 screenshots each (with point or arrow marks) and
answers of varying length, so packs are heterogeneous like the real data.
"""

from __future__ import annotations

import random
from pathlib import Path

from hivig.messages import ArrowMark, ImageRef, PointMark, TextPart
from hivig.records import (
    ImageSlot,
    Labels,
    SFTRecord,
    records_dir,
    write_manifest,
    write_records,
)
from hivig.tiny import synthetic_screenshot

# Small screens keep tiny-model runs fast; the benchmark passes real screen sizes instead.
DEFAULT_SIZES = ((200, 90), (100, 60), (64, 64), (160, 120))
_DIMENSIONS = ("Grounding/Spatial Error", "Observation Neglect", "Semantic Error")


def _target(kind: str, rng: random.Random, verdict: str, words: int) -> str:
    body = " ".join(
        rng.choice(("button", "menu", "field", "saved", "opened", "click")) for _ in range(words)
    )
    if kind == "history":
        return (
            f"<think>\n{body}\n</think>\n\n<summary>\nProgress Summary: {body}\n"
            "Last Action Result: the dialog opened.\n</summary>"
        )
    dim = f"Error Dimension: {rng.choice(_DIMENSIONS)}\n" if verdict == "Bad" else ""
    return (
        f"<think>\n{body}\n</think>\n\n<criticism>\nOverall Grading: {verdict}\n{dim}"
        f"Explanation: {body}.\n</criticism>"
    )


def _record(i: int, split: str, images: list[str], rng: random.Random, words: int) -> SFTRecord:
    kind = "history" if i % 3 == 0 else "critique"
    verdict = None if kind == "history" else rng.choice(("Good", "Bad"))
    labels = Labels(verdict=verdict)
    n_img = 1 + i % 3
    refs = []
    for k in range(n_img):
        mark = PointMark(rng.randint(0, 1000), rng.randint(0, 1000)) if k == n_img - 1 else None
        if mark is not None and i % 5 == 0:
            mark = ArrowMark(100, 100, rng.randint(0, 1000), rng.randint(0, 1000))
        refs.append(ImageRef(images[(i + k) % len(images)], marks=(mark,) if mark else ()))
    user = (*(ImageSlot(k) for k in range(n_img)), TextPart(f"Step {i}: judge the last action."))
    target = _target(kind, rng, verdict or "Good", words)
    if verdict == "Bad":
        dim = target.split("Error Dimension: ")[1].split("\n")[0]
        labels = Labels(verdict="Bad", error_dimension=dim, generator="programmatic")
    return SFTRecord(
        id=f"{split}-{i:05d}",
        kind=kind,
        platform="ubuntu",
        prompt_version=f"critic_{kind}_v1",
        trajectory_id=f"traj-{i // 4}",
        episode_key=f"ep-{i // 4}",
        step_index=i % 4,
        split=split,
        images=tuple(refs),
        system="You are a critic of computer-use agents.",
        user=user,
        target=target,
        labels=labels,
    )


def write_dataset(
    out: str | Path,
    *,
    n_train: int = 32,
    n_val: int = 8,
    seed: int = 0,
    sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES,
    words: tuple[int, int] = (4, 40),
) -> Path:
    """Write ``out/images/*.png`` and ``out/dataset/records/{train,val}/part-*.parquet``.

    The data_gen layout, with a manifest pointing image paths at ``out``; returns ``out``.
    """
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    images = []
    for k, (w, h) in enumerate(sizes):
        name = f"images/screen_{k}.png"
        synthetic_screenshot(w, h, seed=seed + k).save(out / name)
        images.append(name)
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        if n:
            recs = [_record(i, split, images, rng, rng.randint(*words)) for i in range(n)]
            write_records(recs, records_dir(out) / split, overwrite=True)
    write_manifest(records_dir(out), out)
    return out
