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
from dataclasses import dataclass
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
        "kind_by_platform": _kind_by_platform(specs, platforms),
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
        "annotator_usage": annotator_usage(counters, len(specs)),
        "run": run,
    }


USAGE_KEYS = ("calls", "prompt_tokens", "completion_tokens")


def annotator_usage(counters: dict[str, dict[str, int]], exported: int) -> dict[str, Any]:
    """Annotator answers and the server's token usage per stage, their totals, and the answers
    per exported sample (what the dataset cost, cached answers counted as when first paid)."""
    per_stage = {
        stage: {k: counts.get(k, 0) for k in USAGE_KEYS}
        for stage, counts in counters.items()
        if counts.get("calls")
    }
    total = {k: sum(row[k] for row in per_stage.values()) for k in USAGE_KEYS}
    per_sample = round(total["calls"] / exported, 3) if exported else None
    return {"stages": per_stage, "total": total, "calls_per_exported_sample": per_sample}


def _kind_by_platform(specs: list[dict[str, Any]], platforms: list[str]) -> dict[str, Any]:
    """Per platform: history samples, Good and Bad critiques (the report's platform plot)."""
    out = {p: {"history": 0, "Good": 0, "Bad": 0} for p in platforms}
    for s in specs:
        key = "history" if s["kind"] == "history" else s["labels"]["verdict"]
        out[s["platform"]][key] += 1
    return out


# --------------------------------------------------------------------------------------------
# HTML

# Readable widths: prose at most 80 characters, the contents in a sticky side column so every
# section is one click away on a long page, cards two to a row (a Bad beside its Good).
_CSS = """
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1d2330;margin:0;
  background:#f5f6f8}
.layout{display:grid;grid-template-columns:230px minmax(0,1fr);gap:28px;max-width:1500px;
  margin:0 auto;padding:24px}
nav{position:sticky;top:16px;align-self:start;background:#fff;border:1px solid #dde1e8;
  border-radius:8px;padding:12px 16px;font-size:14px}
nav h2{font-size:13px;text-transform:uppercase;letter-spacing:.05em;color:#5b6475;margin:0 0 6px}
nav ul{list-style:none;margin:0;padding:0}nav li{margin:5px 0}
nav a{color:#2954c8;text-decoration:none}nav a:hover{text-decoration:underline}
main{min-width:0}
h1{font-size:24px;margin:0 0 4px}
p,.note{max-width:80ch}
.lede{color:#5b6475;margin:0 0 16px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:4px 18px 10px;
  margin:0 0 18px}
summary{cursor:pointer}
section>details>summary{list-style-position:outside;margin:10px 0}
section>details>summary h2{display:inline;font-size:19px;margin:0}
details.more>summary{color:#2954c8;font-size:14px;margin:8px 0}
.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.tile{border:1px solid #dde1e8;border-radius:6px;padding:6px 12px;min-width:110px}
.tile b{display:block;font-size:20px}.tile span{color:#5b6475;font-size:13px}
.row{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
table{border-collapse:collapse;margin:8px 0;font-size:14px}
td,th{border-bottom:1px solid #e4e7ec;padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f0f2f6;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr:hover td{background:#f8f9fb}
.stages{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:0 20px}
.stages>div{min-width:0}.stages td:first-child{overflow-wrap:anywhere}
.stages h3{font-size:15px;margin:10px 0 0}
figure{margin:10px 0}figure svg{max-width:100%;height:auto;display:block}
figcaption{color:#5b6475;font-size:13px;max-width:80ch}
.toolbar{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin:8px 0}
.toolbar button{font:inherit;font-size:13px;padding:2px 10px}
.cards{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));grid-auto-flow:row dense;
  gap:14px;margin:10px 0}
.pair{display:grid;grid-template-columns:minmax(0,1fr);gap:14px}
.pair[data-n='2']{grid-column:1/-1;grid-template-columns:repeat(2,minmax(0,1fr))}
.card{border:1px solid #cfd5df;border-radius:8px;padding:8px 12px;min-width:0;background:#fff}
.card h3{font-size:16px;margin:4px 0}
.meta{color:#5b6475;font-size:12.5px;margin:2px 0 8px;overflow-wrap:anywhere}
.card img{display:block;max-width:100%;max-height:440px;margin:0 auto;border:1px solid #ccd;
  cursor:zoom-in}
.card details>summary{font-weight:600;font-size:14px;margin:6px 0}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f4f5f7;padding:8px;font-size:12px;
  max-height:26em;overflow:auto;margin:4px 0}
.bad{color:#b00}.good{color:#070}.fail{color:#b00;font-weight:bold}
@media (max-width:900px){.layout{grid-template-columns:1fr}nav{position:static}
  .cards,.pair[data-n='2']{grid-template-columns:minmax(0,1fr)}}
"""

_FILTER_JS = """
function hivigFilter(){
  var d=document.getElementById('fdim').value, p=document.getElementById('fplat').value;
  document.querySelectorAll('.pair').forEach(function(e){
    var ok=(!d||e.dataset.dims.split('|').indexOf(d)>=0)&&(!p||e.dataset.platform===p);
    e.style.display=ok?'':'none';
  });
}
function hivigOpen(open){
  document.querySelectorAll('.card details').forEach(function(e){e.open=open;});
}
"""

# --------------------------------------------------------------------------------------------
# Plots: inline SVG written here, so the data extra needs no plotting library and the report
# stays byte-identical from run to run (no renderer versions or timestamps in it).

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#b07aa1",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
"""Series colours, in order (colour-blind friendly, Tableau 10)."""

_CHAR_W = 7.0  # px per character of 12 px sans-serif text, for label widths
_ROW_H = 22
_PLOT_W = 420


@dataclass(frozen=True)
class Bar:
    """One row of a bar chart: a stacked bar of ``values`` (one per series)."""

    label: str
    values: tuple[float, ...]
    marker: float | None = None  # a tick at this value (e.g. the planned target)
    tip: str = ""  # hover text (an SVG <title>)


def _nice_step(top: float) -> float:
    """A 1/2/5 x 10^k grid step giving at most five grid lines up to ``top``."""
    raw = max(top, 1.0) / 5
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _fmt(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def bar_chart(
    bars: list[Bar], series: list[str], *, marker_name: str = "", colors: tuple = PALETTE
) -> str:
    """A horizontal stacked bar chart as inline SVG, with a legend of ``series`` on top."""
    label_w = 12 + _CHAR_W * max((len(b.label) for b in bars), default=1)
    legend = [*series, *([marker_name] if marker_name else [])]
    legend_svg, legend_h = _legend(legend, colors, label_w + _PLOT_W + 60, bool(marker_name))
    top = max([sum(b.values) for b in bars] + [b.marker or 0 for b in bars] + [1])
    step = _nice_step(top)
    span = step * math.ceil(top / step)
    scale = _PLOT_W / span
    y0 = legend_h + 6
    width, height = label_w + _PLOT_W + 60, y0 + _ROW_H * len(bars) + 24
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height}' "
        f"viewBox='0 0 {width:.0f} {height}' "
        f"role='img' font-family='sans-serif' font-size='12'>",
        legend_svg,
    ]
    out += _grid(label_w, y0, len(bars), step, span, scale)
    for i, bar in enumerate(bars):
        out.append(_bar_row(bar, label_w, y0 + i * _ROW_H, scale, colors))
    out.append("</svg>")
    return "".join(out)


def _legend(names: list[str], colors: tuple, width: float, marker: bool) -> tuple[str, int]:
    """Legend entries left to right, wrapping; the last is a black tick when ``marker``."""
    parts, x, y = [], 4.0, 4
    for i, name in enumerate(names):
        w = 22 + _CHAR_W * len(name)
        if x + w > width and x > 4:
            x, y = 4.0, y + 18
        if marker and i == len(names) - 1:
            swatch = f"<rect x='{x + 5:.0f}' y='{y}' width='2' height='12' fill='#111'/>"
        else:
            swatch = f"<rect x='{x:.0f}' y='{y + 1}' width='11' height='11' fill='{colors[i]}'/>"
        parts.append(f"{swatch}<text x='{x + 16:.0f}' y='{y + 11}'>{html.escape(name)}</text>")
        x += w + 10
    return "<g class='legend'>" + "".join(parts) + "</g>", y + 18


def _grid(label_w: float, y0: int, rows: int, step: float, span: float, scale: float) -> list:
    bottom = y0 + _ROW_H * rows
    out = []
    for k in range(int(round(span / step)) + 1):
        x = label_w + k * step * scale
        out.append(
            f"<line x1='{x:.1f}' y1='{y0}' x2='{x:.1f}' y2='{bottom}' stroke='#e3e6eb'/>"
            f"<text x='{x:.1f}' y='{bottom + 15}' text-anchor='middle' fill='#5b6475'>"
            f"{_fmt(k * step)}</text>"
        )
    return out


def _bar_row(bar: Bar, label_w: float, y: int, scale: float, colors: tuple) -> str:
    label = html.escape(bar.label)
    out = [
        f"<g><title>{html.escape(bar.tip or bar.label)}</title>"
        f"<text x='{label_w - 8:.0f}' y='{y + 15}' text-anchor='end'>{label}</text>"
    ]
    x = label_w
    for k, value in enumerate(bar.values):
        if value > 0:
            w = value * scale
            out.append(
                f"<rect x='{x:.1f}' y='{y + 4}' width='{w:.1f}' height='{_ROW_H - 8}' "
                f"fill='{colors[k % len(colors)]}'/>"
            )
            x += w
    out.append(f"<text x='{x + 4:.1f}' y='{y + 15}' fill='#333'>{_fmt(sum(bar.values))}</text>")
    if bar.marker is not None:
        mx = label_w + bar.marker * scale
        out.append(
            f"<rect x='{mx - 1:.1f}' y='{y + 1}' width='2' height='{_ROW_H - 2}' fill='#111'/>"
        )
    return "".join(out) + "</g>"


def _figure(svg: str, caption: str) -> str:
    return f"<figure class='plot'>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def dimension_plot(stats: dict[str, Any]) -> str:
    """Bad samples per error dimension, stacked by platform, with the planned target."""
    dims = stats["dimension_by_platform"]
    platforms = sorted({p for row in dims.values() for p in row})
    shares = stats["dimension_target_vs_achieved"]
    bars = [
        Bar(
            name,
            tuple(float(row[p]) for p in platforms),
            marker=shares[name]["target"] * stats["bad"] if stats["bad"] else None,
            tip=f"{name}: " + ", ".join(f"{p} {row[p]}" for p in platforms),
        )
        for name, row in dims.items()
    ]
    return _figure(
        bar_chart(bars, platforms, marker_name="planned target"),
        "Bad samples per error dimension, by platform; the black tick is the planned target "
        "share times the Bad samples exported.",
    )


def platform_plot(stats: dict[str, Any]) -> str:
    """Samples per platform: history, Good and Bad critiques."""
    kinds = ("history", "Good", "Bad")
    rows = stats.get("kind_by_platform") or {}
    bars = [Bar(p, tuple(float(row[k]) for k in kinds)) for p, row in rows.items()]
    chart = bar_chart(bars, list(kinds), colors=("#4e79a7", "#59a14f", "#e15759"))
    return _figure(chart, "Exported samples per platform and kind.")


def _dropped(counts: dict[str, int]) -> dict[str, int]:
    return {k[len("dropped_") :]: v for k, v in counts.items() if k.startswith("dropped_")}


def stage_plot(counters: dict[str, dict[str, int]]) -> str:
    """Per stage: items kept and dropped (the drop reasons on hover and in the tables)."""
    bars = []
    for stage, counts in counters.items():
        dropped = _dropped(counts)
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none dropped"
        values = (float(counts.get("kept", 0)), float(sum(dropped.values())))
        bars.append(Bar(stage, values, tip=f"{stage}: in {counts.get('in', 0)}; {reasons}"))
    return _figure(
        bar_chart(bars, ["kept", "dropped"], colors=("#59a14f", "#e15759")),
        "Items each stage kept and dropped (hover a bar for the drop reasons).",
    )


def token_plot(stats: dict[str, Any]) -> str:
    """Estimated tokens per sample, as a histogram."""
    bars = [Bar(k, (float(v),)) for k, v in stats["token_length_histogram"].items()]
    return _figure(
        bar_chart(bars, ["samples"]),
        f"Samples per estimated token length (longest: {stats['token_length_max']}).",
    )


# --------------------------------------------------------------------------------------------
# Tables, cards and sections


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    """A table cell; numbers right-aligned so their digits line up."""
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return f"<td{' class=n' if numeric else ''}>{html.escape(_show(value))}</td>"


def _show(value: Any) -> str:
    """A table cell: a missing value is a dash, never the word None."""
    return "–" if value is None else str(value)


def _stage_tables(counters: dict[str, dict[str, int]]) -> str:
    out = []
    for stage, counts in counters.items():
        rows = [[k, v] for k, v in counts.items()]
        out.append(f"<div><h3>{html.escape(stage)}</h3>{_table(rows, ['counter', 'value'])}</div>")
    return f"<div class='stages'>{''.join(out)}</div>"


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
    # Prompt and target fold away: open, a card is as long as its text (a whole page each).
    return (
        f"<div class='card'><h3>{title}</h3><p class='meta'>{meta}</p><div>{imgs}</div>"
        f"<details><summary>Prompt (user turn)</summary><pre>{html.escape(user)}</pre></details>"
        f"<details><summary>Target</summary><pre>{html.escape(spec['target'])}</pre></details>"
        "</div>"
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


def _usage_table(usage: dict[str, Any] | None) -> str:
    """Annotator answers and tokens per stage, with the answers per exported sample."""
    if not usage or not usage["stages"]:
        return ""
    rows = [[stage, *(row[k] for k in USAGE_KEYS)] for stage, row in usage["stages"].items()]
    rows.append(["total", *(usage["total"][k] for k in USAGE_KEYS)])
    per = usage["calls_per_exported_sample"]
    return (
        f"<p>Annotator answers per exported sample: {per}. Tokens are the server's own usage "
        "(0 for the offline annotator).</p>"
        + _table(rows, ["stage", "answers", "prompt tokens", "completion tokens"])
    )


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


def _section(key: str, body: str, title: str | None = None) -> str:
    """A section that folds away under its heading (open at first)."""
    title = title or dict(_SECTIONS)[key]
    return (
        f"<section id='{key}'><details open><summary><h2>{html.escape(title)}</h2></summary>"
        f"{body}</details></section>"
    )


def _more(label: str, body: str) -> str:
    """Detail kept folded (the numbers behind a plot)."""
    return f"<details class='more'><summary>{html.escape(label)}</summary>{body}</details>"


def _tiles(stats: dict[str, Any]) -> str:
    figures = [
        ("samples", stats["samples"]),
        *[(k, v) for k, v in stats["by_kind"].items()],
        ("Good", stats["good"]),
        ("Bad", stats["bad"]),
        ("Good/Bad", _show(stats["good_bad_ratio"])),
    ]
    return (
        "<div class='tiles'>"
        + "".join(
            f"<div class='tile'><b>{html.escape(str(v))}</b><span>{html.escape(k)}</span></div>"
            for k, v in figures
        )
        + "</div>"
    )


def _overview(stats: dict[str, Any]) -> str:
    rows = [
        ["critique intent-mask rate", stats["critique_intent_mask_rate"]],
        ["history intent-mask rate", stats["history_intent_mask_rate"]],
        ["annotator", stats["run"].get("annotator", {}).get("model")],
        ["longest sample (estimated tokens)", stats["token_length_max"]],
    ]
    return _tiles(stats) + _table(rows, ["", "value"]) + platform_plot(stats)


def _dimensions(stats: dict[str, Any]) -> str:
    dims = stats["dimension_by_platform"]
    platforms = sorted({p for row in dims.values() for p in row})
    rows = [
        [
            name,
            *[row[p] for p in platforms],
            stats["dimension_totals"][name],
            f"{100 * stats['dimension_shares'][name]:.1f}%",
            f"{100 * stats['dimension_target_vs_achieved'][name]['target']:.1f}%",
        ]
        for name, row in dims.items()
    ]
    table = _table(rows, ["dimension", *platforms, "total", "share", "target"])
    return (
        dimension_plot(stats)
        + _bounds(stats.get("distribution_out_of_bounds"))
        + _more("Table: dimension × platform", table)
    )


def _filters(stats: dict[str, Any]) -> str:
    dims = stats["dimension_by_platform"]
    platforms = sorted({p for row in dims.values() for p in row})
    dim_options = "".join(
        f"<option value='{html.escape(name)}'>{html.escape(name)}</option>" for name in dims
    )
    plat_options = "".join(f"<option>{html.escape(p)}</option>" for p in platforms)
    return (
        "<div class='toolbar'>Filter: <select id='fdim' onchange='hivigFilter()'>"
        "<option value=''>every dimension</option><option value='Good'>Good</option>"
        f"<option value='history'>history</option>{dim_options}</select> "
        "<select id='fplat' onchange='hivigFilter()'><option value=''>every platform</option>"
        f"{plat_options}</select> <button type='button' onclick='hivigOpen(true)'>open every "
        "prompt and target</button><button type='button' onclick='hivigOpen(false)'>fold "
        "them</button></div>"
    )


def render_report(
    stats: dict[str, Any], cards: list[tuple[dict[str, Any], list[str]]] | list[Any]
) -> str:
    """The whole ``report.html`` page.

    ``cards`` are ``(spec, image links)`` pairs, or groups of them (a Bad card beside its Good
    counterpart), as ``card_groups`` arranges them.
    """
    split_rows = [
        [s, *[c.get(k, 0) for k in ("history", "critique")]] for s, c in stats["by_split"].items()
    ]
    hist_rows = [[k, v] for k, v in stats["token_length_histogram"].items()]
    groups = [c if isinstance(c, list) else [c] for c in cards]
    n_cards = sum(len(g) for g in groups)
    toc = "".join(f"<li><a href='#{key}'>{html.escape(title)}</a></li>" for key, title in _SECTIONS)
    sections = [
        _section("overview", _overview(stats)),
        _section("splits", _table(split_rows, ["split", "history", "critique"])),
        _section("dimensions", _dimensions(stats)),
        _section("audit", _audit_section(stats.get("shortcut_audit"))),
        _section(
            "tokens",
            "<p>Estimated: text bytes / 4 + canonical-frame image tokens.</p>"
            + token_plot(stats)
            + _more("Table: token lengths", _table(hist_rows, ["tokens", "samples"])),
        ),
        _section(
            "stages",
            stage_plot(stats["stages"])
            + _usage_table(stats.get("annotator_usage"))
            + _more("Counters per stage", _stage_tables(stats["stages"])),
        ),
        _section(
            "cards",
            _filters(stats) + "<div class='cards'>" + "".join(_pair(g) for g in groups) + "</div>",
            f"Sample cards ({n_cards})",
        ),
    ]
    annotator = stats["run"].get("annotator", {}).get("model")
    lede = f"{stats['samples']} samples" + (f", annotator {annotator}" if annotator else "")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>hivig data_gen report</title><style>{_CSS}</style>"
        f"<script>{_FILTER_JS}</script></head><body><div class='layout'>"
        f"<nav><h2>Contents</h2><ul>{toc}</ul></nav><main><h1>hivig data_gen report</h1>"
        f"<p class='lede'>{html.escape(lede)}</p>{''.join(sections)}</main></div></body></html>\n"
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
        f"data-platform='{html.escape(platform)}' data-n='{len(group)}'>{cards}</div>"
    )
