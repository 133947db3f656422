"""``diagnose``: load a failed run, rank candidate steps cheaply, inspect the top k, decide.

The pipeline:

1. load the trace, OSWorld folder or trajectories file (``loaders``);
2. rank steps by cheap signals (``signals``): recorded Bad verdicts, no-effect steps, recurrence
   onsets, failed ``Last Action Result`` lines, a failed terminate;
3. inspect the top ``k`` candidates, earliest first, with the critic backend when there is one
   (``critic``);
4. choose the earliest candidate the critic confirms as Bad; without a backend, or when the
   critic's answers cannot be used, the top cheap candidate with a lowered confidence. The result
   says which of the two happened and why.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hivig.backends import InferenceBackend, Sampling, SyncBackend, backend_model_name
from hivig.config import FrameConfig
from hivig.screens import volatile_boxes
from hivig.taxonomy import Dimension, lookup_dimension
from serve.diagnose.cuadebug import error_label
from serve.diagnose.inspection import Inspection, Inspector, step_text
from serve.diagnose.loaders import load_run
from serve.diagnose.run import Run, RunStep
from serve.diagnose.screens import Change, Screens
from serve.diagnose.signals import UNRESPONSIVE_CONTROL, Candidate, guess_error, rank_candidates

SCHEMA_VERSION = "1"

SUCCEEDED = "run_succeeded"
"""``method`` of a run whose recorded outcome is success: it has no root-cause step."""

CHEAP_CONFIDENCE_CAP = 0.45
"""Highest confidence a diagnosis from cheap signals alone can carry."""

_BBOX_HALF = 30  # half side of an evidence box around a marker, grid units


@dataclass
class DiagnosisResult:
    """The diagnosis of one failed run (``to_json`` is ``diagnosis.json``).

    Attributes:
        root_cause_step: The earliest step judged to have caused the failure (1-based, as in
            ``steps``), ``None`` for a run without steps or one that succeeded.
        error: CUADebug L1/L2 codes and names plus the critic's dimension (``None`` for system
            and unknown causes).
        evidence: Grounded evidence: step, image (``before``/``after``), box on the 0-1000 grid
            around the action's marker, text, and the source of the item.
        correction: What the agent should have done at the root-cause step.
        confidence: In [0, 1]; at most ``CHEAP_CONFIDENCE_CAP`` without a usable critic answer.
        method: ``critic`` (confirmed by the critic), ``cheap_signals``, or ``run_succeeded``
            (the recorded outcome is success: no root cause is named).
        per_step_summaries: Intent and outcome of each considered step.
        candidates_considered: The top-k steps, earliest first.
        ranking: Every step with a cheap signal, by score, with its signals.
        inspections: What the critic answered per inspected step (empty without a backend).
        backend: The backend's name and how many answers parsed.
        input: The input's kind, path, task, platform, screen, outcome and score.
        steps: One row per step (action, screens, change, recorded verdict, score).
        skipped: Input lines that were not used, with reasons.
        notes: Facts that qualify the result (assumptions, fallbacks, missing screenshots).
    """

    root_cause_step: int | None
    error: dict[str, Any]
    evidence: list[dict[str, Any]]
    correction: str
    confidence: float
    method: str
    per_step_summaries: list[dict[str, Any]]
    candidates_considered: list[int]
    ranking: list[dict[str, Any]]
    inspections: list[dict[str, Any]] = field(default_factory=list)
    backend: dict[str, Any] = field(default_factory=dict)
    input: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The JSON object written as ``diagnosis.json``."""
        return {
            "schema_version": self.schema_version,
            "root_cause_step": self.root_cause_step,
            "error": self.error,
            "evidence": self.evidence,
            "correction": self.correction,
            "confidence": self.confidence,
            "method": self.method,
            "per_step_summaries": self.per_step_summaries,
            "candidates_considered": self.candidates_considered,
            "ranking": self.ranking,
            "inspections": self.inspections,
            "backend": self.backend,
            "input": self.input,
            "steps": self.steps,
            "skipped": self.skipped,
            "notes": self.notes,
        }


# --------------------------------------------------------------------------------------------
# Public entry points


def diagnose(
    path: str | Path,
    *,
    backend: InferenceBackend | SyncBackend | None = None,
    top_k: int = 3,
    out_dir: str | Path | None = None,
    images_root: str | Path | None = None,
    trajectory_id: str | None = None,
    frame: FrameConfig | None = None,
    sampling: Sampling | None = None,
    use_history: bool = True,
) -> DiagnosisResult:
    """Diagnose a failed run: root-cause step, error family, evidence, correction, confidence.

    Args:
        path: A gateway trace (``traces/<sid>.jsonl``), an OSWorld result folder (or its
            ``traj.jsonl``), or an ingested trajectories file.
        backend: A critic backend; ``None`` for cheap signals only. An async backend is driven
            on a private event loop for this call (pass a ``SyncBackend`` to reuse one backend
            across calls; inside a running loop await ``diagnose_async``).
        top_k: Candidates to inspect with the critic.
        out_dir: Folder for ``diagnosis.json``, ``diagnosis.html`` and ``images/``; nothing is
            written when ``None``.
        images_root: Corpus root of an ingested trajectories file.
        trajectory_id: Which trajectory of a trajectories file to diagnose.
        frame: The backend's pixel budget (its processor's); the defaults otherwise.
        sampling: Sampling of the critic requests.
        use_history: Also ask the critic's history task for each inspected step's outcome.

    Returns:
        The result.

    Raises:
        DiagnoseInputError: The path cannot be read as any of the three inputs.
        ValueError: ``top_k`` is below 1.
        RuntimeError: An async backend was passed from inside a running event loop.
    """
    kwargs = dict(
        top_k=top_k,
        out_dir=out_dir,
        images_root=images_root,
        trajectory_id=trajectory_id,
        frame=frame,
        sampling=sampling,
        use_history=use_history,
    )
    if backend is None:
        return _finish(*_prepare(path, top_k, images_root, trajectory_id), [], None, out_dir)
    if isinstance(backend, SyncBackend):
        return backend.run(diagnose_async(path, backend=backend.backend, **kwargs))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(diagnose_async(path, backend=backend, **kwargs))
    raise RuntimeError("diagnose() was called inside an event loop; await diagnose_async()")


async def diagnose_async(
    path: str | Path,
    *,
    backend: InferenceBackend | None = None,
    top_k: int = 3,
    out_dir: str | Path | None = None,
    images_root: str | Path | None = None,
    trajectory_id: str | None = None,
    frame: FrameConfig | None = None,
    sampling: Sampling | None = None,
    use_history: bool = True,
) -> DiagnosisResult:
    """``diagnose`` for callers that run an event loop (the gateway's diagnose jobs).

    Loading, hashing and report writing are CPU work; the gateway should run this in its job
    worker, not on the request path.
    """
    run, screens, ranked, changes, considered = _prepare(path, top_k, images_root, trajectory_id)
    inspections: list[Inspection] = []
    name = None
    if backend is not None:
        inspector = Inspector(backend, frame=frame, sampling=sampling, use_history=use_history)
        by_step = {s.step: s for s in run.steps}
        inspections = await inspector.inspect_all(run, [by_step[n] for n in considered])
        name = backend_model_name(backend) or type(backend).__name__
    return _finish(run, screens, ranked, changes, considered, inspections, name, out_dir)


# --------------------------------------------------------------------------------------------
# Steps of the pipeline


def _prepare(
    path: str | Path, top_k: int, images_root: str | Path | None, trajectory_id: str | None
) -> tuple[Run, Screens, list[Candidate], dict[int, Change | None], list[int]]:
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    run = load_run(path, images_root=images_root, trajectory_id=trajectory_id)
    screens = Screens(volatile_boxes(run.platform, run.volatile_regions))
    ranked, changes = rank_candidates(run, screens)
    considered = sorted(c.step for c in ranked[:top_k])
    return run, screens, ranked, changes, considered


def _finish(
    run: Run,
    screens: Screens,
    ranked: list[Candidate],
    changes: dict[int, Change | None],
    considered: list[int],
    inspections: list[Inspection],
    backend_name: str | None,
    out_dir: str | Path | None,
) -> DiagnosisResult:
    notes = list(run.notes)
    by_step = {s.step: s for s in run.steps}
    cands = {c.step: c for c in ranked}
    decision = _decide(run, ranked, inspections, backend_name, notes)
    root = by_step.get(decision.step) if decision.step is not None else None
    evidence = _evidence(run, root, cands.get(decision.step), decision, changes)
    result = DiagnosisResult(
        root_cause_step=decision.step,
        error=error_label(decision.dimension, decision.l2),
        evidence=evidence,
        correction=_correction(root, decision, cands.get(decision.step)),
        confidence=round(decision.confidence, 3),
        method=decision.method,
        per_step_summaries=[
            _summary(run, by_step[n], changes.get(n), cands.get(n), inspections) for n in considered
        ],
        candidates_considered=considered,
        ranking=[c.to_json() for c in ranked],
        inspections=[i.to_json() for i in inspections],
        backend=_backend_info(backend_name, inspections),
        input=_input_info(run),
        steps=[_step_row(run, s, changes.get(s.step), cands.get(s.step)) for s in run.steps],
        skipped=[s.to_json() for s in run.skipped],
        notes=notes,
    )
    if screens.unreadable:
        notes.append(f"{len(screens.unreadable)} screenshot(s) could not be decoded")
    if out_dir is not None:
        from serve.diagnose.report import write_outputs

        write_outputs(result, run, Path(out_dir))
    return result


@dataclass
class _Decision:
    step: int | None
    dimension: Dimension | None
    l2: str | None
    confidence: float
    method: str
    why: str
    inspection: Inspection | None = None


def _cheap_confidence(ranked: list[Candidate]) -> float:
    top = ranked[0].score
    second = ranked[1].score if len(ranked) > 1 else 0.0
    margin = (top - second) / max(top, 1.0)
    return min(CHEAP_CONFIDENCE_CAP, 0.15 + 0.04 * min(top, 5.0) + 0.1 * margin)


def _run_error_code(run: Run) -> str | None:
    errors = [s.detail.lower() for s in run.skipped if s.reason == "error_line"]
    if not errors:
        return None
    return "S4" if any("limit" in e or "exceed" in e for e in errors) else "S5"


def _decide(
    run: Run,
    ranked: list[Candidate],
    inspections: list[Inspection],
    backend_name: str | None,
    notes: list[str],
) -> _Decision:
    by_step = {s.step: s for s in run.steps}
    if run.outcome == "success":
        # Nothing failed, so no step caused a failure; the ranking still shows the mistakes
        # the run recovered from.
        strongest = f"; the strongest marks step {ranked[0].step}" if ranked else ""
        notes.append(
            "the run succeeded (its recorded outcome): no root-cause step; the signals below "
            f"mark mistakes it recovered from{strongest}"
        )
        return _Decision(None, None, None, 0.0, SUCCEEDED, "the run succeeded")
    if not ranked:
        code = _run_error_code(run)
        notes.append("no cheap signal fired; the last step is reported with a minimal confidence")
        last = run.steps[-1].step if run.steps else None
        why = "runner error" if code else "no signal"
        return _Decision(last, None, code, 0.05, "cheap_signals", why)
    top = ranked[0]
    dim, l2, why = guess_error(by_step[top.step], top)
    cheap = _Decision(top.step, dim, l2, _cheap_confidence(ranked), "cheap_signals", why)
    if backend_name is None:
        notes.append(
            "no critic backend: the result rests on cheap signals only and its confidence is "
            f"capped at {CHEAP_CONFIDENCE_CAP}"
        )
        return cheap
    usable = [i for i in inspections if i.status == "ok"]
    failed = [i for i in inspections if i.status != "ok"]
    if failed:
        reasons = ", ".join(f"step {i.step}: {i.status} ({i.reason})" for i in failed)
        notes.append(f"critic answers not used: {reasons}")
    bad = sorted((i for i in usable if i.verdict == "Bad"), key=lambda i: i.step)
    if bad:
        first = bad[0]
        cand = next(c for c in ranked if c.step == first.step)
        conf = 0.5 + (0.15 if first.step == top.step else 0.0) + 0.05 * min(len(cand.signals), 3)
        dimension = lookup_dimension(first.dimension or "")
        return _Decision(
            first.step,
            dimension,
            None,
            min(conf, 0.85),
            "critic",
            "the earliest inspected step the critic judged Bad",
            first,
        )
    if usable:
        notes.append("the critic judged every usable inspected step Good; cheap signals decide")
        cheap.confidence *= 0.6
    else:
        notes.append("no critic answer could be used; fell back to the cheap signals")
    return cheap


# --------------------------------------------------------------------------------------------
# Result parts


def _marker_box(step: RunStep | None) -> list[int] | None:
    for a in (step.actions or []) if step else []:
        coord = getattr(a, "coordinate", None)
        if isinstance(coord, tuple) and len(coord) == 2:
            x, y = coord
            h = _BBOX_HALF
            return [max(0, x - h), max(0, y - h), min(1000, x + h), min(1000, y + h)]
    return None


_AFTER_SIGNALS = {"no_effect", "no_effect_repeat", "later_reverted", "premature_done"}


def _evidence(
    run: Run,
    step: RunStep | None,
    cand: Candidate | None,
    decision: _Decision,
    changes: dict[int, Change | None],
) -> list[dict[str, Any]]:
    if step is None:
        return []
    box = _marker_box(step)
    out: list[dict[str, Any]] = [
        {
            "step": step.step,
            "image": "before",
            "bbox_1000": box,
            "text": f"action: {step.raw[:300]}",
            "source": "action",
        }
    ]
    if decision.inspection is not None:
        i = decision.inspection
        out.append(
            {
                "step": step.step,
                "image": "before",
                "bbox_1000": box,
                "text": f"critic: Bad ({i.dimension}): {i.explanation}",
                "source": "critic",
            }
        )
        if i.outcome:
            out.append(
                {
                    "step": step.step,
                    "image": "after",
                    "bbox_1000": None,
                    "text": f"outcome: {i.outcome}",
                    "source": "critic_history",
                }
            )
    for sig in cand.signals if cand else []:
        image = "after" if sig.name in _AFTER_SIGNALS and step.after is not None else "before"
        out.append(
            {
                "step": step.step,
                "image": image,
                "bbox_1000": box,
                "text": sig.detail,
                "source": f"signal:{sig.name}",
            }
        )
    if run.steps and run.steps[-1].step != step.step:
        score = f" (score {run.score:g})" if run.score is not None else ""
        out.append(
            {
                "step": run.steps[-1].step,
                "image": "after",
                "bbox_1000": None,
                "text": f"final outcome: {run.outcome}{score}",
                "source": "outcome",
            }
        )
    return out


_CORRECTIONS = {
    "grounding_spatial_error": (
        "Aim at the centre of the intended element; the point{at} hits no control. Check the "
        "marker against the element's visible bounds before clicking."
    ),
    "unresponsive_control": (
        "The point{at} is on a control that did not respond (it looks disabled or inert): "
        "bring about what enables it first, or reach the goal another way; do not click it "
        "again."
    ),
    "procedural_prerequisite_neglect": (
        "First give the target field focus (click into it) or dismiss what blocks it, then "
        "type or press the keys."
    ),
    "parameter_vector_miscalibration": (
        "Reverse or enlarge the scroll/drag vector so the content moves toward the target."
    ),
    "action_formulation_error": "Emit a valid action call{why}.",
    "termination_misjudgment": (
        "Do not end the task yet: check on screen that every requirement is met and carry out "
        "the remaining steps."
    ),
    "semantic_error": (
        "Re-read the labels and choose the element whose label matches the task; the element "
        "chosen here led to a screen the agent later had to leave."
    ),
    "visual_hallucination": "Act only on elements that are visible on the current screen.",
    "action_operation_misalignment": "Point the coordinates at the element the intent names.",
    "timing_and_latency_neglect": "Wait until the interface has finished loading, then act.",
    "observation_neglect": "Use the target that is already visible instead of searching for it.",
    "constraint_neglect": "Choose the element that satisfies the constraint stated in the task.",
    "suboptimal_path": "Use the direct method (type the text, select all) instead of micro-steps.",
}


def _correction(step: RunStep | None, decision: _Decision, cand: Candidate | None) -> str:
    if decision.method == SUCCEEDED:
        return "None: the run succeeded."
    if step is None:
        return "No step to correct."
    if decision.dimension is None:
        if decision.l2 in ("S4", "S5"):
            return "Re-run the step after checking the environment and the runner's limits."
        return f"Inspect step {step.step} by hand; the signals do not name a specific fix."
    point = next((a.coordinate for a in step.actions or [] if hasattr(a, "coordinate")), None)
    at = f" at ({point[0]}, {point[1]}) on the 0-1000 grid" if point else ""
    why = f" ({step.parse_error})" if step.parse_error else ""
    key = decision.dimension.key
    if decision.why == UNRESPONSIVE_CONTROL:
        key = "unresponsive_control"
    text = _CORRECTIONS[key].format(at=at, why=why)
    if cand is not None and "recurrence_onset" in cand.names():
        text += (
            " After an attempt with no effect, change the target or the method; do not repeat it."
        )
    return text


def _summary(
    run: Run,
    step: RunStep,
    change: Change | None,
    cand: Candidate | None,
    inspections: list[Inspection],
) -> dict[str, Any]:
    inspection = next((i for i in inspections if i.step == step.step), None)
    intent = step.intent or (step.think.strip().splitlines()[0][:200] if step.think else None)
    intent = intent or f"executes {step_text(run, step).splitlines()[-1][:200]}"
    if inspection is not None and inspection.outcome:
        outcome = inspection.outcome
    elif step.after is None and change is None:
        outcome = "no after-screenshot recorded"
    elif change is None:
        outcome = "a screenshot is unreadable; the change is unknown"
    elif change.no_effect:
        outcome = "the screen did not visibly change"
    elif change.diff_frac < 0:  # recorded by the gateway without a pixel share
        outcome = "the screen changed"
    else:
        outcome = f"the screen changed ({100 * change.diff_frac:.1f} % of pixels)"
    if cand is not None:
        outcome += f"; signals: {', '.join(s.name for s in cand.signals)}"
    critic = inspection is not None and inspection.status == "ok"
    return {
        "step": step.step,
        "intent_summary": intent,
        "outcome_summary": outcome,
        "critic_verdict": inspection.verdict if critic else None,
        "summary_source": "debugger_inspected" if critic else "cheap_signals",
    }


def _backend_info(name: str | None, inspections: list[Inspection]) -> dict[str, Any]:
    return {
        "model": name,
        "inspected": len(inspections),
        "parsed": sum(i.status == "ok" for i in inspections),
        "statuses": {
            s: sum(i.status == s for i in inspections)
            for s in sorted({i.status for i in inspections})
        },
    }


def _input_info(run: Run) -> dict[str, Any]:
    return {
        "kind": run.kind,
        "path": str(run.source),
        "task": run.task,
        "platform": run.platform,
        "screen": {"w": run.screen[0], "h": run.screen[1]},
        "outcome": run.outcome,
        "score": run.score,
        "num_steps": len(run.steps),
    }


def _step_row(
    run: Run, step: RunStep, change: Change | None, cand: Candidate | None
) -> dict[str, Any]:
    v = step.verdict
    return {
        "step": step.step,
        "source_ref": step.source_ref,
        "action": step_text(run, step)[:600],
        "raw": step.raw[:600],
        "intent": step.intent,
        "parse_error": step.parse_error,
        "error": step.error,
        "executed": step.executed,
        "before": str(step.before) if step.before else None,
        "after": str(step.after) if step.after else None,
        "change": change.to_json() if change else None,
        "recorded_verdict": (
            {
                "verdict": v.verdict,
                "source": v.source,
                "error_dimension": v.dimension,
                "confidence": v.confidence,
            }
            if v
            else None
        ),
        "last_action_result": step.last_action_result,
        "score": cand.score if cand else 0.0,
        "signals": [s.name for s in cand.signals] if cand else [],
    }
