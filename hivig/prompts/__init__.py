"""Versioned prompt templates and the message builders of the critic and annotator stages.

Templates live next to this module as ``<name>_v<N>.txt`` and are loaded by name
(``load_prompt("critic_critique")`` gives the latest version). Builders return
``PromptMessages``: chat messages with the stable parts first and the id of the template used.
"""

from hivig.prompts._builders import (
    PromptMessages,
    action_space_text,
    build_critique_messages,
    build_grounding_messages,
    build_history_annotation_messages,
    build_history_messages,
    build_judge_messages,
    build_perturbation_messages,
    build_rationale_bad_messages,
    build_rationale_good_messages,
    build_transition_messages,
    format_intent_step,
    format_raw_step,
    format_step,
    format_trajectory,
    taxonomy_text,
)
from hivig.prompts._template import (
    PromptError,
    PromptTemplate,
    available_prompts,
    load_prompt,
    load_prompt_dir,
    parse_template,
)

CRITIC_PROMPTS = ("critic_history", "critic_critique")
ANNOTATOR_PROMPTS = (
    "annotator_transition",
    "annotator_history",
    "annotator_perturbation",
    "annotator_judge",
    "annotator_rationale_good",
    "annotator_rationale_bad",
)

__all__ = [
    "ANNOTATOR_PROMPTS",
    "CRITIC_PROMPTS",
    "PromptError",
    "PromptMessages",
    "PromptTemplate",
    "action_space_text",
    "available_prompts",
    "build_critique_messages",
    "build_history_annotation_messages",
    "build_history_messages",
    "build_judge_messages",
    "build_perturbation_messages",
    "build_rationale_bad_messages",
    "build_rationale_good_messages",
    "build_grounding_messages",
    "build_transition_messages",
    "format_intent_step",
    "format_raw_step",
    "format_step",
    "format_trajectory",
    "load_prompt",
    "load_prompt_dir",
    "parse_template",
    "taxonomy_text",
]
