"""Offline critic evaluation: score one or two backends on held-out critique and history samples.

python -m train.critic_eval --data DATA --backend oracle --out DIR
python -m train.critic_eval --data DATA --compare transformers:CKPT_A transformers:CKPT_B --out DIR
python -m train.critic_eval --data DATA --backend openai:http://HOST:8000/v1@MODEL --out DIR
python -m train evaluate ...      # the same command line

Every record is turned into the prompt training and serving use (``hivig.records.record_messages``
then ``hivig.vision.materialise``), answered by the backend, and parsed with the one contract
parser of its task (``hivig.contracts.parse_critique`` / ``parse_history``). The ``oracle``
backend answers with the record's own target; it scores 100 % on every metric, which checks the
scoring itself. Metric definitions are in ``docs/evaluation.md``.

Outputs in ``--out``: ``metrics.json`` (every figure, per backend), ``report.md`` (the backends
side by side), ``confusion.png`` (verdict/dimension and transition confusion matrices),
``predictions/<backend>.jsonl`` (one line per sample: truth, prediction, raw answer) and the
run description (``config.yaml``, ``run_info.json``).

Modules, in the order a run uses them: ``config`` (settings), ``loading`` (records),
``truth`` (true transitions), ``specs`` and ``predictors`` (who answers), ``metrics``
(scoring), ``report`` (outputs), ``runner`` (one run), ``cli`` (flags → config → run).
"""

from train.critic_eval.cli import build_config, main
from train.critic_eval.config import CriticEvalConfig, CriticEvalError
from train.critic_eval.loading import load_eval_records, select_records
from train.critic_eval.metrics import BackendResult, compute_metrics, score_sample
from train.critic_eval.predictors import (
    Answer,
    BackendPredictor,
    OraclePredictor,
    Predictor,
    predict_all,
)
from train.critic_eval.report import render_report, write_confusion_png
from train.critic_eval.runner import evaluate_predictor, run
from train.critic_eval.specs import BackendSpec, build_predictor, parse_backend_spec
from train.critic_eval.truth import CHANGED, NO_CHANGE, transition_class, true_transitions

__all__ = [
    "CHANGED",
    "NO_CHANGE",
    "Answer",
    "BackendPredictor",
    "BackendResult",
    "BackendSpec",
    "CriticEvalConfig",
    "CriticEvalError",
    "OraclePredictor",
    "Predictor",
    "build_config",
    "build_predictor",
    "compute_metrics",
    "evaluate_predictor",
    "load_eval_records",
    "main",
    "parse_backend_spec",
    "predict_all",
    "render_report",
    "run",
    "score_sample",
    "select_records",
    "transition_class",
    "true_transitions",
    "write_confusion_png",
]
