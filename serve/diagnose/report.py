"""Outputs of a diagnosis: ``diagnosis.json``, ``diagnosis.html`` and ``images/``.

The page is self-contained together with its ``images/`` folder (no scripts, styles inline, no
network): a summary, the ranking table with the signals behind each score, every step, and for
each considered step its before-screenshot with the action's marker and its after-screenshot.
Screenshots are copied, so the folder can be moved or archived on its own.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path
from typing import Any

from hivig.files import write_atomic
from hivig.vision import ImageError, encode_png, reference_marked_image
from serve.diagnose.inspection import step_marks
from serve.diagnose.run import Run

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
vertical-align:top;text-align:left;font-size:14px}th{background:#f3f3f3}
pre{white-space:pre-wrap;margin:0;font-size:13px}.root{background:#fff3cd}
.shots{display:flex;gap:1em}.shots figure{margin:0;flex:1 1 0;max-width:640px}
.shots img{width:100%;border:1px solid #999}
.box{border:1px solid #ddd;padding:1em;margin:1em 0;border-radius:6px}
.muted{color:#777}
"""


def _copy_images(result: Any, run: Run, out: Path) -> dict[int, dict[str, str]]:
    """Copy the considered steps' screenshots (and a marked before-shot) into ``out/images``."""
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    by_step = {s.step: s for s in run.steps}
    wanted = set(result.candidates_considered)
    if result.root_cause_step is not None:
        wanted.add(result.root_cause_step)
    copied: dict[int, dict[str, str]] = {}
    for n in sorted(wanted):
        step = by_step.get(n)
        if step is None:
            continue
        entry: dict[str, str] = {}
        for kind, src in (("before", step.before), ("after", step.after)):
            if src is None or not src.is_file():
                continue
            name = f"step{n}_{kind}{src.suffix.lower() or '.png'}"
            shutil.copyfile(src, images / name)
            entry[kind] = f"images/{name}"
        marks = step_marks(run, step)
        if step.before is not None and marks:
            try:
                marked, _ = reference_marked_image(step.before, marks)
                write_atomic(images / f"step{n}_marked.png", encode_png(marked), durable=False)
                entry["marked"] = f"images/step{n}_marked.png"
            except ImageError:
                pass  # the unmarked copy (if any) still shows the screen
        copied[n] = entry
    return copied


def write_outputs(result: Any, run: Run, out: Path) -> None:
    """Write ``diagnosis.json``, ``diagnosis.html`` and the screenshots into ``out``.

    Args:
        result: The ``DiagnosisResult``; its ``images`` map is filled in.
        run: The run it diagnoses (for the screenshots and markers).
        out: The output folder (created if missing).
    """
    out.mkdir(parents=True, exist_ok=True)
    images = _copy_images(result, run, out)
    doc = result.to_json()
    doc["images"] = {str(k): v for k, v in images.items()}
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    write_atomic(out / "diagnosis.json", text, durable=False)
    write_atomic(out / "diagnosis.html", render_html(doc), durable=False)


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _summary_table(doc: dict[str, Any]) -> str:
    err = doc["error"]
    inp = doc["input"]
    label = (
        f"{err['l1']} {err['l1_name']} / {err['l2']} {err['l2_name']}" if err["l2"] else "unknown"
    )
    rows = [
        ("input", f"{inp['kind']}: {inp['path']}"),
        ("task", inp["task"] or "(not recorded)"),
        (
            "outcome",
            f"{inp['outcome']}" + (f" (score {inp['score']})" if inp["score"] is not None else ""),
        ),
        ("root-cause step", _root_text(doc)),
        ("error (CUADebug)", label),
        ("critic dimension", err["hivig_dimension"] or "-"),
        ("correction", doc["correction"]),
        ("confidence", f"{doc['confidence']:.2f} ({doc['method']})"),
        ("backend", doc["backend"].get("model") or "none (cheap signals only)"),
        ("candidates inspected", ", ".join(map(str, doc["candidates_considered"])) or "-"),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _root_text(doc: dict[str, Any]) -> object:
    if doc["method"] == "run_succeeded":
        return "none: the run succeeded"
    return doc["root_cause_step"]


def _ranking_table(doc: dict[str, Any]) -> str:
    if not doc["ranking"]:
        return "<p class='muted'>No cheap signal fired.</p>"
    rows = []
    for rank, c in enumerate(doc["ranking"], start=1):
        cls = " class='root'" if c["step"] == doc["root_cause_step"] else ""
        sig = "<br>".join(
            f"<b>{_e(s['name'])}</b> (+{s['weight']}): {_e(s['detail'])}" for s in c["signals"]
        )
        rows.append(
            f"<tr{cls}><td>{rank}</td><td>{c['step']}</td><td>{c['score']}</td><td>{sig}</td></tr>"
        )
    head = "<tr><th>rank</th><th>step</th><th>score</th><th>signals</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _steps_table(doc: dict[str, Any]) -> str:
    rows = []
    for s in doc["steps"]:
        cls = " class='root'" if s["step"] == doc["root_cause_step"] else ""
        change = s["change"]
        eff = "-" if change is None else ("no effect" if change["no_effect"] else "changed")
        verdict = s["recorded_verdict"]["verdict"] if s["recorded_verdict"] else "-"
        rows.append(
            f"<tr{cls}><td>{s['step']}</td><td class='muted'>{_e(s['source_ref'])}</td>"
            f"<td><pre>{_e(s['action'])}</pre>{_e(s['parse_error'] or '')}</td><td>{eff}</td>"
            f"<td>{_e(verdict)}</td><td>{s['score']}</td>"
            f"<td>{_e(', '.join(s['signals']))}</td></tr>"
        )
    head = (
        "<tr><th>step</th><th>source</th><th>action</th><th>screen</th><th>recorded verdict</th>"
        "<th>score</th><th>signals</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _step_sections(doc: dict[str, Any]) -> str:
    parts = []
    summaries = {s["step"]: s for s in doc["per_step_summaries"]}
    inspections = {i["step"]: i for i in doc["inspections"]}
    rows = {s["step"]: s for s in doc["steps"]}
    for n in sorted({*summaries, *([doc["root_cause_step"]] if doc["root_cause_step"] else [])}):
        shots = doc["images"].get(str(n), {})
        figs = []
        for kind, caption in (
            ("marked", "before (with marker)"),
            ("before", "before"),
            ("after", "after"),
        ):
            if kind == "before" and "marked" in shots:
                continue
            if kind in shots:
                figs.append(
                    f"<figure><img src='{_e(shots[kind])}' alt='step {n} {kind}'>"
                    f"<figcaption>{caption}</figcaption></figure>"
                )
        s = summaries.get(n, {})
        i = inspections.get(n)
        crit = ""
        if i:
            crit = (
                f"<p><b>critic:</b> {_e(i['status'])} {_e(i['verdict'] or '')} "
                f"{_e(i['dimension'] or '')} {_e(i['explanation'] or i['reason'] or '')}</p>"
            )
        ev = [e for e in doc["evidence"] if e["step"] == n]
        ev_html = "".join(
            f"<li>[{_e(e['source'])}, {_e(e['image'])}"
            + (f", box {e['bbox_1000']}" if e["bbox_1000"] else "")
            + f"] {_e(e['text'])}</li>"
            for e in ev
        )
        title = "root cause" if n == doc["root_cause_step"] else "candidate"
        parts.append(
            f"<div class='box'><h3>Step {n} ({title})</h3>"
            f"<pre>{_e(rows.get(n, {}).get('action'))}</pre>"
            f"<p><b>intent:</b> {_e(s.get('intent_summary'))}<br><b>outcome:</b> "
            f"{_e(s.get('outcome_summary'))}</p>{crit}"
            f"<div class='shots'>{''.join(figs) or '<p class=muted>no screenshots</p>'}</div>"
            + (f"<ul>{ev_html}</ul>" if ev_html else "")
            + "</div>"
        )
    return "".join(parts)


def render_html(doc: dict[str, Any]) -> str:
    """The diagnosis page for a ``diagnosis.json`` document (with its ``images`` map)."""
    notes = "".join(f"<li>{_e(n)}</li>" for n in doc["notes"]) or "<li>none</li>"
    skipped = "".join(
        f"<li>{_e(s['where'])}: {_e(s['reason'])} ({_e(s['detail'])})</li>" for s in doc["skipped"]
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Diagnosis</title>"
        f"<style>{_STYLE}</style></head><body><h1>Root-cause diagnosis</h1>"
        f"{_summary_table(doc)}<h2>Notes</h2><ul>{notes}</ul>"
        f"<h2>Ranking (cheap signals)</h2>{_ranking_table(doc)}"
        f"<h2>Inspected steps</h2>{_step_sections(doc)}"
        f"<h2>All steps</h2>{_steps_table(doc)}"
        + (f"<h2>Skipped input lines</h2><ul>{skipped}</ul>" if skipped else "")
        + "</body></html>\n"
    )
