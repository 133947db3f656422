"""The demo's flywheel step: its own episode, back through data_gen, shown on the index page.

    python -m data_gen ingest-runs --format trace --root demo_out/flywheel/state \\
        --out demo_out/flywheel/runs
    python -m data_gen run --config configs/data_gen/demo_flywheel.yaml \\
        corpus=demo_out/flywheel/runs runs.corpus=demo_out/flywheel/runs out=demo_out/flywheel/data
    python -m serve.demo flywheel --runs demo_out/flywheel/runs --data demo_out/flywheel/data \\
        --out demo_out

``python -m serve.demo`` leaves the episode as a run folder (``write_run_folder``) and the
index's inputs in ``OUT/pages.json``; ``make demo`` runs data_gen on it as its own processes
(serve never imports data_gen), and this module rewrites ``index.html`` with the samples it
made: each with its marked screenshot, label and provenance (``python -m serve.demo flywheel``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from hivig.records import SFTRecord, read_records
from hivig.vision import FAST_PNG_LEVEL, canonical_frame, encode_png, size_class_for_platform
from serve.demo.pages import DISPLAY_PIXELS, escape

RUN_FOLDER = "flywheel/state"
"""Under the demo's ``OUT``: the episode as a gateway state folder (``traces/``, ``images/``)."""

PAGES_JSON = "pages.json"
"""Under ``OUT``: the links and facts of the index, so a later step can render it again."""

MAX_CARDS = 12
"""Samples shown on the index (a run of ~5 steps gives about twice that many records)."""

SPLITS = ("train", "val", "test")


# ---------------------------------------------------------------------------------------------
# The run folder (written by ``python -m serve.demo``)


def write_run_folder(trace: Path, state_dir: Path, out_dir: Path, outcome: str) -> Path:
    """Copy one session's trace and its screenshots to ``out_dir``, with the runner's outcome.

    The gateway's ``DELETE /v1/sessions/{sid}`` takes no outcome, so its close event has none;
    the trace format reads an ``outcome`` a runner reports on the close event, and the runner
    here (the demo, which holds the environment's reward) adds that event to its copy. The
    gateway's own state folder is left as the gateway wrote it.

    Args:
        trace: ``STATE/traces/<sid>.jsonl``.
        state_dir: The gateway's state folder (its ``images/``).
        out_dir: The folder to (re)create as ``traces/`` + ``images/``.
        outcome: ``success`` or ``failure``, as the environment evaluated the episode.

    Returns:
        The copied trace.
    """
    if outcome not in ("success", "failure"):
        raise ValueError(f"outcome must be success or failure, not {outcome!r}")
    shutil.rmtree(out_dir, ignore_errors=True)
    (out_dir / "traces").mkdir(parents=True)
    (out_dir / "images").mkdir()
    lines = [line for line in trace.read_text(encoding="utf-8").splitlines() if line.strip()]
    for ref in {r for line in lines for r in _image_refs(json.loads(line))}:
        src = state_dir / "images" / f"{ref.split(':', 1)[1]}.png"
        if src.is_file():
            shutil.copyfile(src, out_dir / "images" / src.name)
    close = {"event": "close", "session_id": trace.stem, "outcome": outcome, "by": "runner"}
    copy = out_dir / "traces" / trace.name
    copy.write_text("\n".join([*lines, json.dumps(close)]) + "\n", encoding="utf-8")
    return copy


def _image_refs(event: dict[str, Any]) -> list[str]:
    refs = [event.get("image_ref"), event.get("prev_image_ref")]
    return [r for r in refs if isinstance(r, str) and r.startswith("sha256:")]


# ---------------------------------------------------------------------------------------------
# The samples section


def _records(data: Path) -> list[SFTRecord]:
    """Every record of ``DATA/dataset/records/<split>``; a split without shards is empty."""
    records: list[SFTRecord] = []
    for split in SPLITS:
        folder = data / "dataset" / "records" / split
        if folder.is_dir() and any(folder.glob("part-*.parquet")):
            records.extend(read_records(folder))
    return records


def _shown(records: list[SFTRecord]) -> list[SFTRecord]:
    """Critique samples first (real Bads, then the rest by step), history samples after them."""
    order = {"critique": 0, "history": 1}
    return sorted(
        records,
        key=lambda r: (
            r.labels.generator != "run",
            order.get(r.kind, 2),
            r.step_index,
            r.id,
        ),
    )[:MAX_CARDS]


def _proposed(record: SFTRecord) -> str:
    """The step the sample asks about: the text after ``Current Proposed Step:``."""
    text = getattr(record.user[-1], "text", "") if record.user else ""
    return text.rsplit("Current Proposed Step:", 1)[-1].strip() if "Proposed" in text else ""


def _card(record: SFTRecord, runs: Path, out: Path, n: int) -> str:
    image = record.images[0]
    frame = canonical_frame(
        runs / image.path,
        min_pixels=65_536,
        max_pixels=DISPLAY_PIXELS // 4,  # a card, not a full page: a quarter of the frame
        marks=image.marks,
        size_class=size_class_for_platform(record.platform),
    )
    shot = out / "flywheel" / "cards" / f"s{n}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.write_bytes(encode_png(frame, FAST_PNG_LEVEL))
    lab, prov = record.labels, record.provenance
    if record.kind == "critique":
        css = "good" if lab.verdict == "Good" else "bad"
        dim = f" · {escape(lab.error_dimension)}" if lab.error_dimension else ""
        label = f"<span class='tag {css}'>{escape(lab.verdict)}{dim}</span>"
    else:
        label = "<span class='tag abstain'>history sample</span>"
    generator = f"generator {escape(lab.generator)}" if lab.generator else "the executed step"
    hard = f" · hard case: {escape(prov.hard_case)}" if prov.hard_case else ""
    proposed = _proposed(record)
    return (
        f"<div class='card'><img src='flywheel/cards/{shot.name}' alt='sample {escape(record.id)}' "
        f"data-marks='{len(image.marks)}'>"
        f"<p>{label} step {record.step_index} · {generator}{hard}<br>"
        f"<code>{escape(record.id)}</code> ({escape(record.split)})<br>provenance: source "
        f"<b>{escape(prov.source)}</b>, benchmark <b>{escape(prov.benchmark)}</b>, task "
        f"<code>{escape(prov.task_id)}</code>; annotator {escape(prov.annotator_kind)}</p>"
        + (f"<pre>{escape(proposed)}</pre>" if proposed else "")
        + "</div>"
    )


def _counts(runs: Path, records: list[SFTRecord]) -> str:
    stats = json.loads((runs / "stats.json").read_text(encoding="utf-8"))
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(stats.get("dropped", {}).items()))
    kinds: dict[str, int] = {}
    for r in records:
        key = f"{r.labels.verdict} critique" if r.kind == "critique" else "history"
        kinds[key] = kinds.get(key, 0) + 1
    made = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(stats.get("outcomes", {}).items()))
    return (
        f"<p><code>ingest-runs --format trace</code>: {stats['in']} in = {stats['kept']} kept "
        f"+ {stats['in'] - stats['kept']} dropped ({escape(dropped or 'none')}); episodes by the "
        f"runner's reported outcome: {escape(outcomes)}. <code>data_gen run</code> with the "
        "offline "
        f"annotator: {len(records)} records ({escape(made)}).</p>"
    )


def section(runs: Path, data: Path, out: Path, executed: int | None = None) -> tuple[str, int]:
    """The index's flywheel section and how many samples it shows.

    ``executed`` (the environment's step count, terminate not counted) is shown next to what
    the trace reader kept, so a reader that loses steps is visible on the page.
    """
    records = [r for r in _records(data) if r.provenance.source == "run"]
    cards = [_card(r, runs, out, n) for n, r in enumerate(_shown(records))]
    html = (
        "<div class='card'><h2>5. The flywheel: this episode as training data</h2>"
        "<p>The episode's trace went through <code>python -m data_gen ingest-runs --format "
        "trace</code> (the runner reported the environment's outcome on the close event) and "
        "a small <code>python -m data_gen run</code>. A successful run's executed steps give "
        "Good samples, macro-history samples and perturbations, as ScaleCUA trajectories do; a "
        "failed one gives a real Bad at its diagnosed root cause.</p>"
        f"{_counts(runs, records)}"
        + (
            f"<p>The environment executed {executed} actions before the terminate; the "
            "trace reader's kept steps are the ones above.</p>"
            if executed is not None
            else ""
        )
        + "<p class='note'>Every step of a successful run becomes a Good sample, the injected "
        "mistake (typing with no field focused) too: a critic that called it Bad would have "
        "made it a tagged hard case (<code>critic_bad_on_success</code>); this one abstains."
        "</p>"
        f"<p><a href='{escape(os.path.relpath(data / 'dataset' / 'report.html', out))}'>Data "
        "report of these samples</a> · <a href='"
        f"{escape(os.path.relpath(data / 'dataset' / 'provenance.jsonl', out))}'>provenance per "
        "record</a></p>"
        f"<div class='samples'>{''.join(cards) or '<p>No samples were made from this run.</p>'}"
        "</div></div>"
    )
    return html, len(cards)
