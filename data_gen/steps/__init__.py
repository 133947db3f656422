"""The pipeline stages, one module each, in the order the executor runs them."""

from data_gen.steps.history import HistoryStep
from data_gen.steps.judge import JudgeStep
from data_gen.steps.perturb import PerturbStep
from data_gen.steps.rationale import RationaleStep
from data_gen.steps.transitions import TransitionsStep

STEP_CLASSES = (TransitionsStep, HistoryStep, PerturbStep, JudgeStep, RationaleStep)
"""Stage classes in run order; each takes the shared ``Context``."""
