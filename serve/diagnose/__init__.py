"""Root-cause diagnosis of failed agent runs (CUADebug-style).

    result = diagnose("results/.../TASK_ID", backend=None, top_k=3, out_dir="diag")
    result.root_cause_step, result.error["l2"], result.confidence

Inputs (detected from the path): a gateway session trace, an OSWorld-style result folder, or an
ingested trajectories file. Cheap signals rank the steps; the top ``k`` are inspected with the
critic when a backend is given. ``python -m serve.diagnose PATH --out DIR`` is the command line;
``add_cli`` adds it as a subcommand of another parser.
"""

from serve.diagnose.cli import add_cli, main
from serve.diagnose.loaders import DiagnoseInputError, detect_kind, load_run
from serve.diagnose.pipeline import DiagnosisResult, diagnose, diagnose_async

__all__ = [
    "DiagnoseInputError",
    "DiagnosisResult",
    "add_cli",
    "detect_kind",
    "diagnose",
    "diagnose_async",
    "load_run",
    "main",
]
