"""Time per observe of the recurrence detector on a 1920×1080 frame, on one CPU core.

    taskset -c 1 python benchmarks/bench_detector.py                 # 5 rounds of 60 observes
    taskset -c 1 python benchmarks/bench_detector.py --rounds 9 --observes 100

Each observe is one ``hivig.recurrence.update`` call on an in-memory 1920×1080 RGB screen, in
five scenarios:

- ``unchanged``: a click; the same screen with its taskbar clock ticking (masked: the fast path);
- ``dialog``: a click; a dialog opens and closes near it (a partial change, the region check runs);
- ``full``: a click; two unrelated screens alternate (every pixel changes: the slowest path);
- ``typing``: a ``type`` action (no target point); a few characters appear in a field and go
  (the untargeted rule runs);
- ``wait``: a ``wait`` action; a small spinner turns through 8 phases (the no-action learning
  path counts hits on every step).

The baseline is ``hivig.vision.canonical_frame`` of the same frame (decoded image in, the
1344×768 model frame out), timed in the same round, so the ratio survives a shared machine's
speed swings. Every round reports medians; the result is the median over rounds. Pillow and
numpy do not multi-thread these operations and torch (the canonical frame's resize) is pinned to
one thread, so pin the process too. Budget: median ≤ 5 ms per observe.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from PIL import Image, ImageDraw, ImageFont

from hivig.actions import Action, LeftClick, Type, Wait
from hivig.recurrence import DetectorConfig, DetectorState, new_state, update
from hivig.tiny import synthetic_screenshot
from hivig.vision import canonical_frame

BUDGET_MS = 5.0
W, H = 1920, 1080
CLICK: list[Action] = [LeftClick((500, 450))]
TYPE: list[Action] = [Type("Acme Ltd")]
WAIT: list[Action] = [Wait(1)]


def _with_clock(
    img: Image.Image,
    text: str,
    dialog: bool = False,
    field: str | None = None,
    spinner: int | None = None,
) -> Image.Image:
    """A copy with a Windows taskbar clock (inside the default mask) and optionally a dialog,
    a text field holding ``field`` or a spinner at phase ``spinner`` (0-7)."""
    out = img.copy()
    draw = ImageDraw.Draw(out)
    font = ImageFont.load_default(size=16)
    draw.rectangle((1700, 1040, W, H), fill=(20, 20, 24))
    draw.text((1800, 1050), text, fill=(255, 255, 255), font=font)
    if dialog:
        draw.rectangle((760, 380, 1160, 600), fill=(250, 250, 250), outline=(0, 0, 0), width=2)
        draw.text((800, 450), "Delete this file?", fill=(0, 0, 0), font=font)
    if field is not None:
        draw.rectangle((700, 600, 1100, 640), fill=(255, 255, 255), outline=(0, 0, 0))
        draw.text((710, 610), field, fill=(0, 0, 0), font=font)
    if spinner is not None:
        draw.rectangle((1300, 300, 1420, 420), fill=(255, 255, 255))
        start = 45 * spinner
        draw.arc((1320, 320, 1400, 400), start, start + 270, fill=(0, 120, 215), width=10)
    return out


def _scenarios() -> dict[str, tuple[list[Image.Image], list[Action]]]:
    base, other = synthetic_screenshot(W, H, 0), synthetic_screenshot(W, H, 1)
    return {
        "unchanged": ([_with_clock(base, f"12:{m:02d}") for m in range(2)], CLICK),
        "dialog": ([_with_clock(base, "12:00"), _with_clock(base, "12:00", dialog=True)], CLICK),
        "full": ([_with_clock(base, "12:00"), _with_clock(other, "12:00")], CLICK),
        "typing": (
            [_with_clock(base, "12:00", field=""), _with_clock(base, "12:00", field="Acme Ltd")],
            TYPE,
        ),
        "wait": ([_with_clock(base, "12:00", spinner=i) for i in range(8)], WAIT),
    }


Timing = tuple[list[float], list[float]]
"""Wall-clock and process-CPU milliseconds per call."""


def _timed(fn, n: int) -> Timing:
    """Wall and CPU milliseconds of ``n`` calls of ``fn()``.

    CPU time is reported next to wall time because other processes on a shared machine inflate
    wall time; with one thread the two agree on an idle core.
    """
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return wall, cpu


def _time_observes(
    frames: list[Image.Image], actions: list[Action], n: int, cfg: DetectorConfig
) -> Timing:
    """Per-``update`` times over ``n`` observes cycling through ``frames``, each after
    ``actions``; the state starts fresh, so learning steps are timed too."""
    holder = {"state": update(new_state("windows"), frames[-1], None, cfg)[0], "i": 0}

    def step() -> None:
        frame = frames[holder["i"] % len(frames)]
        holder["i"] += 1
        holder["state"], _ = update(holder["state"], frame, actions, cfg)

    return _timed(step, n)


def _time_canonical(frame: Image.Image, n: int) -> Timing:
    return _timed(lambda: canonical_frame(frame, min_pixels=65_536, max_pixels=1_048_576), n)


def _time_state_json(frames: list[Image.Image], n: int, cfg: DetectorConfig) -> Timing:
    """Per ``to_json`` + ``from_json`` round trip of a warm state (the gateway persists it)."""
    state, _ = update(new_state("windows"), frames[0], None, cfg)
    state, _ = update(state, frames[1], CLICK, cfg)
    return _timed(lambda: DetectorState.from_json(state.to_json()), n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the result is their median")
    parser.add_argument("--observes", type=int, default=60, help="timed observes per scenario")
    parser.add_argument("--warmup", type=int, default=5, help="untimed observes per round")
    args = parser.parse_args()
    if args.rounds < 1 or args.observes < 2 or args.warmup < 0:
        parser.error("--rounds must be >= 1, --observes >= 2 and --warmup >= 0")

    torch.set_num_threads(1)
    cfg = DetectorConfig()
    scenarios = _scenarios()
    # torch's import leaves ~0.4 M objects that a full cyclic-GC pass walks (~0.3 s); freezing
    # them keeps such rare pauses, which hit any Python code in the process, out of the timings.
    gc.collect()
    gc.freeze()
    names = (*scenarios, "canonical_frame", "state json")
    # name -> clock ("wall"/"cpu") -> one median per round
    rounds: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in names}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}

    def record(name: str, timing: Timing) -> None:
        for clock, values in zip(("wall", "cpu"), timing, strict=True):
            rounds[name][clock].append(statistics.median(values))

    for _ in range(args.rounds):
        for name, (frames, actions) in scenarios.items():
            _time_observes(frames, actions, args.warmup, cfg)
            record(name, _time_observes(frames, actions, args.observes, cfg))
        frame = scenarios["full"][0][0]
        _time_canonical(frame, args.warmup)
        record("canonical_frame", _time_canonical(frame, args.observes))
        record("state json", _time_state_json(scenarios["full"][0], 20, cfg))
        for clock in ("wall", "cpu"):
            slowest = max(rounds[name][clock][-1] for name in scenarios)
            ratios[clock].append(slowest / rounds["canonical_frame"][clock][-1])

    def med(name: str, clock: str) -> float:
        return statistics.median(rounds[name][clock])

    print(f"input: {W}x{H} RGB in memory; {args.rounds} rounds x {args.observes} observes")
    print(f"{'per call':<17}{'wall median ms':>15}{'wall range':>15}{'cpu median ms':>15}")
    for name in names:
        lo, hi = min(rounds[name]["wall"]), max(rounds[name]["wall"])
        spread = f"{lo:.2f}-{hi:.2f}"
        print(f"{name:<17}{med(name, 'wall'):>15.2f}{spread:>15}{med(name, 'cpu'):>15.2f}")
    slowest = max(scenarios, key=lambda name: med(name, "wall"))
    wall, cpu = med(slowest, "wall"), med(slowest, "cpu")
    verdict = (
        f"wall {'within' if wall <= BUDGET_MS else 'OVER'}, "
        f"CPU {'within' if cpu <= BUDGET_MS else 'OVER'}"
    )
    ratio_wall, ratio_cpu = statistics.median(ratios["wall"]), statistics.median(ratios["cpu"])
    print(
        f"result: update median {wall:.2f} ms wall, {cpu:.2f} ms CPU per observe (slowest "
        f"scenario: {slowest}; {verdict} the {BUDGET_MS:.0f} ms budget); {ratio_wall:.3f}x (wall) "
        f"/ {ratio_cpu:.3f}x (CPU) canonical_frame of the same frame in the same rounds"
    )


if __name__ == "__main__":
    main()
