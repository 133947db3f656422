"""Runs -> a ScaleCUA-layout corpus plus one sidecar per episode, every step accounted for.

Counting unit: one input item = one step a reader produced, one line a reader skipped, or one
file that could not be read at all. Each is kept (a written annotation line) or dropped with a
reason, so ``in == kept + Σ dropped`` (``data_gen.quarantine.Ledger``). A step that cannot be
written ends its episode: the good prefix is kept and the later steps count as
``after_bad_step``, as ingest does, so no written trajectory has a hole.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from data_gen.ingest import sniff_image
from data_gen.quarantine import Ledger
from data_gen.runs._convert import check, grid_lines, unit_calls
from hivig.actions import Terminate
from hivig.files import write_atomic
from hivig.run_folders import FolderRun, FolderStep
from hivig.trajectory import trajectory_id

PROMPT_HEAD = (
    "Please generate the next move according to the UI screenshot, task and previous operations."
)
"""The fixed first line of a ScaleCUA trajectory user turn (training wording)."""
IMAGE_ROOT = "data"
"""``meta.json`` ``root`` of every entry; image paths are ``{benchmark}/{episode}/images/..``."""

REASONS: dict[str, str] = {
    "unreadable_file": "the run's file cannot be read (truncated gzip, not a pickle, ...)",
    "unfinished_run": "the runner's end-of-task record is missing: a run cut short",
    "no_steps": "the run finished without recording a step",
    "outcome_not_selected": "the episode's outcome is not among --outcomes",
    "no_task": "the run records no task instruction",
    "unreadable_action": "the action text does not parse (the reader's reason is kept)",
    "no_intent": "the agent recorded no intent (<operation>), which the layout requires",
    "bad_text": "a text holds a NUL byte, a lone surrogate or a ScaleCUA tag",
    "missing_screenshot": "the screen before the step is not on disk, or not a whole PNG/JPEG",
    "screen_size_mismatch": "the screenshot's size differs from the run's screen",
    "not_expressible": "the action has no ScaleCUA call that reads back as it",
    "conversion_mismatch": "the written call does not read back as the runner's own action",
    "after_bad_step": "an earlier step of the same episode was not written",
}
"""Drop reasons of ingest-runs (reader-level reasons such as ``bad_json`` are kept as given)."""

_TAGS = re.compile(r"</?(think|operation|action)>", re.IGNORECASE)
_UNWRITABLE = re.compile(r"[\x00\ud800-\udfff]")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_LINE_NO = re.compile(r":(\d+)")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _bad(text: str | None) -> bool:
    return text is not None and bool(_UNWRITABLE.search(text) or _TAGS.search(text))


@dataclass
class _Prepared:
    """A step ready to write."""

    step: FolderStep
    lines: list[str]
    size: tuple[int, int]


@dataclass
class Corpus:
    """The corpus being written: annotation lines per meta entry, sidecars, the ledger."""

    out: Path
    ledger: Ledger = field(default_factory=Ledger)
    lines: dict[str, list[str]] = field(default_factory=dict)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    sidecars: dict[str, dict[str, Any]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    disagreements: int = 0
    """Episodes whose last written step terminates with a status the evaluator contradicts."""


def _where(run: FolderRun, root: Path, where: str = "") -> tuple[str, int]:
    src = run.folder.relative_to(root) if run.folder.is_relative_to(root) else run.folder.name
    m = _LINE_NO.search(where)
    name = f"{src}/{where}" if where else str(src)
    return name.rstrip("/") or run.folder.name, int(m.group(1)) if m else 0


def _episode_key(run: FolderRun, root: Path) -> str:
    src, _ = _where(run, root)
    digest = hashlib.blake2b(f"{src}#{run.task_id}".encode(), digest_size=4).hexdigest()
    return f"{_SAFE.sub('_', run.task_id)[:60]}-{digest}"


def _problem(
    run: FolderRun, step: FolderStep, sizes: set[tuple[int, int]]
) -> tuple[str, str] | tuple[list[str], tuple[int, int]]:
    """``(reason, message)`` when the step cannot be written, else ``(lines, size)``."""
    if step.actions is None:
        return "unreadable_action", step.parse_error or "no action"
    if step.intent is None or not step.intent.strip():
        return "no_intent", "no <operation>/intent recorded for the step"
    if _bad(step.intent) or _bad(step.raw_action):
        return "bad_text", "the intent or action text holds a NUL, a lone surrogate or a tag"
    if step.image is not None:
        size: Any = step.image[:2]
    elif step.screenshot is None:
        return "missing_screenshot", f"no screenshot before {step.source_ref}"
    else:
        # The check ingest will make (signature, size, end marker): a truncated file fails here.
        size = sniff_image(step.screenshot, "header")
        if isinstance(size[0], str):
            return "missing_screenshot", f"{size[0]}: {size[1]}"
    # Pixel coordinates are fractions of the run's screen; a trace's grid fits any size but
    # one trajectory keeps one size.
    expected = run.screen if step.calls is not None else next(iter(sizes), size)
    if size != expected:
        return "screen_size_mismatch", f"{size[0]}x{size[1]} screenshot on a {expected} screen"
    if step.calls is not None:
        lines = unit_calls(step.calls, size)
    else:
        got = grid_lines(step.actions)
        if got is None:
            return "not_expressible", f"no ScaleCUA form for {step.actions!r}"
        lines = got
    wrong = check(lines, step.actions, run.platform, size)
    return wrong if wrong is not None else (lines, size)  # type: ignore[return-value]


def _prepare(run: FolderRun, root: Path, corpus: Corpus) -> list[_Prepared]:
    """The steps to write (a prefix of the run's), every other item dropped with a reason."""
    led = corpus.ledger
    for where, reason, detail in run.skipped:
        led.lines += 1
        led.drop(*_where(run, root, where), reason, detail)
    led.lines += len(run.steps)
    if not run.steps and not run.skipped:
        # A run that left nothing to count (killed before its first record) is still one item.
        led.lines += 1
        reason = "no_steps" if run.finished else "unfinished_run"
        led.drop(*_where(run, root), reason, "; ".join(run.notes[:2]) or "no step recorded")
        return []
    whole = None
    if not run.finished:
        whole = ("unfinished_run", "; ".join(run.notes[:2]) or "the run has no end record")
    elif not (run.task or "").strip() or _bad(run.task) or "Previous operations:" in run.task:
        whole = ("no_task", "no usable task instruction")
    if whole is not None:
        for step in run.steps:
            led.drop(*_where(run, root, step.source_ref), *whole)
        return []
    kept: list[_Prepared] = []
    for k, step in enumerate(run.steps):
        got = _problem(run, step, {p.size for p in kept})
        if isinstance(got[0], str):
            led.drop(*_where(run, root, step.source_ref), got[0], str(got[1])[:500])
            for later in run.steps[k + 1 :]:
                led.drop(*_where(run, root, later.source_ref), "after_bad_step", step.source_ref)
            break
        kept.append(_Prepared(step, *got))  # type: ignore[arg-type]
    return kept


def _save_screen(step: FolderStep, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if step.image is not None:
        w, h, mode, raw = step.image
        Image.frombytes(mode, (w, h), raw).convert("RGB").save(target, format="PNG")
    else:
        shutil.copyfile(step.screenshot, target)  # type: ignore[arg-type]


def _line(task: str, history: list[str], prep: _Prepared, image: str) -> str:
    past = "\n".join(f"Step {k}: {op}" for k, op in enumerate(history, 1)) or "None"
    human = f"<image>\n{PROMPT_HEAD}\n\nTask: {task}\n\nPrevious operations:\n{past}"
    think = prep.step.thought
    head = f"<think>\n{think.strip()}\n</think>\n" if think and not _bad(think) else ""
    body = "\n".join(prep.lines)
    operation = _one_line(prep.step.intent or "")
    gpt = f"{head}<operation>\n{operation}\n</operation>\n<action>\n{body}\n</action>"
    record = {
        "image": image,
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
        "width": prep.size[0],
        "height": prep.size[1],
    }
    return json.dumps(record, ensure_ascii=False)


def add_run(run: FolderRun, root: Path, benchmark: str, corpus: Corpus, outcomes: set[str]) -> None:
    """Account for one run and, when it has writable steps, add its episode to ``corpus``."""
    if run.outcome not in outcomes and run.finished:
        corpus.ledger.lines += len(run.skipped) + len(run.steps)
        for where, reason, detail in run.skipped:
            corpus.ledger.drop(*_where(run, root, where), reason, detail)
        for step in run.steps:
            corpus.ledger.drop(
                *_where(run, root, step.source_ref), "outcome_not_selected", run.outcome
            )
        return
    kept = _prepare(run, root, corpus)
    if not kept:
        return
    task = _one_line(run.task or "")
    episode = _episode_key(run, root)
    if f"{benchmark}/{episode}.json" in corpus.sidecars:  # two episodes of one source file
        episode = f"{episode}-{len(corpus.sidecars)}"
    folder = f"{benchmark}/{episode}"
    reasoned = any(p.step.thought and not _bad(p.step.thought) for p in kept)
    family = "planning_cot" if reasoned else "navigation"
    key = f"agent_runs_{benchmark}_{run.platform}_{family}"
    corpus.entries[key] = {
        "root": IMAGE_ROOT,
        "annotation": f"annotations/{key}.jsonl",
        "task": f"{run.platform}_{family}",
        "conv_style": f"internvl2_5_{run.platform}_{family}_v1",
        "repeat_time": 1,
    }
    history: list[str] = []
    lines = corpus.lines.setdefault(key, [])
    for k, prep in enumerate(kept):
        suffix = ".png" if prep.step.screenshot is None else prep.step.screenshot.suffix.lower()
        image = f"{folder}/images/step_{k:03d}{suffix}"
        _save_screen(prep.step, corpus.out / IMAGE_ROOT / image)
        lines.append(_line(task, history, prep, image))
        history.append(_one_line(prep.step.intent or ""))
        corpus.ledger.kept += 1
    last = kept[-1].step.actions or []
    said = last[-1].status if last and isinstance(last[-1], Terminate) else None
    if said is not None and run.outcome in ("success", "failure") and said != run.outcome:
        corpus.disagreements += 1
    corpus.outcomes[run.outcome] += 1
    corpus.sidecars[f"{folder}.json"] = _sidecar(run, root, benchmark, folder, task, kept, said)


def _sidecar(
    run: FolderRun,
    root: Path,
    benchmark: str,
    folder: str,
    task: str,
    kept: list[_Prepared],
    said: str | None,
) -> dict[str, Any]:
    return {
        "episode": folder,
        "trajectory_id": trajectory_id(folder, task),
        "benchmark": benchmark,
        "task_id": run.task_id,
        "task": task,
        "platform": run.platform,
        "screen": list(run.screen) if run.screen else None,
        "outcome": run.outcome,
        "score": run.score,
        "terminate_status": said,
        "agent_model": run.model,
        "source": _where(run, root)[0],
        "steps_in_run": len(run.steps),
        "steps_written": len(kept),
        "verdicts": [
            {"step": k, "source_ref": p.step.source_ref, **v}
            for k, p in enumerate(kept)
            for v in p.step.verdicts
        ],
        "notes": run.notes,
    }


def write_corpus(corpus: Corpus) -> dict[str, Any]:
    """Check the counts and write meta.json, annotations, sidecars, quarantine and stats.

    Returns:
        The stats that were written.

    Raises:
        AccountingError: ``in != kept + Σ dropped`` (a bug; nothing is written).
    """
    corpus.ledger.check()
    out = corpus.out
    for key, lines in corpus.lines.items():
        write_atomic(out / corpus.entries[key]["annotation"], "\n".join(lines) + "\n")
    for name, sidecar in corpus.sidecars.items():
        write_atomic(out / "episodes" / name, json.dumps(sidecar, indent=2) + "\n")
    entries = json.dumps(dict(sorted(corpus.entries.items())), indent=2) + "\n"
    write_atomic(out / "meta.json", entries)
    rows = [json.dumps(e.to_json(), ensure_ascii=False) for e in corpus.ledger.sorted_entries()]
    write_atomic(out / "quarantine.jsonl", "".join(r + "\n" for r in rows))
    stats = {
        "in": corpus.ledger.lines,
        "kept": corpus.ledger.kept,
        "dropped": dict(sorted(corpus.ledger.dropped.items())),
        "episodes": len(corpus.sidecars),
        "outcomes": dict(sorted(corpus.outcomes.items())),
        "terminate_disagrees_with_outcome": corpus.disagreements,
    }
    write_atomic(out / "stats.json", json.dumps(stats, indent=2) + "\n")
    return stats


def write_diagnoses(
    corpus: Corpus, diagnoses: dict[str, Any], stats: dict[str, Any]
) -> dict[str, Any]:
    """Rewrite the sidecars that gained a diagnosis, its quarantine, and the stats with it."""
    out = corpus.out
    for name, sidecar in corpus.sidecars.items():
        if "diagnosis" in sidecar:
            write_atomic(out / "episodes" / name, json.dumps(sidecar, indent=2) + "\n")
    rows = [json.dumps(q, ensure_ascii=False) for q in diagnoses.pop("quarantine")]
    write_atomic(out / "diagnoses_quarantine.jsonl", "".join(r + "\n" for r in rows))
    stats = {**stats, "diagnoses": diagnoses}
    write_atomic(out / "stats.json", json.dumps(stats, indent=2) + "\n")
    return stats
