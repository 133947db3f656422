"""Dataset statistics (``stats.json``) and the HTML report with sample cards (``report.html``).

Everything here is a pure function of the exported samples and the merged counters, so the report
is byte-identical across reruns, resumes and shard counts. Card images are written next to the
report and linked relatively, so the dataset folder can be copied anywhere.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from PIL import Image

from hivig.taxonomy import DIMENSIONS
from hivig.vision import smart_resize

HISTOGRAM_EDGES = (0, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384)
"""Bucket edges of the token-length histogram, in tokens."""

CHARS_PER_TOKEN = 4
"""Text token estimate: UTF-8 bytes per token for English prompt text (an estimate; the report
says so). Image tokens are exact for the canonical frame: one per 32x32 pixel block."""


class ImageSizes:
    """Pixel sizes of screenshots by path (header read only, memoised)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._memo: dict[str, tuple[int, int] | None] = {}

    def __call__(self, path: str) -> tuple[int, int] | None:
        if path not in self._memo:
            try:
                with Image.open(self.root / path) as img:
                    self._memo[path] = img.size
            except OSError:
                self._memo[path] = None
        return self._memo[path]


def estimated_tokens(
    spec: dict[str, Any], sizes: ImageSizes, min_pixels: int, max_pixels: int, factor: int
) -> int:
    """Estimated prompt + target tokens of a sample on the canonical frame."""
    chars = len(spec["target"].encode("utf-8"))
    tokens = 0
    for message in spec["messages"]:
        for part in message["content"]:
            if "text" in part:
                chars += len(part["text"].encode("utf-8"))
                continue
            size = sizes(part["image"])
            if size is not None:
                h, w = smart_resize(size[1], size[0], factor, min_pixels, max_pixels)
                tokens += (h // factor) * (w // factor)
    return tokens + math.ceil(chars / CHARS_PER_TOKEN)


def histogram(values: Iterable[int], edges: tuple[int, ...] = HISTOGRAM_EDGES) -> dict[str, int]:
    """Counts per ``[lo, hi)`` bucket; the last bucket is open-ended."""
    labels = [f"{lo}-{hi}" for lo, hi in zip(edges, edges[1:], strict=False)] + [f"{edges[-1]}+"]
    out = dict.fromkeys(labels, 0)
    for v in values:
        i = sum(1 for e in edges[1:] if v >= e)
        out[labels[i]] += 1
    return out


def dataset_stats(
    specs: list[dict[str, Any]],
    counters: dict[str, dict[str, int]],
    token_lengths: dict[str, int],
    run: dict[str, Any],
) -> dict[str, Any]:
    """The numbers of ``stats.json`` and the report.

    Args:
        specs: Every exported sample (JSON specs), sorted by id.
        counters: Merged per-stage counters.
        token_lengths: Estimated tokens per sample id.
        run: Run description (annotator, configured rates) recorded alongside.
    """
    critique = [s for s in specs if s["kind"] == "critique"]
    history = [s for s in specs if s["kind"] == "history"]
    bad = [s for s in critique if s["labels"]["verdict"] == "Bad"]
    platforms = sorted({s["platform"] for s in specs})
    table = {d.name: {p: 0 for p in platforms} for d in DIMENSIONS}
    for s in bad:
        table[s["labels"]["error_dimension"]][s["platform"]] += 1
    dim_totals = {name: sum(row.values()) for name, row in table.items()}
    masked = sum(1 for s in critique if s["labels"]["intent_masked"])
    hist_masked = sum(1 for s in history if s["labels"]["intent_masked"])
    return {
        "samples": len(specs),
        "by_kind": dict(sorted(Counter(s["kind"] for s in specs).items())),
        "by_split": {
            split: dict(sorted(Counter(s["kind"] for s in specs if s["split"] == split).items()))
            for split in ("train", "val", "test")
        },
        "by_platform": dict(sorted(Counter(s["platform"] for s in specs).items())),
        "good": len(critique) - len(bad),
        "bad": len(bad),
        "good_bad_ratio": round((len(critique) - len(bad)) / len(bad), 4) if bad else None,
        "dimension_by_platform": table,
        "dimension_totals": dim_totals,
        "dimension_shares": {
            k: round(v / len(bad), 4) if bad else 0.0 for k, v in dim_totals.items()
        },
        "dimension_target_vs_achieved": _target_vs_achieved(dim_totals, len(bad), run),
        "generator": dict(sorted(Counter(s["labels"]["generator"] for s in bad).items())),
        "critique_intent_mask_rate": round(masked / len(critique), 4) if critique else 0.0,
        "history_intent_mask_rate": round(hist_masked / len(history), 4) if history else 0.0,
        "token_length_histogram": histogram(token_lengths.values()),
        "token_length_max": max(token_lengths.values(), default=0),
        "stages": counters,
        "run": run,
    }


# --------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:sans-serif;margin:2em;max-width:1500px}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
nav ul{columns:2}
.pair{display:flex;gap:12px;align-items:flex-start;margin:1.5em 0}
.card{border:1px solid #999;border-radius:6px;padding:1em;flex:1;min-width:0}
.card img{max-width:100%;border:1px solid #ccc;cursor:zoom-in}
pre{white-space:pre-wrap;background:#f6f6f6;padding:8px;font-size:12px}
.bad{color:#b00}.good{color:#070}.fail{color:#b00;font-weight:bold}
"""

_FILTER_JS = """
function hivigFilter(){
  var d=document.getElementById('fdim').value, p=document.getElementById('fplat').value;
  document.querySelectorAll('.pair').forEach(function(e){
    var ok=(!d||e.dataset.dims.split('|').indexOf(d)>=0)&&(!p||e.dataset.platform===p);
    e.style.display=ok?'':'none';
  });
}
"""


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_show(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _show(value: Any) -> str:
    """A table cell: a missing value is a dash, never the word None."""
    return "–" if value is None else str(value)


def _stage_tables(counters: dict[str, dict[str, int]]) -> str:
    out = []
    for stage, counts in counters.items():
        rows = [[k, v] for k, v in counts.items()]
        out.append(f"<h3>{html.escape(stage)}</h3>" + _table(rows, ["counter", "value"]))
    return "".join(out)


def _card(spec: dict[str, Any], image_links: list[str]) -> str:
    labels = spec["labels"]
    verdict = labels.get("verdict")
    title = spec["kind"]
    if verdict:
        cls = "bad" if verdict == "Bad" else "good"
        dim = f" — {labels['error_dimension']}" if labels.get("error_dimension") else ""
        title = f"<span class='{cls}'>{verdict}{html.escape(dim)}</span>"
    prov = spec["provenance"]
    facts = [
        spec["id"],
        spec["platform"],
        f"split {spec['split']}",
        f"intent masked: {'yes' if labels['intent_masked'] else 'no'}",
    ]
    if labels.get("generator"):
        facts.append(f"generator: {labels['generator']}")
    if prov.get("annotator_model"):
        facts.append(f"annotator: {prov['annotator_model']} ({prov.get('annotator_kind')})")
    facts.append(f"prompt {spec['prompt_version']}")
    meta = " · ".join(html.escape(str(f)) for f in facts)
    # A click opens the frame at full size (the card shows it scaled to the column).
    imgs = "".join(
        f"<a href='{html.escape(link)}' target='_blank'>"
        f"<img src='{html.escape(link)}' alt='screenshot' loading='lazy'></a>"
        for link in image_links
    )
    user = "".join(
        p.get("text", "[image]")
        for m in spec["messages"]
        if m["role"] == "user"
        for p in m["content"]
    )
    return (
        f"<div class='card'><h3>{title}</h3><p>{meta}</p><div>{imgs}</div>"
        f"<h4>Prompt (user turn)</h4><pre>{html.escape(user)}</pre>"
        f"<h4>Target</h4><pre>{html.escape(spec['target'])}</pre></div>"
    )


def pick_cards(
    specs: list[dict[str, Any]], n: int, order: Callable[[str], int]
) -> list[dict[str, Any]]:
    """Up to ``n`` samples, round-robin over history, Good and each dimension, in hash order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in sorted(specs, key=lambda s: order(s["id"])):
        key = s["kind"] if s["kind"] == "history" else (s["labels"]["error_dimension"] or "Good")
        groups.setdefault(key, []).append(s)
    picked: list[dict[str, Any]] = []
    keys = sorted(groups)
    while len(picked) < n and any(groups.values()):
        for key in keys:
            if groups[key] and len(picked) < n:
                picked.append(groups[key].pop(0))
    return sorted(picked, key=lambda s: s["id"])


def card_groups(
    picked: list[dict[str, Any]], specs: list[dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """The picked cards grouped for display: each Bad card beside the Good card of its step
    (the same screenshot; taken from ``specs`` when it was not picked itself)."""
    good_of = {
        (s["trajectory_id"], s["step_index"]): s
        for s in specs
        if s["kind"] == "critique" and s["labels"]["verdict"] == "Good"
    }
    shown: set[str] = set()
    groups = []
    for spec in picked:
        if spec["id"] in shown:
            continue
        group = [spec]
        if spec["kind"] == "critique" and spec["labels"]["verdict"] == "Bad":
            good = good_of.get((spec["trajectory_id"], spec["step_index"]))
            if good is not None:
                group = [good, spec]
        shown.update(s["id"] for s in group)
        groups.append(group)
    return groups


def _target_vs_achieved(
    totals: dict[str, int], bad: int, run: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Per dimension: the planned target share and the share the export achieved."""
    targets = run.get("configured", {}).get("dimension_target_shares", {})
    return {
        name: {
            "target": round(targets.get(name, 0.0), 4),
            "achieved": round(n / bad, 4) if bad else 0.0,
        }
        for name, n in totals.items()
    }


def _audit_section(audit: dict[str, Any] | None) -> str:
    if not audit:
        return "<p>No audit.</p>"
    st = audit["settings"]
    rows = []
    for family, row in audit["families"].items():
        for probe in ("step", "history"):
            r = row[probe]
            gated = family in st["gated"]
            rows.append(
                [
                    family,
                    probe,
                    r.get("auc"),
                    r.get("bad"),
                    r.get("good"),
                    f"{row['mask_rate']['good']} / {row['mask_rate']['bad']}",
                    "gated" if gated else "reported",
                    ", ".join(r.get("top_bad", [])[:5]) or r.get("note", ""),
                ]
            )
    verdict = (
        f"<p class='fail'>FAILED: {html.escape(', '.join(audit['failed']))}</p>"
        if audit["failed"]
        else "<p>Passed.</p>"
    )
    return (
        "<p>Text-only probes (logistic regression on word and character n-grams, "
        f"cross-validated in {st['folds']} folds grouped by episode) try to tell Bad from the "
        "Good samples of the same steps without the screenshot. AUC 0.5 = no shortcut; gated "
        f"families fail the export above {st['max_auc']}.</p>"
        + verdict
        + _table(
            rows,
            [
                "family",
                "probe",
                "AUC",
                "Bad",
                "Good",
                "masked Good / Bad",
                "",
                "features leaning Bad",
            ],
        )
    )


_SECTIONS = (
    ("overview", "Overview"),
    ("splits", "Splits (by episode)"),
    ("dimensions", "Bad samples: dimension × platform"),
    ("audit", "Shortcut audit"),
    ("tokens", "Token lengths"),
    ("stages", "Stages: counts and drop reasons"),
    ("cards", "Sample cards"),
)


def render_report(
    stats: dict[str, Any], cards: list[tuple[dict[str, Any], list[str]]] | list[Any]
) -> str:
    """The whole ``report.html`` page.

    ``cards`` are ``(spec, image links)`` pairs, or groups of them (a Bad card beside its Good
    counterpart), as ``card_groups`` arranges them.
    """
    dims = stats["dimension_by_platform"]
    platforms = sorted({p for row in dims.values() for p in row})
    dim_rows = [
        [
            name,
            *[row[p] for p in platforms],
            stats["dimension_totals"][name],
            f"{100 * stats['dimension_shares'][name]:.1f}%",
            f"{100 * stats['dimension_target_vs_achieved'][name]['target']:.1f}%",
        ]
        for name, row in dims.items()
    ]
    overview = [
        ["samples", stats["samples"]],
        *[[f"kind: {k}", v] for k, v in stats["by_kind"].items()],
        ["Good", stats["good"]],
        ["Bad", stats["bad"]],
        ["Good/Bad ratio", stats["good_bad_ratio"]],
        ["critique intent-mask rate", stats["critique_intent_mask_rate"]],
        ["history intent-mask rate", stats["history_intent_mask_rate"]],
        ["annotator", stats["run"].get("annotator", {}).get("model")],
    ]
    split_rows = [
        [s, *[c.get(k, 0) for k in ("history", "critique")]] for s, c in stats["by_split"].items()
    ]
    hist_rows = [[k, v] for k, v in stats["token_length_histogram"].items()]
    groups = [c if isinstance(c, list) else [c] for c in cards]
    toc = "".join(f"<li><a href='#{key}'>{html.escape(title)}</a></li>" for key, title in _SECTIONS)
    dim_options = "".join(
        f"<option value='{html.escape(name)}'>{html.escape(name)}</option>" for name in dims
    )
    plat_options = "".join(f"<option>{html.escape(p)}</option>" for p in platforms)
    filters = (
        "<p>Filter: <select id='fdim' onchange='hivigFilter()'><option value=''>every dimension"
        f"</option><option value='Good'>Good</option><option value='history'>history</option>"
        f"{dim_options}</select> <select id='fplat' onchange='hivigFilter()'>"
        f"<option value=''>every platform</option>{plat_options}</select></p>"
    )
    body = [
        "<h1>hivig data_gen report</h1>",
        f"<nav><h2>Contents</h2><ul>{toc}</ul></nav>",
        "<h2 id='overview'>Overview</h2>",
        _table(overview, ["", "value"]),
        "<h2 id='splits'>Splits (by episode)</h2>",
        _table(split_rows, ["split", "history", "critique"]),
        "<h2 id='dimensions'>Bad samples: dimension × platform</h2>",
        _table(dim_rows, ["dimension", *platforms, "total", "share", "target"]),
        _bounds(stats.get("distribution_out_of_bounds")),
        "<h2 id='audit'>Shortcut audit</h2>",
        _audit_section(stats.get("shortcut_audit")),
        "<h2 id='tokens'>Token lengths</h2>",
        "<p>Estimated: text bytes / 4 + canonical-frame image tokens.</p>",
        _table(hist_rows, ["tokens", "samples"]),
        "<h2 id='stages'>Stages: counts and drop reasons</h2>",
        _stage_tables(stats["stages"]),
        f"<h2 id='cards'>Sample cards ({sum(len(g) for g in groups)})</h2>",
        filters,
        *[_pair(g) for g in groups],
    ]
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>hivig data_gen report</title>"
        f"<style>{_CSS}</style><script>{_FILTER_JS}</script></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _bounds(rows: dict[str, dict[str, float]] | None) -> str:
    if not rows:
        return "<p>Every dimension is within its bounds of the target share.</p>"
    items = ", ".join(
        f"{html.escape(d)} ({100 * r['achieved']:.1f}% vs {100 * r['target']:.1f}%)"
        for d, r in rows.items()
    )
    return f"<p class='fail'>Off target (outside the configured ratio bounds): {items}</p>"


def _pair(group: list[tuple[dict[str, Any], list[str]]]) -> str:
    dims = []
    for spec, _ in group:
        labels = spec["labels"]
        dims.append(
            "history" if spec["kind"] == "history" else labels.get("error_dimension") or "Good"
        )
    platform = group[0][0]["platform"]
    cards = "".join(_card(spec, links) for spec, links in group)
    return (
        f"<div class='pair' data-dims='{html.escape('|'.join(dims))}' "
        f"data-platform='{html.escape(platform)}'>{cards}</div>"
    )
