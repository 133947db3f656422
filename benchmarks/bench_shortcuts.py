"""Shortcut audit of the demo pipeline: text-only AUCs per dimension family, over corpus seeds.

    python benchmarks/bench_shortcuts.py                      # seeds 0 1 2, 60 trajectories
    python benchmarks/bench_shortcuts.py --seeds 0 --trajectories 60
    python benchmarks/bench_shortcuts.py --data OUT [OUT ...]  # audit finished runs only

For each seed it writes a ``make-sample`` corpus, runs ``data_gen run`` with the demo config
(offline annotator) and audits the exported records (``data_gen.audit``). It prints the AUC of
every family and probe per seed, their median and that of every dimension's step probe over
the runs, the achieved Good:Bad ratio, and the audit's own run time (median of three, against
the time to read the records in the same process).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data_gen.audit import PROBES, shortcut_audit
from hivig.records import read_records, records_dir

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "data_gen" / "demo.yaml"


def _records(out: Path) -> list:
    root = records_dir(out)
    return [
        r for s in ("train", "val", "test") if (root / s).is_dir() for r in read_records(root / s)
    ]


def _demo(seed: int, trajectories: int, work: Path) -> Path:
    corpus, out = work / f"corpus{seed}", work / f"data{seed}"
    py = sys.executable
    subprocess.run(
        [py, "-m", "data_gen", "make-sample", "--out", str(corpus), "--quiet",
         "--trajectories", str(trajectories), "--seed", str(seed)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    # Exit 1 (a failed audit) still leaves the dataset to measure.
    subprocess.run(
        [py, "-m", "data_gen", "run", "--config", str(DEMO), f"corpus={corpus}", f"out={out}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return out


def main() -> None:
    """Run the benchmark and print its table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--trajectories", type=int, default=60)
    p.add_argument("--data", nargs="+", type=Path, help="audit these finished runs instead")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        outs = args.data or [_demo(s, args.trajectories, Path(tmp)) for s in args.seeds]
        table: dict[str, list[float]] = {}
        for out in outs:
            t0 = time.perf_counter()
            records = _records(out)
            t_read = time.perf_counter() - t0
            times, audit = [], None
            for _ in range(3):
                t0 = time.perf_counter()
                audit = shortcut_audit(records)
                times.append(time.perf_counter() - t0)
            crit = [r for r in records if r.kind == "critique"]
            good = sum(r.labels.verdict == "Good" for r in crit)
            print(
                f"{out.name}: Good {good} Bad {len(crit) - good}; audit "
                f"{statistics.median(times):.2f} s (median of 3) vs reading records "
                f"{t_read:.2f} s; failed: {audit['failed'] or 'none'}"
            )
            for family, row in audit["families"].items():
                for probe in PROBES:
                    auc = row[probe]["auc"]
                    print(f"  {family:13s} {probe:8s} AUC {auc}")
                    if auc is not None:
                        table.setdefault(f"{family}/{probe}", []).append(auc)
            for key, row in audit["dimensions"].items():
                if row["step"]["auc"] is not None:
                    table.setdefault(f"{key}/step", []).append(row["step"]["auc"])
        print("median (min-max) over runs:")
        for key, values in table.items():
            print(
                f"  {key:40s} {statistics.median(values):.3f} "
                f"({min(values):.3f}-{max(values):.3f}, {len(values)} runs)"
            )


if __name__ == "__main__":
    main()
