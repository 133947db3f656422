"""Recovery target choice (ReTrace-style): where to return after the trajectory went wrong.

Pure functions over the records of the executed steps; the gateway keeps the records and calls
``choose_recovery`` after every observe::

    records = [StepRecord(0, "sha256:aa", None, progress_summary="..."),
               StepRecord(1, "sha256:bb", "The Settings window opened.", action_text="..."),
               StepRecord(2, "sha256:cc", "A wrong dialog opened instead of Wi-Fi.", changed=True)]
    rec = choose_recovery(records, task="Turn on Wi-Fi")
    rec.to_dict()  # {"target_step": 1, "target_image_ref": "sha256:bb", "reason", "brief"}

The rule follows ReTrace ("Lost in Recovery"): resuming from the step just before the error
(E−1) beats a full reset (R = 0), and recovery works best when it is explicit, with a summary of
the history up to the target. Here E is the first step of the trailing run of failed steps, so
E−1 is the last step whose action succeeded; the brief is built from the history model's
macro history (its Progress Summary at the target and the Last Action Result of each step).

A failure that left the screen unchanged needs no recovery: the environment still shows the
intact screen, and retrying differently is R3's job (``hivig.recurrence``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hivig.config import ConfigError

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Last Action Result classifier

# Phrases that contain a failure word without reporting a failure; removed before matching.
_BENIGN = re.compile(
    r"\b(without|with\s+no|no|free\s+of)\s+(any\s+)?(visible\s+)?"
    r"(errors?|failures?|problems?|issues?)\b"
    r"|\berror[- ]free\b"
    r"|\berror\s+(message|dialog|pop-?up|banner|notification|box|toast)s?\s+"
    r"(was\s+|were\s+|is\s+|are\s+|has\s+been\s+|have\s+been\s+)?"
    r"(closed|dismissed|disappeared|gone|cleared|hidden|removed)\b"
    r"|\b(closed|dismissed|cleared|removed|fixed|resolved)\s+(the\s+|an?\s+|all\s+)?errors?\b"
    r"|\bno\s+(other|further|additional)\s+(visible\s+)?changes?\b"
    r"|\bno\s+(visible\s+)?changes?\s+(elsewhere|otherwise)\b",
    re.IGNORECASE,
)
# A failure word that is part of a UI name ("the Error Log page", "Error Console"): names are
# title-cased, so this one is matched case-sensitively.
_NAMED = re.compile(
    r"\bErrors?\s+(Log|Logs|Console|List|Lists|Viewer|Reports?|Reporting|Monitor|Codes?|"
    r"Center|Centre|Handling|Tracker|Tracking)\b"
)
# The action visibly did nothing.
_NO_EFFECT = re.compile(
    r"\bno\s+(visible\s+|apparent\s+|noticeable\s+|observable\s+|discernible\s+)?"
    r"(change|effect|response|reaction|difference|update|progress)s?\b"
    r"|\bnothing\s+(visibly\s+|apparently\s+|seems\s+to\s+have\s+|seemed\s+to\s+)?"
    r"(happened|happen|changed|change|occurred|appeared|opened|responded|moved|updated)\b"
    r"|\b(unchanged|unresponsive)\b"
    r"|\b(remains?|remained|stays?|stayed|is\s+still|was\s+still|looks)\s+(exactly\s+)?"
    r"(the\s+same|identical)\b"
    r"|\bidentical\s+to\s+(the\s+)?(previous|earlier|prior|before)\b"
    r"|\bsame\s+as\s+(before|the\s+previous)\b"
    r"|\bnothing\s+(was|were|got|has\s+been|had\s+been|is)\s+(\w+\s+)?"
    r"(typed|entered|selected|saved|opened|changed|clicked|pasted|added|written|inserted|shown|"
    r"displayed|submitted|deleted|removed|loaded|copied)\b"
    r"|\b(remains?|remained|stays?|stayed|is\s+still|was\s+still)\s+(completely\s+)?"
    r"(empty|blank|unfilled)\b",
    re.IGNORECASE,
)
# A negated effect verb: "did not open", "wasn't selected", "could not find".
_NEGATED = re.compile(
    r"\b(did|does|do|has|have|had|was|were|is|are|could|can|would)\s*(not|n't)\s+"
    r"(\w+\s+){0,2}?"
    r"(change|open|respond|react|work|appear|load|register|take\s+effect|succeed|happen|update|"
    r"close|select|trigger|show|move|find|enter|type|apply|save|submit|navigate|expand|scroll|"
    r"accept|receive|focus|click|activate|toggle|check)\w*"
    r"|\b(didn't|doesn't|wasn't|weren't|isn't|couldn't|can't|cannot|won't|failed\s+to|unable\s+to)\b",
    re.IGNORECASE,
)
# Explicit failure vocabulary.
_FAILURE_WORDS = re.compile(
    r"\b(fail|fails|failed|failure|failing|errors?|exception|invalid|rejected|denied|"
    r"unsuccessful|not\s+found|silent(ly)?\s+fail\w*|wrong|incorrect(ly)?|mistaken(ly)?|"
    r"by\s+mistake|unintended|unexpected(ly)?|crash(ed|es)?)\b",
    re.IGNORECASE,
)
_EMPTY = re.compile(r"^\s*(none|n/?a|-+)?\s*\.?\s*$", re.IGNORECASE)


def action_result_failed(last_action_result: str | None) -> bool:
    """Whether the history model's ``Last Action Result:`` line reports a failed action.

    The line is an objective description of what the last action visibly did. It reports a
    failure when it says the action had no visible effect ("no visible change", "nothing
    happened", "nothing was typed", "the field remains empty", "the page remains the same"),
    negates the intended effect ("the menu did not open", "could not find the field"), or uses
    failure vocabulary ("failed", "an error dialog appeared", "a wrong tab opened",
    "unexpectedly"). Phrases that only mention a failure word ("saved without errors", "the
    error dialog closed", "no other changes", a UI name such as "the Error Log page") are
    ignored first. Anything else ("the Settings window opened", "the list now shows 3 items")
    is a success.
    Empty text, ``None`` and the first step's ``"None."`` are not failures (nothing was done).

    Args:
        last_action_result: The line's text, with or without the ``Last Action Result:`` label.

    Returns:
        True for a reported failure.
    """
    if last_action_result is None:
        return False
    text = re.sub(
        r"^\s*\**\s*last action result\s*\**\s*:\s*\**", "", last_action_result, flags=re.I
    )
    if _EMPTY.match(text):
        return False
    text = _BENIGN.sub(" ", _NAMED.sub(" ", text))
    return bool(_NO_EFFECT.search(text) or _NEGATED.search(text) or _FAILURE_WORDS.search(text))


# ---------------------------------------------------------------------------------------------
# Records, config and result


@dataclass(frozen=True)
class StepRecord:
    """One executed step, as the observe at ``step_idx`` saw it.

    Attributes:
        step_idx: The step (0 = the first screen, before any action).
        image_ref: The screen observed at this step (``"sha256:<hex>"``).
        last_action_result: The history model's Last Action Result for the action that led to
            this screen (``None`` at step 0).
        failed: Whether that action failed; ``None`` classifies ``last_action_result`` with
            ``action_result_failed``.
        action_text: The action executed at step ``step_idx - 1`` that led here (canonical
            text; ``None`` at step 0).
        intent: That action's verbal intent, if any.
        progress_summary: The history model's Progress Summary after this step.
        changed: Whether that action changed the screen (``not change["no_effect"]``); ``None``
            when unknown.
    """

    step_idx: int
    image_ref: str
    last_action_result: str | None = None
    failed: bool | None = None
    action_text: str | None = None
    intent: str | None = None
    progress_summary: str | None = None
    changed: bool | None = None

    def is_failure(self) -> bool:
        """The given classification, or the classifier's reading of the result line."""
        if self.failed is not None:
            return self.failed
        return action_result_failed(self.last_action_result)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> StepRecord:
        """Build from a mapping with the attribute names (extra keys are ignored).

        Raises:
            ValueError: ``step_idx`` or ``image_ref`` missing or of the wrong type.
        """
        idx, ref = obj.get("step_idx"), obj.get("image_ref")
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise ValueError(f"step record needs a non-negative int step_idx, got {idx!r}")
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"step record {idx} needs an image_ref string, got {ref!r}")
        names = ("last_action_result", "failed", "action_text", "intent", "progress_summary")
        extra = {name: obj.get(name) for name in names}
        return cls(step_idx=idx, image_ref=ref, changed=obj.get("changed"), **extra)


@dataclass
class RecoveryTargetConfig:
    """How recovery targets are chosen and how long the brief may get."""

    strategy: str = "last_success"
    """``last_success``: the last step whose action succeeded, before the failing run (ReTrace's
    E−1, which beat a full reset); ``start``: the first screen (R = 0)."""
    min_failures: int = 1
    """Consecutive failed steps at the end of the trajectory before a recovery is proposed."""
    max_brief_steps: int = 12
    """At most this many steps before the target are listed in the brief (oldest dropped)."""
    max_brief_chars: int = 2000
    """Upper bound on the brief's length, in characters."""
    max_line_chars: int = 240
    """Each quoted result or action is cut to this many characters."""

    def __post_init__(self) -> None:
        if self.strategy not in ("last_success", "start"):
            raise ConfigError("`recovery.strategy` must be last_success or start")
        if self.min_failures < 1:
            raise ConfigError("`recovery.min_failures` must be at least 1")
        if self.max_brief_steps < 0:
            raise ConfigError("`recovery.max_brief_steps` must be >= 0")
        if self.max_brief_chars < 200:
            raise ConfigError("`recovery.max_brief_chars` must be at least 200")
        if self.max_line_chars < 20:
            raise ConfigError("`recovery.max_line_chars` must be at least 20")


@dataclass(frozen=True)
class Recovery:
    """A recovery target: the gateway's ``recovery`` object (``to_dict``)."""

    target_step: int
    target_image_ref: str
    reason: str
    brief: str

    def to_dict(self) -> dict[str, Any]:
        """``{"target_step", "target_image_ref", "reason", "brief"}``."""
        return {
            "target_step": self.target_step,
            "target_image_ref": self.target_image_ref,
            "reason": self.reason,
            "brief": self.brief,
        }


# ---------------------------------------------------------------------------------------------
# Choice


def _ordered(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """Records by step index; a repeated index keeps the last record given (a forced redo)."""
    by_idx: dict[int, StepRecord] = {}
    for rec in steps:
        if rec.step_idx in by_idx:
            logger.info("step %d given twice; the later record is used", rec.step_idx)
        by_idx[rec.step_idx] = rec
    return [by_idx[i] for i in sorted(by_idx)]


def _failing_run(records: list[StepRecord]) -> int:
    """Index (into ``records``) of the first step of the trailing run of failed steps."""
    start = len(records)
    # The first record is the screen the trajectory started from: it has no action to fail.
    while start > 1 and records[start - 1].is_failure():
        start -= 1
    return start


def _steps_label(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def choose_recovery(
    steps: Sequence[StepRecord],
    diverged: bool | None = None,
    *,
    task: str | None = None,
    config: RecoveryTargetConfig | None = None,
) -> Recovery | None:
    """Pick the step to return to after the latest steps failed, with a brief for the policy.

    Args:
        steps: The executed steps' records, one per observed step (any order).
        diverged: Whether the current screen differs from the intact one. ``None`` derives it
            from the failing steps' ``changed`` flags (any True, or all unknown, means yes).
        task: The task instruction, quoted in the brief when given.
        config: Strategy and brief limits (defaults if ``None``).

    Returns:
        ``None`` when no recovery is needed (the latest step succeeded, fewer than
        ``min_failures`` steps failed, the failures left the screen as it was, or no intact
        step exists); otherwise the target, a reason and the brief.
    """
    cfg = config or RecoveryTargetConfig()
    records = _ordered(steps)
    if len(records) < 2:
        return None
    start = _failing_run(records)
    failing = records[start:]
    if len(failing) < cfg.min_failures:
        return None
    divergence = "the screen diverged"
    if diverged is None:
        flags = [r.changed for r in failing]
        diverged = any(f is True for f in flags)
        if all(f is None for f in flags):
            # Unknown: assume the worst; the brief tells the policy when the screen already
            # matches the target there is nothing to undo.
            diverged, divergence = True, "the screen may have diverged"
    if not diverged:
        return None
    target = records[0] if cfg.strategy == "start" else records[start - 1]
    first, last = failing[0].step_idx, failing[-1].step_idx
    quoted = _clip(failing[0].last_action_result or "reported failed", cfg.max_line_chars)
    if cfg.strategy == "start":
        rule = "the first screen (a full reset)"
    else:
        rule = "the last step whose action succeeded, just before the error (E-1)"
    reason = (
        f'{_steps_label(first, last)} failed (step {first}: "{quoted}") and {divergence}; '
        f"recovering to step {target.step_idx}, {rule}."
    )
    brief = _brief(records, target, failing, task, cfg)
    return Recovery(target.step_idx, target.image_ref, reason, brief)


# ---------------------------------------------------------------------------------------------
# The brief


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _action_of(rec: StepRecord, limit: int) -> str:
    if rec.intent and rec.action_text:
        return f"{_clip(rec.intent, limit)} ({_clip(rec.action_text, limit)})"
    return _clip(rec.intent or rec.action_text or "an action", limit)


def _transition(rec: StepRecord, limit: int) -> str:
    result = _clip(rec.last_action_result or "no result recorded", limit)
    return (
        f"- step {rec.step_idx - 1} -> {rec.step_idx}: {_action_of(rec, limit)}. Result: {result}"
    )


def _brief(
    records: list[StepRecord],
    target: StepRecord,
    failing: list[StepRecord],
    task: str | None,
    cfg: RecoveryTargetConfig,
) -> str:
    """Plain-text recovery instructions built from the macro history up to the target."""
    n = cfg.max_line_chars
    head = [
        f"Recovery: bring the screen back to how it was at step {target.step_idx}, then "
        "continue the task from there."
    ]
    if task:
        head.append(f"Task: {_clip(task, 2 * n)}")
    if target.progress_summary:
        head.append(
            f"Progress up to step {target.step_idx}: {_clip(target.progress_summary, 3 * n)}"
        )
    reached = [r for r in records if 0 < r.step_idx <= target.step_idx]
    after = [r for r in records if r.step_idx > target.step_idx]
    tail = [f"Steps after step {target.step_idx}, whose effects must be undone:"]
    tail += [_transition(r, n) for r in after]
    tail.append(
        "Undo what those steps changed (close what they opened, revert what they edited, go back "
        f"to the earlier page) until the screen matches the step {target.step_idx} screenshot "
        "(if it already does, there is nothing to undo); do not start the task over and do not "
        "repeat the failed actions."
    )
    listed = reached[-cfg.max_brief_steps :] if cfg.max_brief_steps else []
    while True:
        middle: list[str] = []
        if listed:
            middle.append(f"How step {target.step_idx} was reached:")
            if len(listed) < len(reached):
                middle.append(f"- ({len(reached) - len(listed)} earlier steps omitted)")
            middle += [_transition(r, n) for r in listed]
        text = "\n".join([*head, *middle, *tail])
        if len(text) <= cfg.max_brief_chars or not listed:
            break
        listed = listed[1:]  # drop the oldest reached step until the brief fits
    if len(text) > cfg.max_brief_chars:
        text = text[: cfg.max_brief_chars - 3].rstrip() + "..."
    return text
