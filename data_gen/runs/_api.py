"""``ingest_runs``: the whole command as one function (the CLI only parses and reports)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_gen.runs._discover import BENCHMARKS, FORMATS, discover
from data_gen.runs._write import Corpus, add_run, write_corpus, write_diagnoses
from data_gen.runs.diagnoses import attach_diagnoses

OUTCOMES = ("success", "failure", "unknown")
"""Episode outcomes ``--outcomes`` selects from."""


class IngestRunsError(ValueError):
    """A user mistake (missing root, unusable output folder); the message names the fix."""


def ingest_runs(
    fmt: str,
    root: str | Path,
    out: str | Path,
    outcomes: Sequence[str] = OUTCOMES,
    examples: str | Path | None = None,
    diagnoses: str | Path | None = None,
) -> dict[str, Any]:
    """Read every run of ``fmt`` under ``root`` and write the corpus to ``out``.

    Args:
        fmt: One of ``FORMATS``.
        root: The results root (or one task folder / file).
        out: A new or empty output folder.
        outcomes: Keep episodes with these outcomes; the others count as
            ``outcome_not_selected``.
        examples: OSWorld/WAA ``evaluation_examples/examples`` folder (``{domain}/{id}.json``
            with the ``instruction``), for result folders that do not record their task.
        diagnoses: A folder of ``diagnosis.json`` files (``python -m serve.diagnose --out``);
            each root cause is recorded into its episode's sidecar (``data_gen.runs.diagnoses``
            says how they are matched).

    Returns:
        The stats written to ``out/stats.json``.

    Raises:
        IngestRunsError: ``fmt``/``outcomes`` unknown, ``root`` missing, ``out`` unusable.
    """
    root, out = Path(root), Path(out)
    if fmt not in FORMATS:
        raise IngestRunsError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if set(outcomes) - set(OUTCOMES):
        raise IngestRunsError(f"--outcomes must be among {', '.join(OUTCOMES)}")
    if not root.exists():
        raise IngestRunsError(f"--root {root} does not exist; pass the runner's results folder")
    if examples is not None and not Path(examples).is_dir():
        raise IngestRunsError(f"--examples {examples} is not a folder; pass examples/")
    if diagnoses is not None and not Path(diagnoses).is_dir():
        raise IngestRunsError(f"--diagnoses {diagnoses} is not a folder; pass diagnose's --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise IngestRunsError(f"--out {out} exists and is not an empty folder; pass a new one")
    if out.resolve().is_relative_to(root.resolve()):
        raise IngestRunsError(f"--out {out} lies inside --root; pass a folder outside it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise IngestRunsError(f"cannot create --out {out}: {exc.strerror}") from None
    corpus = Corpus(out)
    for run in discover(fmt, root, Path(examples) if examples is not None else None):
        base = root if root.is_dir() else root.parent
        add_run(run, base, BENCHMARKS[fmt], corpus, set(outcomes))
    stats = write_corpus(corpus)
    if diagnoses is None:
        return stats
    return write_diagnoses(corpus, attach_diagnoses(corpus.sidecars, Path(diagnoses)), stats)
