"""Root causes from ``python -m serve.diagnose`` into the episode sidecars, and onto dimensions.

    python -m serve.diagnose RESULTS/pyautogui/screenshot/MODEL/chrome/TASK --out DIAG/TASK
    python -m data_gen ingest-runs --format osworld --root RESULTS --out RUNS --diagnoses DIAG

The handoff is files only: data_gen reads ``diagnosis.json`` files and never imports serve.

**Matching key.** A diagnosis belongs to the episode whose run it diagnosed: its
``input.path`` (the result folder, its ``traj.jsonl``, or the trace file given to diagnose) is
compared with the run's source as the sidecar records it (``source``, the run folder relative
to ``--root``); it matches when the path is that source or ends with ``/<source>``. Each
diagnosis file is accounted for: ``matched`` or dropped with a reason (``bad_json``,
``no_matching_run``, ``ambiguous_run``, ``run_not_failed``, ``root_cause_not_written``,
``no_root_cause``, ``duplicate_diagnosis``).

**Step numbering.** diagnose numbers steps from 1 in the order of the run; ingest-runs writes
the same steps from index 0, so the root cause is written step ``root_cause_step - 1``. A root
cause beyond the steps written (a tail quarantined by ingest-runs) cannot be used.

**Categories onto dimensions.** ``CUADEBUG_TO_DIMENSION`` is the one mapping table: each of
CUADebug's 30 L2 codes maps to the critic dimension whose error it is, or to ``None`` where no
dimension fits cleanly (system, environment and infeasibility causes, OCR slips, memory and
planning failures). ``data_gen run`` drops a failed run whose root cause has no dimension and
counts it (``no_dimension``): a Bad record must carry one.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hivig.taxonomy import DIMENSIONS, dimension_by_key

CUADEBUG_TO_DIMENSION: dict[str, str | None] = {
    "P1": "visual_hallucination",  # acts on an element that is not on screen
    "P2": None,  # misread text: no dimension names reading errors alone
    "P3": None,  # cross-modal misbinding: between Semantic Error and Misalignment, neither clean
    "P4": "observation_neglect",
    "P5": "semantic_error",
    "G1": "grounding_spatial_error",
    "G2": None,  # the target is hidden or disabled: an environment fact, not a step's error
    "G3": "procedural_prerequisite_neglect",  # focus/overlay mechanics not in place first
    "G4": None,  # adversarial misdirection: the page's fault as much as the step's
    "R1": "constraint_neglect",
    "R2": None,
    "R3": None,
    "R4": "suboptimal_path",
    "R5": "action_operation_misalignment",
    "R6": "action_formulation_error",
    "R7": "parameter_vector_miscalibration",
    "R8": None,
    "R9": None,
    "R10": "termination_misjudgment",
    "R11": None,
    "R12": None,
    "R13": None,
    "S1": None,
    "S2": "timing_and_latency_neglect",  # acting before the interface settled
    "S3": None,
    "S4": None,
    "S5": None,
    "S6": None,
    "S7": None,
    "O1": None,
}
"""CUADebug L2 code -> ``hivig.taxonomy`` dimension key, or ``None`` (no clean dimension). The
twelve mapped codes are exactly the dimensions' own ``cuadebug_family`` (a test holds them
equal), so diagnose and data_gen read one taxonomy the same way."""

DIAGNOSIS_REASONS = (
    "bad_json",
    "no_matching_run",
    "ambiguous_run",
    "run_not_failed",
    "no_root_cause",
    "root_cause_not_written",
    "duplicate_diagnosis",
)
"""Why a diagnosis file was not recorded into a sidecar."""


def dimension_for(l2: str | None) -> str | None:
    """The dimension key of a CUADebug L2 code (``None``: no clean dimension or no code)."""
    return CUADEBUG_TO_DIMENSION.get(l2 or "")


def _source_of(doc: dict[str, Any]) -> str | None:
    path = (doc.get("input") or {}).get("path")
    if not isinstance(path, str) or not path:
        return None
    posix = Path(path).as_posix()
    return posix.removesuffix("/traj.jsonl").rstrip("/")


def _matches(path: str, source: str) -> bool:
    return path == source or path.endswith("/" + source)


def attach_diagnoses(sidecars: dict[str, dict[str, Any]], folder: Path) -> dict[str, Any]:
    """Record each ``diagnosis.json`` under ``folder`` into its episode's sidecar (in place).

    Args:
        sidecars: ``{"<benchmark>/<episode>.json": sidecar}`` as ingest-runs writes them.
        folder: Searched recursively for ``diagnosis.json``.

    Returns:
        ``{"files", "matched", "dropped": {reason: n}, "quarantine": [...]}``, with
        ``files == matched + Σ dropped``.
    """
    dropped: Counter[str] = Counter()
    quarantine: list[dict[str, Any]] = []
    matched = 0
    files = sorted(folder.rglob("diagnosis.json"))

    def drop(path: Path, reason: str, detail: str) -> None:
        dropped[reason] += 1
        quarantine.append(
            {"file": str(path.relative_to(folder)), "reason": reason, "detail": detail}
        )

    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            drop(path, "bad_json", str(exc)[:200])
            continue
        source = _source_of(doc) if isinstance(doc, dict) else None
        hits = [s for s in sidecars.values() if source and _matches(source, s["source"])]
        if not hits:
            drop(path, "no_matching_run", f"input.path {source!r} is no ingested run")
            continue
        if len(hits) > 1:
            drop(path, "ambiguous_run", f"{source!r} matches {len(hits)} episodes")
            continue
        side = hits[0]
        reason = _unusable(doc, side)
        if reason is not None:
            drop(path, *reason)
            continue
        side["diagnosis"] = _entry(doc, path.relative_to(folder).as_posix())
        matched += 1
    out = {"files": len(files), "matched": matched, "dropped": dict(sorted(dropped.items()))}
    assert out["files"] == matched + sum(dropped.values())  # every file is accounted for
    return {**out, "quarantine": quarantine}


def _unusable(doc: dict[str, Any], side: dict[str, Any]) -> tuple[str, str] | None:
    if side["outcome"] != "failure":
        return "run_not_failed", f"the evaluator's outcome is {side['outcome']}"
    if "diagnosis" in side:
        return "duplicate_diagnosis", f"{side['episode']} already has one"
    step = doc.get("root_cause_step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        return "no_root_cause", f"root_cause_step {step!r}"
    if step > side["steps_written"]:
        return (
            "root_cause_not_written",
            f"step {step} of {side['steps_written']} written (the rest was quarantined)",
        )
    return None


def _entry(doc: dict[str, Any], name: str) -> dict[str, Any]:
    err = doc.get("error") or {}
    l2 = err.get("l2") if isinstance(err.get("l2"), str) else None
    return {
        "file": name,
        "root_cause_index": doc["root_cause_step"] - 1,
        "l2": l2,
        "l2_name": err.get("l2_name"),
        "dimension": dimension_for(l2),
        "correction": doc.get("correction") if isinstance(doc.get("correction"), str) else "",
        "confidence": doc.get("confidence"),
        "method": doc.get("method"),
    }


def check_table() -> None:
    """Fail at import if the table names an unknown dimension (a typo would drop real Bads)."""
    for key in CUADEBUG_TO_DIMENSION.values():
        if key is not None:
            dimension_by_key(key)
    mapped = {k: v for k, v in CUADEBUG_TO_DIMENSION.items() if v is not None}
    own = {d.cuadebug_family: d.key for d in DIMENSIONS}
    if mapped != own:
        raise ValueError(f"CUADEBUG_TO_DIMENSION disagrees with the taxonomy: {mapped} vs {own}")


check_table()
