"""Ingest throughput: annotation lines per second on one core, header-only image checks.

    python benchmarks/bench_ingest.py                      # >= 20,000 lines, one core
    python benchmarks/bench_ingest.py --lines 50000 --profile

Generates a synthetic ScaleCUA-format corpus (small screens: image size does not matter for the
header check, which reads a fixed number of bytes per file) into a cache folder, reuses it on
later runs, then times ``ingest`` pinned to one CPU core. Target: >= 5,000 lines/s.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from data_gen import sample_corpus
from data_gen.ingest import IngestConfig, ingest
from data_gen.sample_corpus import SampleConfig, make_sample

SIZES = {"desktop_size": (320, 180), "web_size": (320, 200), "phone_size": (180, 400)}
LINES_PER_EPISODE = 5.5  # below the ~6.1 measured on generated corpora, so the size is reached


def corpus(cache: Path, lines: int, seed: int) -> Path:
    """A cached corpus with at least ``lines`` annotation lines."""
    episodes = int(lines / LINES_PER_EPISODE) + 50
    # The generator's source is part of the cache key: a changed generator means a new corpus.
    src = sorted(Path(sample_corpus.__file__).parent.glob("*.py"))
    version = hashlib.sha256(b"".join(p.read_bytes() for p in src)).hexdigest()[:10]
    root = cache / f"corpus-{episodes}-{seed}-{version}"
    if not (root / "meta.json").exists():
        t = time.perf_counter()
        made = make_sample(
            root, SampleConfig(trajectories=episodes, seed=seed, **SIZES), progress=False
        )
        print(
            f"generated {made.lines} lines, {made.images} images in {time.perf_counter() - t:.1f} s"
        )
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000, help="minimum corpus size in lines")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", default=os.path.join(tempfile.gettempdir(), "hivig-bench-ingest")
    )
    parser.add_argument("--verify-images", default="header", choices=("none", "header", "full"))
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--profile", action="store_true", help="print the top functions")
    args = parser.parse_args()

    root = corpus(Path(args.cache), args.lines, args.seed)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    cfg = IngestConfig(verify_images=args.verify_images)
    walls: list[float] = []
    cpus: list[float] = []
    stats: dict = {}
    for _ in range(args.repeats):
        out = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
        wall, cpu = time.perf_counter(), time.process_time()
        res = ingest(root, out, cfg, progress=False)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        stats = res.stats
        shutil.rmtree(out)
    images = sum(1 for _ in root.glob("data/**/*.png"))
    print(json.dumps(stats))
    n = stats["lines"]
    med_wall, med_cpu = statistics.median(walls), statistics.median(cpus)
    wall = f"wall {med_wall:.2f} s = {n / med_wall:,.0f} lines/s"
    cpu = f"cpu {med_cpu:.2f} s = {n / med_cpu:,.0f} lines/s"
    runs = ", ".join(f"{n / w:,.0f}" for w in walls)
    print(
        f"ingest: {n} lines ({n / images:.2f} lines per image), "
        f"verify_images={args.verify_images}, one core, median of {args.repeats}: {wall}; {cpu}"
    )
    print(f"runs (wall lines/s): {runs}; target >= 5,000 lines/s")
    if args.profile:
        out = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
        prof = cProfile.Profile()
        prof.runcall(ingest, root, out, cfg, progress=False)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
