"""The shortcut audit: can a text-only classifier tell Good from Bad without the screenshot?

    python -m data_gen audit --data OUT                  # the records of a finished run
    python -m data_gen audit --data OUT --max-auc 0.65   # exit 1 when a gated family fails

For the visually grounded dimensions (Grounding/Spatial Error, Visual Hallucination,
Action-Operation Misalignment) a Good and a Bad proposed step of the same screen should differ
only in where they point, so nothing in the text alone may separate them. The audit trains
text-only probes (logistic regression on word and character n-gram TF-IDF) on the critique
samples of each dimension family, Bad samples against the Good samples *of the same steps*, with
cross-validation grouped by episode (a probe never sees an episode it is scored on), and reports
the out-of-fold ROC AUC and the features the probe leans on. An AUC near 0.5 means the text gives
the label away no better than a coin; the export fails loudly when a gated family is above the
configured threshold.

Probes:

- ``step``: the proposed step (``Action:`` line and tool calls) as the critic sees it;
- ``history``: the proposed step read against the trajectory before it: the step's text plus
  one ``seen_<w1>_<w2>`` feature per word pair of the step that the history already holds, so
  a Bad step that copies an earlier step's words (a shortcut no step-only probe can see, and
  the history alone is the same for a step's Good and Bad) stands out.
"""

from __future__ import annotations

import os
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from data_gen.annotator import usable_cpus
from hivig.logging import get_logger
from hivig.records import SFTRecord, TextPart
from hivig.taxonomy import DIMENSIONS, dimension_by_key

log = get_logger(__name__)

POINTING = tuple(
    dimension_by_key(k).name
    for k in ("grounding_spatial_error", "visual_hallucination", "action_operation_misalignment")
)
"""The visually grounded dimensions: Good and Bad differ only in where the step points."""

TEXT_BLIND = tuple(
    dimension_by_key(k).name
    for k in ("grounding_spatial_error", "action_operation_misalignment", "constraint_neglect")
)
"""Dimensions whose error is not in the step's text by nature: the Bad step keeps the form and
wording of the expert's (the same intent with another point for Grounding/Spatial Error and
Action-Operation Misalignment; another element of the same kind in the expert's own phrasing
for Constraint Neglect), so only the screen (and the goal) shows what is wrong. The others
change the step on purpose, and a text probe reads that whatever the data quality: a broken
call, a scroll or a wait where the expert clicked, one character where the expert typed a
name, a command whose name reads wrong for the goal (Semantic Error). Visual Hallucination
names an element that is not the expert's, in the words of a real step elsewhere (see
``data_gen.perturb.programmatic.hallucination``)."""


FAMILIES: dict[str, tuple[str, ...]] = {
    "pointing": POINTING,
    "text_blind": TEXT_BLIND,
    "visual_other": tuple(
        d.name for d in DIMENSIONS if d.group == "visual_spatial" and d.name not in POINTING
    ),
    "cognitive": tuple(d.name for d in DIMENSIONS if d.group == "cognitive"),
}
"""Dimension families the audit scores separately (pooled). ``text_blind`` is gated by default:
its errors are not in the step's text by nature. ``pointing`` (which adds Visual
Hallucination) and the other families are reported (the others are partly textual: a broken
call, a terminate where an answer is due); every dimension also gets its own row."""

DIMENSION_AUDITS: dict[str, tuple[str, ...]] = {d.key: (d.name,) for d in DIMENSIONS}
"""One probe per dimension, by key (the paired AUC of every dimension is reported)."""

DEFAULT_GATED: tuple[str, ...] = (
    "text_blind",
    dimension_by_key("grounding_spatial_error").key,
    dimension_by_key("constraint_neglect").key,
)
"""Gated unless configured otherwise: the text-blind family pooled, and alone each of its
dimensions whose own probe stays clear of the 0.7 gate on the sample corpora (seeds 0-5:
Grounding/Spatial Error 0.48-0.68, Constraint Neglect 0.41-0.53). Action-Operation Misalignment
(0.35-0.68) is gated in the pool only: where the expert's target is large (a document area) its
nearest neighbours lie on the target's edges (menu bar, window buttons), so a few dozen pairs
still let the coordinates read slightly differently. Visual Hallucination reads 0.41-0.56 there
(the words of its Bads are real steps' elsewhere), but on 15-20 pairs a gate would fail clean
corpora by chance, so it and its ``pointing`` family are reported. The other eight change the
step's text by construction (a broken call, Timing acts where the Good waits, ...) and read
0.62-1.00, so gating them would fail exports without saying anything about the data."""

GATE_NAMES = frozenset(FAMILIES) | frozenset(DIMENSION_AUDITS)
"""What ``export.audit_gated`` may name: a family (scored pooled) or a dimension key (scored
alone: a few dozen pairs give a noisy AUC, so single dimensions are gated only by name)."""


PROBES = ("step", "history")
"""The texts a probe reads (see the module docstring)."""

_STEP_MARK = "Current Proposed Step:\n"
_HISTORY = re.compile(r"Trajectory:\n(.*?)\nCurrent Observation:", re.DOTALL)


class ShortcutAuditError(RuntimeError):
    """A gated family's text-only probe separates Good from Bad above the threshold."""


@dataclass(frozen=True)
class AuditSettings:
    """What the audit gates and how strictly.

    Attributes:
        max_auc: Highest acceptable out-of-fold AUC of a gated family's probes.
        gated: Families and dimension keys whose AUC above ``max_auc`` fails the export.
        min_samples: Families with fewer Bad samples are reported as too small, not scored.
        min_dimension_samples: The same floor for the one-dimension probes.
        folds: Grouped cross-validation folds (fewer when there are fewer episodes).
        top_features: Features listed per direction.
    """

    max_auc: float = 0.7
    gated: tuple[str, ...] = DEFAULT_GATED
    min_samples: int = 20
    min_dimension_samples: int = 10
    folds: int = 5
    top_features: int = 6


def _user_text(record: SFTRecord) -> str:
    return "\n".join(p.text for p in record.user if isinstance(p, TextPart))


_WORDS = re.compile(r"[a-z0-9]+")


def probe_text(record: SFTRecord, probe: str) -> str:
    """The text a probe reads from a critique record (``step`` or ``history``)."""
    text = _user_text(record)
    _, _, step = text.rpartition(_STEP_MARK)
    if probe == "step":
        return step
    m = _HISTORY.search(text)
    history = m.group(1).lower() if m else ""
    # Only the Action lines: tool-call boilerplate repeats in every step and says nothing.
    said = [ln for ln in step.lower().splitlines() if ln.startswith("action:")]
    words = _WORDS.findall(" ".join(said))
    seen_pairs = set(zip(_WORDS.findall(history), _WORDS.findall(history)[1:], strict=False))
    seen = [f"seen_{a}_{b}" for a, b in zip(words, words[1:], strict=False) if (a, b) in seen_pairs]
    return step + "\n" + " ".join(seen)


def family_samples(
    records: Iterable[SFTRecord], dimensions: Sequence[str]
) -> list[tuple[SFTRecord, int]]:
    """Bad samples of ``dimensions`` (label 1) and the Good samples of the same steps (0)."""
    critiques = [r for r in records if r.kind == "critique"]
    bad_steps = {
        (r.trajectory_id, r.step_index)
        for r in critiques
        if r.labels.verdict == "Bad" and r.labels.error_dimension in dimensions
    }
    out = []
    for r in critiques:
        step = (r.trajectory_id, r.step_index)
        if step not in bad_steps:
            continue
        if r.labels.verdict == "Bad" and r.labels.error_dimension in dimensions:
            out.append((r, 1))
        elif r.labels.verdict == "Good":
            out.append((r, 0))
    return out


def _vectoriser() -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import FeatureUnion

    # Words catch copied wording and template phrases; characters catch formatting (key order,
    # spacing, a trailing period, float digits) that words tokenise away.
    return FeatureUnion(
        [
            (
                "word",
                TfidfVectorizer(analyzer="word", ngram_range=(1, 2), min_df=2, sublinear_tf=True),
            ),
            (
                "char",
                TfidfVectorizer(
                    analyzer="char_wb", ngram_range=(2, 5), min_df=2, sublinear_tf=True
                ),
            ),
        ]
    )


def probe_auc(
    texts: Sequence[str], labels: Sequence[int], groups: Sequence[str], settings: AuditSettings
) -> dict[str, Any]:
    """Out-of-fold AUC of a text-only probe, with cross-validation grouped by episode."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    y = np.asarray(labels)
    n_groups = len(set(groups))
    out: dict[str, Any] = {"n": len(y), "bad": int(y.sum()), "good": int(len(y) - y.sum())}
    if n_groups < 2 or len(set(labels)) < 2 or not any(t.strip() for t in texts):
        return {**out, "auc": None, "note": "one class, one episode or no text"}
    scores = np.zeros(len(y))
    for train, test in GroupKFold(n_splits=min(settings.folds, n_groups)).split(texts, y, groups):
        if len(set(y[train])) < 2:
            scores[test] = 0.5
            continue
        vec = _vectoriser()
        try:
            x_train = vec.fit_transform([texts[i] for i in train])
        except ValueError:  # no n-gram reaches min_df in this fold: nothing to learn from
            scores[test] = 0.5
            continue
        clf = LogisticRegression(C=1.0, max_iter=2000).fit(x_train, y[train])
        scores[test] = clf.predict_proba(vec.transform([texts[i] for i in test]))[:, 1]
    out["auc"] = round(float(roc_auc_score(y, scores)), 3)
    out.update(_top_features(texts, y, settings.top_features))
    return out


def _top_features(texts: Sequence[str], y: Any, k: int) -> dict[str, list[str]]:
    from sklearn.linear_model import LogisticRegression

    vec = _vectoriser()
    try:
        x = vec.fit_transform(texts)
    except ValueError:
        return {"top_bad": [], "top_good": []}
    coef = LogisticRegression(C=1.0, max_iter=2000).fit(x, y).coef_[0]
    names = vec.get_feature_names_out()
    order = coef.argsort()
    return {
        "top_bad": [repr(names[i].split("__", 1)[1]) for i in order[::-1][:k]],
        "top_good": [repr(names[i].split("__", 1)[1]) for i in order[:k]],
    }


def mask_rates(samples: Sequence[tuple[SFTRecord, int]]) -> dict[str, float | None]:
    """Share of intent-masked samples among the family's Good and Bad samples."""
    out: dict[str, float | None] = {}
    for name, label in (("good", 0), ("bad", 1)):
        chosen = [r for r, y in samples if y == label]
        out[name] = (
            round(sum(r.labels.intent_masked for r in chosen) / len(chosen), 3) if chosen else None
        )
    return out


def shortcut_audit(
    records: Iterable[SFTRecord],
    settings: AuditSettings | None = None,
    families: Mapping[str, Sequence[str]] = FAMILIES,
) -> dict[str, Any]:
    """Text-only probes per dimension family and probe text; see the module docstring.

    Returns:
        ``{"settings": ..., "families": {family: {"dimensions", "mask_rate", probe: {auc, n,
        bad, good, top_bad, top_good}}}, "failed": [family/probe ...]}``; ``auc`` is ``None``
        where the family is too small to score.
    """
    settings = settings or AuditSettings()
    records = list(records)
    result: dict[str, Any] = {
        "settings": {
            "max_auc": settings.max_auc,
            "gated": list(settings.gated),
            "min_samples": settings.min_samples,
            "folds": settings.folds,
        },
        "families": {},
        "failed": [],
    }
    pending: list[tuple[dict[str, Any], str, tuple[Any, ...]]] = []
    for family, dims in families.items():
        result["families"][family] = _audit_row(records, dims, settings.min_samples, pending)
    result["dimensions"] = {}
    for key, dims in DIMENSION_AUDITS.items():
        row = _audit_row(records, dims, settings.min_dimension_samples, pending)
        row["gated"] = key in settings.gated
        result["dimensions"][key] = row
    for (row, probe, _), scored in zip(pending, _run_probes(pending, settings), strict=True):
        row[probe] = scored
    for name, row in (*result["families"].items(), *result["dimensions"].items()):
        gated = row.get("gated", name in settings.gated)
        for probe in PROBES:
            auc = row[probe]["auc"]
            if gated and auc is not None and auc > settings.max_auc:
                result["failed"].append(f"{name}/{probe}")
    return result


def _audit_row(
    records: list[SFTRecord],
    dims: Sequence[str],
    floor: int,
    pending: list[tuple[dict[str, Any], str, tuple[Any, ...]]],
) -> dict[str, Any]:
    """A family's row, its probes to score appended to ``pending`` (row, probe, arguments)."""
    samples = family_samples(records, dims)
    bads = sum(y for _, y in samples)
    row: dict[str, Any] = {"dimensions": list(dims), "mask_rate": mask_rates(samples)}
    for probe in PROBES:
        if bads < floor:
            good = len(samples) - bads
            row[probe] = {"n": len(samples), "bad": bads, "good": good, "auc": None}
            row[probe]["note"] = f"too few Bad samples to score (< {floor})"
            continue
        texts = [probe_text(r, probe) for r, _ in samples]
        labels = [y for _, y in samples]
        pending.append((row, probe, (texts, labels, _groups(samples))))
    return row


def _groups(samples: Sequence[tuple[SFTRecord, int]]) -> list[str]:
    return linked_groups(
        [probe_text(r, "step") for r, _ in samples],
        [y for _, y in samples],
        [r.episode_key for r, _ in samples],
    )


def linked_groups(texts: Sequence[str], labels: Sequence[int], groups: Sequence[str]) -> list[str]:
    """The cross-validation group of every sample: its episode, episodes joined where a Bad's
    step is word for word another episode's Good.

    A Bad that copies another episode's step (Visual Hallucination's layout-habit ghosts) is
    that episode's content: in separate folds, a probe would learn the words as Bad on one and
    be scored on them as a Good on the other, and read far below 0.5 for it.
    """
    parent = {g: g for g in groups}

    def root(g: str) -> str:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    goods: dict[str, set[str]] = defaultdict(set)
    for text, y, g in zip(texts, labels, groups, strict=True):
        if not y:
            goods[text].add(g)
    for text, y, g in zip(texts, labels, groups, strict=True):
        for other in sorted(goods.get(text, ())) if y else ():
            a, b = sorted((root(g), root(other)))
            parent[b] = a
    return [root(g) for g in groups]


MAX_PROBE_WORKERS = 8
"""Worker processes for the probes at most: each holds scikit-learn (about 250 MB), and the
30-odd probes of an audit keep eight busy."""


def _probe_workers(jobs: int) -> int:
    return min(jobs, usable_cpus(), MAX_PROBE_WORKERS)


def _import_probe_libraries() -> None:
    import sklearn.feature_extraction.text  # noqa: F401
    import sklearn.linear_model  # noqa: F401
    import sklearn.metrics  # noqa: F401
    import sklearn.model_selection  # noqa: F401
    import sklearn.pipeline  # noqa: F401


def _import_niced() -> None:
    # A worker warms at low priority: the run's own work (preparing requests) comes first.
    # A worker idle past joblib's timeout (300 s) is gone by the export, which then starts
    # fresh ones: warming pays off on short runs, where a cold start is a large share.
    os.nice(10)
    _import_probe_libraries()


def warm_up() -> threading.Thread:
    """Import the probes' libraries and start their worker processes in a background thread.

    Both take seconds on a cold start (scikit-learn and SciPy, in this process and in each
    worker); a run starts this while its annotator waits on the network, so the export's audit
    finds them ready. The audit works the same without it.
    """

    def warm() -> None:
        workers = _probe_workers(len(PROBES) * (len(FAMILIES) + len(DIMENSION_AUDITS)))
        if workers >= 2:
            from joblib import Parallel, delayed

            Parallel(n_jobs=workers)(delayed(_import_niced)() for _ in range(workers))
        _import_probe_libraries()

    thread = threading.Thread(target=warm, name="hivig-audit-warm-up", daemon=True)
    thread.start()
    return thread


def _run_probes(
    pending: list[tuple[dict[str, Any], str, tuple[Any, ...]]], settings: AuditSettings
) -> list[dict[str, Any]]:
    """Score every pending probe, on every core this process may use.

    The probes are independent and each is a few seconds of single-threaded work (n-gram
    counting in Python, then the solver), so they run in worker processes; the results are
    the same as one after another.
    """
    jobs = [args for _, _, args in pending]
    workers = _probe_workers(len(jobs))
    if workers < 2:
        return [probe_auc(*args, settings) for args in jobs]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=workers)(delayed(probe_auc)(*args, settings) for args in jobs)


def check_audit(audit: Mapping[str, Any]) -> None:
    """Raise ``ShortcutAuditError`` naming every gated family/probe above the threshold."""
    if not audit["failed"]:
        return
    max_auc = audit["settings"]["max_auc"]
    parts = []
    for name in audit["failed"]:
        family, probe = name.split("/")
        rows = audit["families"] if family in audit["families"] else audit["dimensions"]
        row = rows[family][probe]
        parts.append(f"{name} AUC {row['auc']} (leans on {', '.join(row.get('top_bad', [])[:3])})")
    raise ShortcutAuditError(
        f"shortcut audit failed: text alone separates Good from Bad above AUC {max_auc}: "
        + "; ".join(parts)
        + " (raise export.audit_max_auc to accept it, or fix the generator)"
    )


def audit_rows(audit: Mapping[str, Any]) -> list[tuple[str, str, Any, Any, Any, str]]:
    """``(family, probe, auc, bad, good, top Bad features)`` rows for tables."""
    rows = []
    every = {**audit["families"], **audit.get("dimensions", {})}
    for family, row in every.items():
        for probe in PROBES:
            r = row[probe]
            top = ", ".join(r.get("top_bad", [])[:4])
            rows.append((family, probe, r.get("auc"), r.get("bad"), r.get("good"), top))
    return rows


def by_step(records: Iterable[SFTRecord]) -> dict[tuple[str, int], list[SFTRecord]]:
    """Critique records grouped by (trajectory id, step index)."""
    out: dict[tuple[str, int], list[SFTRecord]] = defaultdict(list)
    for r in records:
        if r.kind == "critique":
            out[(r.trajectory_id, r.step_index)].append(r)
    return out
