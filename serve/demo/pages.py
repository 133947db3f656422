"""The demo's pages: the training curve, the episode step by step, and the index linking it all."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from hivig.messages import ArrowMark, PointMark
from hivig.vision import FAST_PNG_LEVEL, canonical_frame, encode_png, size_class_for_platform

DISPLAY_PIXELS = 1_048_576
"""Screenshots on the episode page use the production frame, so the marker is easy to see."""

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;
color:#1d2330;line-height:1.45;padding:0 1rem}
h1{margin-bottom:.2rem}.sub{color:#5b6475;margin-top:0}
.note{background:#fff6e0;border:1px solid #f0d48a;padding:.7rem 1rem;border-radius:6px}
.card{border:1px solid #d9dde5;border-radius:8px;padding:1rem;margin:1rem 0;background:#fbfcfd}
.grid{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:1rem}
img{max-width:100%;border:1px solid #ccd;border-radius:4px}
code,pre{background:#f1f3f7;border-radius:4px;padding:.1rem .3rem;white-space:pre-wrap;
word-break:break-word}pre{padding:.6rem}
.tag{display:inline-block;border-radius:4px;padding:.05rem .45rem;font-size:.85rem;
margin-right:.3rem}
.good{background:#dff3e3}.bad{background:#fbe0e0}.abstain{background:#eceef2}.r3{background:#e5e9ff}
.samples{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:.8rem}
.samples .card{margin:0;font-size:.9rem}
table{border-collapse:collapse}td,th{border:1px solid #d9dde5;padding:.3rem .6rem;text-align:left}
a{color:#2954c8}
"""


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{_STYLE}</style></head><body>{body}</body></html>\n"
    )


def escape(value: Any) -> str:
    """``value`` as HTML text (``None`` as empty)."""
    return html.escape("" if value is None else str(value))


# ---------------------------------------------------------------------------------------------
# Training curve


def training_curve(metrics_jsonl: Path, out_png: Path) -> dict[str, Any]:
    """Plot loss (and lr) per step from a training run's ``metrics.jsonl``; a short summary."""
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "loss" in r and "step" in r]
    if not rows:
        raise ValueError(f"{metrics_jsonl} has no loss rows")
    fig = curve_figure(rows)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    plt.close(fig)
    return {"steps": len(rows), "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"]}


def curve_figure(rows: list[dict[str, Any]]) -> Any:
    """The training-curve figure of ``metrics.jsonl`` rows: loss, and lr on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    lines = ax.plot(
        steps, [r["loss"] for r in rows], marker="o", color="#2954c8", label="train loss"
    )
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # no step 1.25
    ax.set_ylabel("loss (per supervised token)")
    ax.grid(alpha=0.3)
    if all("lr" in r for r in rows):
        ax2 = ax.twinx()
        lines += ax2.plot(
            steps, [r["lr"] for r in rows], color="#c87a29", linestyle="--", label="lr"
        )
        ax2.set_ylabel("learning rate")
    # One legend for both axes: the lr line lives on the twin axis, whose legend ax cannot see.
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right", fontsize=9)
    ax.set_title("Tiny random Qwen3-VL, a few steps on CPU")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Episode


def _marks(items: list[dict[str, Any]]) -> tuple[Any, ...]:
    out: list[Any] = []
    for m in items:
        if m.get("shape") == "arrow":
            out.append(ArrowMark(m["x"], m["y"], m["x2"], m["y2"]))
        else:
            out.append(PointMark(m["x"], m["y"]))
    return tuple(out)


def _shot(state_dir: Path, ref: str, marks: tuple[Any, ...], out: Path) -> str:
    src = state_dir / "images" / f"{ref.split(':', 1)[1]}.png"
    frame = canonical_frame(
        src,
        min_pixels=65_536,
        max_pixels=DISPLAY_PIXELS,
        marks=marks,
        size_class=size_class_for_platform("web"),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(encode_png(frame, FAST_PNG_LEVEL))
    return out.name


def _verdict_tag(v: dict[str, Any] | None) -> str:
    if not v:
        return "<span class='tag abstain'>not judged</span>"
    verdict = v.get("verdict", "abstain")
    dim = f" · {escape(v.get('error_dimension'))}" if v.get("error_dimension") else ""
    why = f" ({escape(v.get('reason'))})" if v.get("reason") else ""
    return f"<span class='tag {escape(verdict)}'>{escape(verdict)}{dim}{why}</span>"


_RANDOM_NOTE = (
    "<p class='note'>The critic here is a tiny random-weight model: its verdicts and summaries "
    "carry no meaning (most answers do not parse, so the gateway abstains and the guard fails "
    "open). The recurrence signals and R3 are deterministic and do not depend on it. "
    "<a href='episode_scripted.html'>The same episode with a scripted critic</a> shows what the "
    "guard does with a Bad verdict.</p>"
)
_SCRIPTED_NOTE = (
    "<p class='note'><b>Scripted critic: a fixed rule, not a model.</b> It answers Bad to "
    "typing while no field has the focus (the injected mistake) and Good to every other step, so "
    "this page shows the path a trained critic drives: the Bad verdict, its explanation handed "
    "to the policy, and the policy's re-proposal. Its Good verdicts judge nothing; the no-effect "
    "repeat is caught by the recurrence detector, not by the rule. <a href='episode.html'>The "
    "same episode with the demo's random model</a>.</p>"
)


def _reproposal_tags(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """A tag for each critique that re-judges a step right after a Bad verdict on it."""
    tags, previous = [], None
    for event, _obs in pairs:
        rejected = previous is not None and previous["step_idx"] == event["step_idx"]
        rejected = rejected and any(v.get("verdict") == "bad" for v in previous["verdicts"])
        tags.append(
            " <span class='tag r3'>re-proposal after the Bad verdict</span>" if rejected else ""
        )
        previous = event
    return tags


def episode_page(
    trace: Path,
    state_dir: Path,
    log: list[dict[str, Any]],
    out_dir: Path,
    env_name: str,
    *,
    scripted: bool = False,
) -> Path:
    """``episode.html``: every critique with its marked screenshot, verdict, history and signals.

    ``scripted``: the run judged by ``serve.demo.scripted`` (``episode_scripted.html``, labelled
    as a scripted critic on the page).
    """
    name = "episode_scripted" if scripted else "episode"
    events = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    # Each critique pairs with the observe just before it: after an R3 Restore the gateway's
    # step numbers go back, so they are not unique within a trace.
    pairs, last_observe, reseeded = [], {}, False
    for e in events:
        if e["event"] == "session" and e.get("reseeded"):
            reseeded = True
        elif e["event"] == "observe":
            last_observe = {**e, "after_restore": reseeded}
            reseeded = False
        elif e["event"] == "critique":
            pairs.append((e, last_observe))
    cards = []
    reproposed = _reproposal_tags(pairs)
    for n, (event, obs) in enumerate(pairs):
        k = event["step_idx"]
        shots = []
        for i, (action, marks) in enumerate(zip(event["actions"], event["marks"], strict=True)):
            shot = _shot(
                state_dir, event["image_ref"], _marks(marks), out_dir / name / f"c{n}_{i}.png"
            )
            verdict = event["verdicts"][i] if i < len(event["verdicts"]) else None
            intent = escape(action.get("intent") or "(no intent)")
            explanation = escape((verdict or {}).get("explanation") or "—")
            shots.append(
                f"<div><img src='{name}/{shot}' alt='step {k} proposal'><p>"
                f"{_verdict_tag(verdict)}<br><b>Proposed:</b> {intent}"
                f"<pre>{escape(action.get('action_text'))}</pre>"
                f"<b>Critic explanation:</b> {explanation}</p></div>"
            )
        hist = obs.get("history") or {}
        rec = obs.get("recurrence") or {}
        change = obs.get("change")
        signals = (
            f"no effect: <b>{escape(change['no_effect'])}</b> · changed pixels: "
            f"{escape(round(100 * change['masked_diff_frac'], 2))} %"
            if change
            else "first screen"
        )
        r3 = " <span class='tag r3'>R3 trigger</span>" if rec.get("r3_trigger") else ""
        if obs.get("after_restore"):
            r3 += " <span class='tag r3'>after R3 Restore: history re-seeded, no loop</span>"
        stale = ", stale" if hist.get("stale") else ""
        cards.append(
            f"<div class='card'><h3>Gateway step {k}{reproposed[n]}{r3}</h3>"
            f"<div class='grid'>{''.join(shots)}"
            f"<div><b>Macro history</b> (v{escape(hist.get('version'))}{stale})"
            f"<p>{escape(hist.get('progress_summary'))}</p><b>Last action result</b><p>"
            f"{escape(hist.get('last_action_result'))}</p><b>Recurrence signals</b><p>{signals}<br>"
            f"same action without effect: {escape(rec.get('same_key_no_effect_run'))} · cycle: "
            f"{escape(rec.get('cycle_len') or '—')} · screen revisits: "
            f"{escape(rec.get('screen_revisits'))}"
            f"</p></div></div></div>"
        )
    guard_rows = "".join(
        f"<tr><td>{escape(r.get('step_idx'))}</td><td>{escape(r.get('mode'))}</td><td>{escape(r.get('outcome'))}</td>"
        f"<td>{escape(' → '.join(str(x.get('ruling')) for x in r.get('proposals') or []))}</td>"
        f"<td>{escape(json.dumps(r.get('r3'))) if r.get('r3') else ''}</td></tr>"
        for r in log
    )
    title = "The agent episode, scripted critic" if scripted else "The agent episode"
    body = (
        f"<p><a href='index.html'>← demo index</a></p><h1>{title}</h1>"
        "<p class='sub'>Task: <i>Turn on dark mode in the settings.</i> "
        f"Environment: {escape(env_name)}. "
        "A scripted policy behind <code>CriticGuard</code>: one injected Bad step (typing with no "
        "field focused), then the disabled <i>Publish</i> button clicked twice (a no-effect "
        "repeat the recurrence detector flags, so R3 reroutes), then the real path.</p>"
        f"{_SCRIPTED_NOTE if scripted else _RANDOM_NOTE}{''.join(cards)}"
        "<h2>Guard log</h2><table><tr><th>guard step</th><th>mode</th>"
        f"<th>outcome</th><th>proposals</th><th>R3</th></tr>{guard_rows}</table>"
    )
    out = out_dir / f"{name}.html"
    out.write_text(_page(f"hivig demo: {title.lower()}", body), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------------
# Index


_NO_FLYWHEEL = (
    "<div class='card'><h2>5. The flywheel</h2><p>Not run yet: <code>make demo</code> passes "
    "this episode's trace through <code>data_gen ingest-runs</code> and <code>data_gen run"
    "</code> and shows the samples here.</p></div>"
)


def index_page(
    out_dir: Path, links: dict[str, Path], facts: dict[str, Any], flywheel: str = ""
) -> Path:
    """``index.html`` linking the data report, training curve, episode and diagnosis.

    ``flywheel`` is the samples section ``serve.demo.flywheel`` renders once data_gen has run
    on the episode; without it the index says how to add it.
    """

    def rel(p: Path) -> str:
        return os.path.relpath(p, out_dir)

    curve = links["training_curve"]
    body = (
        "<h1>hivig demo</h1><p class='sub'>The whole pipeline on a generated corpus, on CPU.</p>"
        "<p class='note'><b>The critic is a tiny random-weight Qwen3-VL</b>, trained for a few "
        "steps: everything it says carries no meaning. The demo shows the plumbing: data, "
        "training, serving, the guard loop, recurrence detection and diagnosis.</p>"
        f"<div class='card'><h2>1. Data</h2><p>{escape(facts.get('data'))}</p>"
        f"<p><a href='{rel(links['data_report'])}'>Data report</a> (samples, dimensions, "
        "the shortcut audit)</p></div>"
        f"<div class='card'><h2>2. Training</h2><p>{escape(facts.get('train'))}</p>"
        f"<img src='{rel(curve)}' alt='training curve'><p>Metrics: <code>"
        f"{escape(facts.get('metrics'))}</code></p></div>"
        f"<div class='card'><h2>3. Serving and the agent loop</h2>"
        f"<p>{escape(facts.get('episode'))}</p>"
        f"<p><a href='{rel(links['episode'])}'>The episode, step by step</a> (judged by the "
        "served critic)</p>"
        + (
            f"<p>{escape(facts.get('episode_scripted'))}</p><p><a href='"
            f"{rel(links['episode_scripted'])}'>The same episode with a scripted critic</a> "
            "(a fixed rule, not a model: the Bad verdict, its explanation and the re-proposal)"
            "</p>"
            if "episode_scripted" in links
            else ""
        )
        + "</div>"
        f"<div class='card'><h2>4. Diagnosis</h2><p>{escape(facts.get('diagnosis'))}</p>"
        f"<p><a href='{rel(links['diagnosis'])}'>Diagnosis page</a></p></div>"
        f"{flywheel or _NO_FLYWHEEL}"
        "<div class='card'><h2>With a real critic</h2><p>Same demo, a trained checkpoint "
        "(one change):</p><pre>make demo CRITIC=path/to/checkpoint</pre><p>or against a vLLM "
        "endpoint serving the merged critic:</p><pre>make demo "
        "SERVE_CONFIG=configs/serve/vllm.yaml SERVE_ARGS='model=hivig-critic "
        "backend.base_url=http://gpu-node:8000/v1'</pre></div>"
    )
    out = out_dir / "index.html"
    out.write_text(_page("hivig demo", body), encoding="utf-8")
    return out
