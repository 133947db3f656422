"""How often the cheap-signal ranking of ``serve.diagnose`` finds an injected root cause.

Generates failed runs with a known injected error (``serve.diagnose.synthetic``: dead click,
wrong element, premature DONE, typing without focus, wrong scroll direction, malformed code;
kinds in turn over the seeds), writes each as an OSWorld result folder and as a gateway trace
(with a simulated, imperfect critic and history model), diagnoses both without a backend and
reports:

* hit@1: the reported root-cause step is the injected step;
* hit@3: the injected step is among the three best-ranked candidates;
* dim@1: share of all cases where hit@1 holds and the reported critic dimension is the injected
  one;
* the same figures for a baseline that blames the last steps (last step for @1, last three
  for @3), measured on the same cases;
* the median diagnosis time per case.

    python benchmarks/bench_diagnose.py                 # 60 cases, seeds 0..59
    python benchmarks/bench_diagnose.py --cases 120 --seed0 1000 --per-kind
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from serve.diagnose import diagnose
from serve.diagnose.synthetic import make_case, write_osworld, write_trace


def _score(case, result) -> dict[str, int]:
    top3 = [c["step"] for c in result.ranking[:3]]
    n = len(case.steps)
    hit1 = result.root_cause_step == case.root_step
    return {
        "hit1": int(hit1),
        "hit3": int(case.root_step in top3),
        "dim1": int(hit1 and result.error["hivig_dimension"] == case.dimension),
        "base1": int(case.root_step == n),
        "base3": int(case.root_step > n - 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--per-kind", action="store_true", help="also print figures per error kind")
    args = ap.parse_args()
    totals: dict[str, dict[str, int]] = {"osworld": defaultdict(int), "trace": defaultdict(int)}
    kinds: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.cases):
            case = make_case(args.seed0 + i)
            inputs = {
                "osworld": write_osworld(case, Path(tmp) / f"os{i}"),
                "trace": write_trace(case, Path(tmp) / f"gw{i}"),
            }
            for fmt, path in inputs.items():
                start = time.perf_counter()
                result = diagnose(path)
                times.append(time.perf_counter() - start)
                for k, v in _score(case, result).items():
                    totals[fmt][k] += v
                    kinds[(fmt, case.kind)][k] += v
                kinds[(fmt, case.kind)]["n"] += 1
    n = args.cases
    print(f"cases: {n} (seeds {args.seed0}..{args.seed0 + n - 1}), no backend (cheap signals)")
    print(f"{'input':<9} {'hit@1':>6} {'hit@3':>6} {'dim@1':>6}   last-steps baseline @1 / @3")
    for fmt, t in totals.items():
        print(
            f"{fmt:<9} {t['hit1'] / n:6.2f} {t['hit3'] / n:6.2f} {t['dim1'] / n:6.2f}   "
            f"{t['base1'] / n:.2f} / {t['base3'] / n:.2f}"
        )
    if args.per_kind:
        for (fmt, kind), t in sorted(kinds.items()):
            m = t["n"]
            print(
                f"  {fmt:<8} {kind:<15} n={m:<3} "
                f"hit@1 {t['hit1'] / m:.2f}  hit@3 {t['hit3'] / m:.2f}"
            )
    print(f"median diagnosis time per input: {1000 * statistics.median(times):.0f} ms")


if __name__ == "__main__":
    main()
