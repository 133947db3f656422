"""The demo's second run: the same episode judged by a scripted critic, a rule and no model.

The tiny random model of the first run never writes a parseable verdict, so the gateway
abstains at every step and a newcomer never sees what the guard does with a Bad verdict. This
rule answers Bad to the episode's injected mistake (typing while no field has the focus) and
Good to every other step; the pages label it as a script, so nobody takes it for a critic.
"""

from __future__ import annotations

import re
from typing import Any

from hivig.backends import Generation, Usage

SCRIPTED_NAME = "scripted-rule-critic"
"""The model name the gateway records for the scripted run (trace, pages)."""

_STEP = re.compile(r"Current Proposed Step:(.*?)(?:\n[A-Z][^\n]*:\n|\Z)", re.S)
_TYPES = re.compile(r"""["']action["']\s*:\s*["']type["']""")

_BAD = (
    "<criticism>\nOverall Grading: Bad\nError Dimension: Procedural Prerequisite Neglect\n"
    "Explanation: No text field has the focus, so the typed keys go nowhere; the search field "
    "must be clicked first, or the settings opened directly.\n</criticism>"
)
_GOOD = (
    "<criticism>\nOverall Grading: Good\nExplanation: No objection from the scripted rule (it "
    "checks only for typing with no field focused).\n</criticism>"
)
_SUMMARY = (
    "<summary>\nProgress Summary: A fixed summary from the scripted critic (it reads no "
    "screen).\nLast Action Result: Not judged by the scripted rule.\n</summary>"
)


def scripted_verdict(prompt: str) -> str:
    """The rule: Bad for a ``type`` proposal (no field is focused in this task), else Good."""
    match = _STEP.search(prompt)
    step = match.group(1) if match else ""
    return _BAD if _TYPES.search(step) else _GOOD


class ScriptedDemoCritic:
    """An inference backend answering from ``scripted_verdict`` (critiques) or a fixed summary."""

    model_name = SCRIPTED_NAME

    async def generate(self, messages: Any, sampling: Any, *, request_hash: str | None = None):
        """One answer, in the output contract the gateway parses."""
        prompt = messages[-1].text()
        text = scripted_verdict(prompt) if "Current Proposed Step" in prompt else _SUMMARY
        return Generation(
            text=text,
            reasoning="",
            usage=Usage(prompt_tokens=1, completion_tokens=1),
            finish_reason="stop",
            model=self.model_name,
            sampling=sampling,
            request_hash=request_hash or "scripted",
            latency_s=0.0,
        )
