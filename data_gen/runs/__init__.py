"""ingest-runs: an agent's own result folders -> a corpus ``python -m data_gen run`` reads.

    python -m data_gen ingest-runs --format osworld --root RESULTS --out CORPUS
    python -m data_gen ingest-runs --format androidlab --root logs/evaluation --out CORPUS
    python -m data_gen ingest-runs --format trace --root STATE_DIR --out CORPUS --outcomes failure
    python -m data_gen ingest --root CORPUS --out ING          # then as any ScaleCUA corpus

Formats: ``osworld``, ``waa`` (WindowsAgentArena), ``webarena-lite`` (WebArenaLiteV2),
``androidlab``, ``androidworld`` (the checkpointer's ``.pkl.gz`` files, read without running
anything they name) and ``trace`` (the gateway's session traces). The runs are read by
``hivig.run_folders``; each step's action is written once in the published layout's convention
(fractions of the screenshot) and must read back, through ingest's own parser, as the runner's
own action, or the step is quarantined.

``CORPUS`` gets ``meta.json``, ``annotations/*.jsonl`` and ``data/<benchmark>/<episode>/images/``
(the published ScaleCUA-Data layout), ``episodes/<benchmark>/<episode>.json`` (one sidecar per
episode: outcome, benchmark, task id, agent model when recorded, critic verdicts, and the
``trajectory_id`` ingest will give it), ``quarantine.jsonl`` (every item not written, with a
reason) and ``stats.json`` (``in == kept + Σ dropped``).
"""

from __future__ import annotations

from data_gen.runs._api import OUTCOMES, IngestRunsError, ingest_runs
from data_gen.runs._cli import add_subcommand, main
from data_gen.runs._convert import check, grid_lines, unit_calls
from data_gen.runs._discover import BENCHMARKS, FORMATS, discover
from data_gen.runs._write import REASONS

__all__ = [
    "BENCHMARKS",
    "FORMATS",
    "OUTCOMES",
    "REASONS",
    "IngestRunsError",
    "add_subcommand",
    "check",
    "discover",
    "grid_lines",
    "ingest_runs",
    "main",
    "unit_calls",
]
