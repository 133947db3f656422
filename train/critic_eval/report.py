"""The outputs of a run: ``report.md``, ``confusion.png``, ``metrics.json`` and
``predictions/<backend>.jsonl`` (the run description is written by ``hivig.config``)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from train.critic_eval.config import CriticEvalError
from train.critic_eval.metrics import DIMENSION_NAMES, BackendResult
from train.critic_eval.truth import CHANGED, NO_CHANGE


def prepare_out(out: str) -> Path:
    """Create the output folder and check it is writable, before any sample is answered.

    Raises:
        CriticEvalError: The folder cannot be created or written.
    """
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as e:
        raise CriticEvalError(f"--out {path}: cannot write there ({e.strerror or e})") from e
    return path


def percent(value: float | None) -> str:
    """``12.5 %`` for 0.125; a dash for a ratio without samples (``None`` or NaN)."""
    return (
        "—"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{100 * value:.1f} %")
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _get(metrics: dict[str, Any], path: str) -> Any:
    value: Any = metrics
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


_CRITIQUE_ROWS: tuple[tuple[str, str], ...] = (
    ("verdict accuracy", "verdict_accuracy"),
    ("Bad precision", "bad_precision"),
    ("Bad recall", "bad_recall"),
    ("Bad F1", "bad_f1"),
    ("error-dimension accuracy", "dimension_accuracy"),
    ("error-dimension accuracy (detected Bad)", "dimension_accuracy_detected"),
    ("verdict accuracy, intent masked", "intent.masked.verdict_accuracy"),
    ("verdict accuracy, intent shown", "intent.unmasked.verdict_accuracy"),
    ("error-dimension accuracy, intent masked", "intent.masked.dimension_accuracy"),
    ("error-dimension accuracy, intent shown", "intent.unmasked.dimension_accuracy"),
    ("parse failures", "parse_failure_rate"),
    ("backend errors", "backend_error_rate"),
)
_HISTORY_ROWS: tuple[tuple[str, str], ...] = (
    ("well-formed", "well_formed_rate"),
    ("Last Action Result agreement", "last_result_agreement"),
    ("agreement, screen changed", f"per_transition.{CHANGED}.last_result_agreement"),
    ("agreement, no change", f"per_transition.{NO_CHANGE}.last_result_agreement"),
    ("agreement, intent masked", "intent.masked.last_result_agreement"),
    ("agreement, intent shown", "intent.unmasked.last_result_agreement"),
    ("labels agreeing with the pixels", "target_agreement"),
    ("parse failures", "parse_failure_rate"),
    ("backend errors", "backend_error_rate"),
)


def _rows(
    ms: Sequence[dict[str, Any]], part: str, spec: Sequence[tuple[str, str]]
) -> list[list[str]]:
    counts = [["samples", *(str(m[part]["n"]) for m in ms)]]
    return counts + [[label, *(percent(_get(m[part], path)) for m in ms)] for label, path in spec]


def _cell(group: dict[str, Any] | None, first: str, second: str | None = None) -> str:
    if group is None:
        return "—"
    text = percent(group[first])
    if second is not None:
        text += f" / {percent(group[second])}"
    return f"{text} (n={group['n']})"


def _source_rows(
    ms: Sequence[dict[str, Any]], part: str, first: str, second: str | None = None
) -> list[list[str]]:
    """One row per ``provenance.source``, per run benchmark, and the hard cases."""
    groups: list[tuple[str, str, str]] = [
        (s, "per_source", s) for s in sorted({s for m in ms for s in m[part]["per_source"]})
    ]
    benchmarks = sorted({b for m in ms for b in m[part]["per_benchmark"]})
    groups += [(f"run: {b}", "per_benchmark", b) for b in benchmarks]
    rows = [
        [label, *(_cell(m[part][kind].get(key), first, second) for m in ms)]
        for label, kind, key in groups
    ]
    rows.append(["hard cases", *(_cell(m[part]["hard_cases"], first, second) for m in ms)])
    return rows


def render_report(results: Sequence[BackendResult], header: dict[str, Any]) -> str:
    """The markdown report: one column per backend, the same rows for each."""
    names = [r.name for r in results]
    ms = [r.metrics for r in results]
    out = ["# Critic benchmark", ""]
    out += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    out += ["", "## Critique", ""]
    crit = _rows(ms, "critique", _CRITIQUE_ROWS)
    crit.insert(1, ["Bad samples", *(str(m["critique"]["n_bad"]) for m in ms)])
    out += _table(["metric", *names], crit)
    out += ["", "### Error-dimension accuracy per dimension", ""]
    dims = [
        [name, *(_cell(m["critique"]["per_dimension"][name], "accuracy") for m in ms)]
        for name in DIMENSION_NAMES
    ]
    out += _table(["dimension", *names], dims)
    out += ["", "### Per platform: verdict accuracy / error-dimension accuracy", ""]
    platforms = sorted({p for m in ms for p in m["critique"]["per_platform"]})
    plat = [
        [
            p,
            *(
                _cell(
                    m["critique"]["per_platform"].get(p), "verdict_accuracy", "dimension_accuracy"
                )
                for m in ms
            ),
        ]
        for p in platforms
    ]
    out += _table(["platform", *names], plat)
    out += ["", "### By source: verdict accuracy / error-dimension accuracy", ""]
    out += _table(
        ["samples", *names],
        _source_rows(ms, "critique", "verdict_accuracy", "dimension_accuracy"),
    )
    out += ["", "## History", ""]
    out += _table(["metric", *names], _rows(ms, "history", _HISTORY_ROWS))
    out += ["", "### By source: Last Action Result agreement", ""]
    out += _table(["samples", *names], _source_rows(ms, "history", "last_result_agreement"))
    out += ["", "### Per platform: Last Action Result agreement", ""]
    platforms = sorted({p for m in ms for p in m["history"]["per_platform"]})
    plat = [
        [p, *(_cell(m["history"]["per_platform"].get(p), "last_result_agreement") for m in ms)]
        for p in platforms
    ]
    out += _table(["platform", *names], plat)
    out += ["", "## Answers", ""]
    ans = [
        ["truncated at --max-tokens", *(str(m["truncated"]) for m in ms)],
        ["median latency (s)", *(_num(m["latency_s_median"]) for m in ms)],
        ["mean completion tokens", *(_num(m["completion_tokens_mean"]) for m in ms)],
    ]
    out += _table(["", *names], ans)
    failures = [Counter(m["critique"]["failures"]) + Counter(m["history"]["failures"]) for m in ms]
    reasons = sorted({k for f in failures for k in f})
    if reasons:
        out += ["", "### Failures (samples)", ""]
        out += _table(["reason", *names], [[k, *(str(f[k]) for f in failures)] for k in reasons])
    return "\n".join(out) + "\n"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def _abbrev(name: str) -> str:
    words = [w for w in re.split(r"[^A-Za-z]+", name) if w and w.lower() != "and"]
    return "".join(w[0].upper() for w in words)


def write_confusion_png(results: Sequence[BackendResult], path: Path) -> None:
    """Critique (Good + 12 dimensions) and history (transition) confusion matrices per backend.

    Rows are the truth, columns the prediction (``Unparsed``: no usable answer); one row of
    panels per backend. Cells show counts, shaded by their share of the row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(results),
        2,
        figsize=(14, 6.2 * len(results)),
        gridspec_kw={"width_ratios": [4, 1.4]},
        squeeze=False,
    )
    for (ax_c, ax_h), result in zip(axes, results, strict=True):
        for ax, part, short in ((ax_c, "critique", True), (ax_h, "history", False)):
            conf = result.metrics[part]["confusion"]
            matrix = conf["matrix"]
            cols = [_abbrev(c) if short and c in DIMENSION_NAMES else c for c in conf["columns"]]
            rows = [
                f"{r} ({_abbrev(r)})" if short and r in DIMENSION_NAMES else r for r in conf["rows"]
            ]
            # Shade by share of the row, so a rare class reads as clearly as a common one; the
            # cells print the counts.
            shares = [[v / (sum(line) or 1) for v in line] for line in matrix]
            ax.imshow(shares, cmap="Blues", aspect="auto", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
            ax.set_yticks(range(len(rows)), rows, fontsize=8)
            for i, line in enumerate(matrix):
                for j, v in enumerate(line):
                    if v:
                        colour = "white" if shares[i][j] > 0.5 else "black"
                        ax.text(j, i, str(v), ha="center", va="center", fontsize=8, color=colour)
            ax.set_xlabel("predicted")
            ax.set_ylabel("truth")
            ax.set_title(f"{result.name}: {part} (n={result.metrics[part]['n']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    out: Path, results: Sequence[BackendResult], header: dict[str, Any], skipped: dict[str, str]
) -> None:
    """Predictions, ``metrics.json``, ``report.md`` and ``confusion.png`` into ``out``."""
    preds = out / "predictions"
    preds.mkdir(parents=True, exist_ok=True)
    for result in results:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", result.name).strip("_") or "backend"
        with (preds / f"{slug}.jsonl").open("w", encoding="utf-8") as fh:
            for row in result.rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    metrics = {
        **header,
        "skipped": dict(sorted(Counter(skipped.values()).items())),
        "backends": {r.name: {"spec": r.spec, **r.metrics} for r in results},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_report(results, header), encoding="utf-8")
    write_confusion_png(results, out / "confusion.png")
