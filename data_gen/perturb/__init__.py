"""Bad-step generators for the 12 error dimensions, and the corpus-wide perturbation plan."""

from data_gen.perturb.base import BadStep, StepView
from data_gen.perturb.elements import Element, ElementIndex
from data_gen.perturb.plan import StepPlan, generator_rng, plan_corpus
from data_gen.perturb.programmatic import PROGRAMMATIC, GenParams
from data_gen.perturb.semantic import ANNOTATOR_DIMENSIONS, DRAFTERS
