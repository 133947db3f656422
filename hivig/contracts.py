"""Output contracts of the critic and the annotator stages: tolerant parsers and exact renderers.

Every parser takes the raw model text and returns a typed result or a ``ContractError`` with a
short, stable reason code; none of them raises on any input string. They are tolerant of what
models do to a format (a missing opening ``<think>``, tag case, code fences, markdown emphasis such
as ``**Overall Grading:** good``) and strict about content (the verdict must be Good or Bad, a
dimension must be one of the 12, required fields must be present and non-empty). Code-fence lines
inside an answer block are layout and are dropped; chat-template tokens (``<|im_end|>``) and
reasoning tags inside a block are refused (``stray_markup``), so what a parser accepts reads as the
model meant it and can become a training target as is.

The target format is the published HiViG one::

    <think>
    ...
    </think>
    <criticism>
    Overall Grading: Bad
    Error Dimension: Visual Hallucination
    Explanation: ...
    </criticism>

Reasoning may arrive inline (``<think>…</think>`` before the answer) or separately, as the
``reasoning`` argument of every parser (vLLM's ``reasoning_content``); separate reasoning is taken
as is and never scanned for tags. ``split_think`` is the project's one think splitter: backends and
stages split reasoning with it rather than with a parser of their own. Outputs report whether
reasoning was present (``has_think``); ``require_think=True`` rejects outputs without it as
``missing_think``.

``render_history_target`` and ``render_critique_target`` produce exactly what the parsers accept;
they check that by parsing their own output, and they refuse blank reasoning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

from hivig.taxonomy import Dimension, lookup_dimension

__all__ = [
    "ContractError",
    "CritiqueOutput",
    "GroundingOutput",
    "HistoryOutput",
    "INITIAL_HISTORY",
    "JudgeOutput",
    "PerturbationOutput",
    "TransitionOutput",
    "Verdict",
    "parse_critique",
    "parse_grounding",
    "parse_history",
    "parse_judge",
    "parse_next_state",
    "parse_perturbation",
    "render_critique_target",
    "render_history_target",
    "split_think",
]

Verdict = Literal["Good", "Bad"]

# Reason codes (stable; counted by data_gen and serve).
EMPTY = "empty"
UNCLOSED_THINK = "unclosed_think"
TEXT_BEFORE_THINK = "text_before_think"
DUPLICATE_THINK = "duplicate_think"
MISSING_TAG = "missing_tag"
DUPLICATE_TAG = "duplicate_tag"
MISSING_FIELD = "missing_field"
DUPLICATE_FIELD = "duplicate_field"
BAD_VERDICT = "bad_verdict"
UNKNOWN_DIMENSION = "unknown_dimension"
UNEXPECTED_DIMENSION = "unexpected_dimension"
BAD_JSON = "bad_json"
MISSING_KEY = "missing_key"
BAD_VALUE = "bad_value"
MISSING_THINK = "missing_think"
STRAY_MARKUP = "stray_markup"


@dataclass(frozen=True)
class ContractError:
    """A typed parse failure.

    Attributes:
        reason: Short stable code (``missing_tag``, ``bad_verdict``, ``unknown_dimension``, ...).
        message: Human-readable detail for logs and exclusion files.
    """

    reason: str
    message: str


class _Reject(Exception):
    """A contract failure raised inside the parsers; the public parser returns its ``error``.

    The private helpers raise it so that a failure found deep in a helper travels up without a
    check at every level; ``_returning_errors`` turns it back into a value at the public
    boundary, and it never escapes a public parser.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.error = ContractError(reason, message)


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _returning_errors(
    body: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
) -> _T | ContractError:
    """Run a parser body that raises ``_Reject``; return its ``ContractError`` instead."""
    try:
        return body(*args, **kwargs)
    except _Reject as reject:
        return reject.error


class _Reasoned:
    """``has_think`` for every output: ``think`` is ``None`` when absent, ``""`` when blank."""

    think: str | None

    @property
    def has_think(self) -> bool:
        """Whether the output carried non-blank reasoning (callers reject outputs without)."""
        return bool(self.think and self.think.strip())


@dataclass(frozen=True)
class HistoryOutput(_Reasoned):
    """The history task's output: reasoning plus the two summary lines."""

    think: str | None
    progress: str
    last_result: str

    @property
    def summary(self) -> str:
        """The summary as fed back as the next step's ``Previous Summary``."""
        return f"Progress Summary: {self.progress}\nLast Action Result: {self.last_result}"


INITIAL_HISTORY = HistoryOutput(
    think=None,
    progress="No actions have been taken yet; the task is just starting.",
    last_result="None.",
)
"""The history before any executed step: the ``Previous Summary`` of every trajectory's first
history update, in training data and at serving time alike."""


@dataclass(frozen=True)
class CritiqueOutput(_Reasoned):
    """The critique task's output; ``dimension`` is set exactly when the verdict is Bad."""

    think: str | None
    verdict: Verdict
    dimension: Dimension | None
    explanation: str


@dataclass(frozen=True)
class TransitionOutput(_Reasoned):
    """The state-transition annotator's output.

    ``mechanism`` and ``effect`` are the ``[Action Mechanism]`` / ``[Structural Effect]`` parts of
    the reasoning, ``None`` where the reasoning does not carry them.
    """

    think: str | None
    next_state: str
    mechanism: str | None
    effect: str | None


@dataclass(frozen=True)
class PerturbationOutput(_Reasoned):
    """The perturbation annotator's output: one Bad step for one dimension."""

    think: str | None
    dimension: Dimension
    rejected_thought: str
    rejected_proposed_step: str


@dataclass(frozen=True)
class JudgeOutput(_Reasoned):
    """The double-blind judge's output; ``dimension`` is ``None`` when it answered ``Invalid``."""

    think: str | None
    better_candidate: Literal["A", "B"]
    dimension: Dimension | None
    reasoning_summary: str


@dataclass(frozen=True)
class GroundingOutput(_Reasoned):
    """The grounding annotator's element: label, role and box on the 0-1000 grid."""

    think: str | None
    label: str
    role: str
    box: tuple[int, int, int, int]


# ---------------------------------------------------------------------------------------------
# Reasoning split

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


def _answer_start(text: str, answer_tag: str | None) -> int:
    """Where the answer region starts: the last opening answer tag, else the end of the text.

    The last one, because the reasoning may mention the tag while describing the format.
    """
    if answer_tag is None:
        return len(text)
    found = list(re.finditer(rf"<{re.escape(answer_tag)}\s*>", text, re.IGNORECASE))
    return found[-1].start() if found else len(text)


def split_think(
    text: str, *, answer_tag: str | None = None
) -> tuple[str | None, str] | ContractError:
    """Split off the reasoning block; the canonical think splitter of the project.

    Accepts ``<think>…</think>`` first, a lone ``</think>`` (Thinking chat templates pre-fill the
    opening tag, so the model only emits the closing one), or no reasoning at all. The block runs
    from the first ``<think>`` to the *last* ``</think>`` before the answer, so reasoning that
    quotes the tags (``the format is <think>…</think> then …``) stays whole. Structure that is
    still malformed is rejected: a second block opened after the first one closed (a ``<think>``
    at nesting depth zero), text before the opening tag, or an opening tag never closed.

    Args:
        text: Raw model output.
        answer_tag: Name of the answer's opening tag (``criticism``, ``summary``, ...). The last
            ``</think>`` before its last occurrence ends the reasoning, so ``</think>`` quoted
            inside the answer is left to the answer. ``None``: the last ``</think>`` of the text.

    Returns:
        ``(think, rest)`` with ``think`` stripped (``None`` when absent, ``""`` when the block is
        blank), or a ``ContractError`` (``empty``, ``unclosed_think``, ``text_before_think``,
        ``duplicate_think``).
    """
    return _returning_errors(_split_think, text, answer_tag)


def _split_think(text: str, answer_tag: str | None) -> tuple[str | None, str]:
    """``split_think``, raising ``_Reject`` on malformed reasoning."""
    if not isinstance(text, str) or not text.strip():
        raise _Reject(EMPTY, "empty output")
    answer_at = _answer_start(text, answer_tag)
    tags = list(_THINK_TAG.finditer(text, 0, answer_at))
    closes = [t for t in tags if t.group(1)]
    if tags and not closes and answer_at < len(text):
        # Reasoning opened but not closed before the last answer tag: that tag was a mention in
        # the reasoning, so the reasoning may end after it. (No tag before the answer at all: no
        # reasoning, and a </think> inside the answer is the answer's business.)
        answer_at = len(text)
        tags = list(_THINK_TAG.finditer(text))
        closes = [t for t in tags if t.group(1)]
    if not tags:
        return None, text
    if not closes:
        raise _Reject(UNCLOSED_THINK, "<think> is never closed (truncated output?)")
    close = closes[-1]
    # Explicit: the text opens with <think>. Otherwise the opening tag was pre-filled and any
    # <think> in the text is either a mention inside the reasoning or an opening after a preamble.
    explicit = not tags[0].group(1) and not text[: tags[0].start()].strip()
    _check_think_structure(tags, close, explicit)
    after = [t for t in tags if t.start() > close.start()]
    if after:
        # Only openings can follow the last </think> before the answer: a block never closed.
        raise _Reject(UNCLOSED_THINK, "<think> after the reasoning is never closed")
    start = tags[0].end() if explicit else 0
    return text[start : close.start()].strip(), text[close.end() :]


def _check_think_structure(tags: list[re.Match[str]], close: re.Match[str], explicit: bool) -> None:
    """Reject a ``<think>`` that opens once the first block has closed (nesting depth zero)."""
    depth = 1
    inner = tags[1:] if explicit else tags
    for tag in inner:
        if tag.start() >= close.start():
            break
        if tag.group(1):
            depth -= 1
        elif depth <= 0:
            raise _Reject(DUPLICATE_THINK, "a second <think> block after the first one")
        else:
            depth += 1
    if not explicit and depth > 1:
        # A pre-filled block that closes less often than it opens: an opening tag after text.
        raise _Reject(TEXT_BEFORE_THINK, "text before the opening <think>")


def _reasoning(text: str, reasoning: str | None, answer_tag: str | None) -> tuple[str | None, str]:
    """Reasoning and answer, from a separate ``reasoning`` field when given, else from ``text``."""
    if reasoning is not None and not isinstance(reasoning, str):
        raise _Reject(EMPTY, "reasoning must be a string or None")
    if reasoning is None or not reasoning.strip():
        return _split_think(text, answer_tag)
    if not isinstance(text, str) or not text.strip():
        raise _Reject(EMPTY, "empty answer")
    # Delivered separately (e.g. vLLM ``reasoning_content``): trusted as is, never scanned.
    return reasoning.strip(), text


def _think_and_answer(
    text: str, reasoning: str | None, answer_tag: str | None, require_think: bool
) -> tuple[str | None, str]:
    """Split the reasoning off (or take the separate one) and enforce ``require_think``."""
    split = _reasoning(text, reasoning, answer_tag)
    if require_think and (split[0] is None or not split[0].strip()):
        raise _Reject(MISSING_THINK, "the output has no reasoning")
    return split


# ---------------------------------------------------------------------------------------------
# Tagged blocks and labelled fields


# A line that only opens or closes a markdown code fence (```, ```text, ~~~). Models wrap the
# block's body in one; the fence is layout, never content, and must not reach a training target.
_FENCE_LINE = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[ \t]*[\w.+-]*[ \t]*(?:\r?\n|$)", re.MULTILINE)
# Markup that has no place inside an answer block: chat-template special tokens (<|im_end|>) and
# reasoning tags (special tokens of the chat template too). Other tag names stay content: a web
# page's <summary> element is a fair thing for a criticism to name (a second block of the same
# tag is refused as duplicate_tag anyway).
_STRAY_MARKUP = re.compile(r"<\|[^|<>\n]{1,40}\|>|</?think\s*>", re.IGNORECASE)


def _block(text: str, tag: str) -> str:
    """The body of the one ``<tag>`` block, fence lines removed; stray markup is rejected."""
    opens = list(re.finditer(rf"<{tag}\s*>", text, re.IGNORECASE))
    closes = list(re.finditer(rf"</{tag}\s*>", text, re.IGNORECASE))
    if not opens or not closes:
        raise _Reject(MISSING_TAG, f"no complete <{tag}>…</{tag}> block")
    if len(opens) > 1 or len(closes) > 1:
        raise _Reject(DUPLICATE_TAG, f"more than one <{tag}> block")
    if closes[0].start() < opens[0].end():
        raise _Reject(MISSING_TAG, f"</{tag}> before <{tag}>")
    body = _FENCE_LINE.sub("", text[opens[0].end() : closes[0].start()])
    stray = _STRAY_MARKUP.search(body)
    if stray is not None:
        raise _Reject(STRAY_MARKUP, f"{stray.group(0)!r} inside the <{tag}> block")
    return body


def _label_pattern(label: str) -> re.Pattern[str]:
    words = r"[ \t]++".join(re.escape(w) for w in label.split())
    # Line start, optional bullet, optional opening emphasis, the label, emphasis, colon. Emphasis
    # right after the colon is not matched here: it may open the value (``Label: **x**``).
    # The blank runs are possessive: two optional runs side by side otherwise split a long run
    # of spaces every possible way before failing (quadratic: 8 s for a 32,000-space line).
    return re.compile(
        rf"^[ \t]*+(?:[-+*][ \t]++)?(?P<open>[*_]*+)[ \t]*+{words}[ \t]*+(?P<mid>[*_]*+)[ \t]*+:",
        re.IGNORECASE | re.MULTILINE,
    )


_LABELS = {
    "progress": _label_pattern("Progress Summary"),
    "last_result": _label_pattern("Last Action Result"),
    "grading": _label_pattern("Overall Grading"),
    "dimension": _label_pattern("Error Dimension"),
    "explanation": _label_pattern("Explanation"),
}


def _value_start(block: str, match: re.Match[str]) -> int:
    """Skip the emphasis closing a label such as ``**Overall Grading:**``, nothing else."""
    end = match.end()
    opened = match.group("open")
    if opened and not match.group("mid") and block.startswith(opened, end):
        return end + len(opened)
    return end


def _fields(block: str, names: tuple[str, ...]) -> dict[str, str]:
    """Cut a block into labelled fields; each runs to the next label or the end of the block."""
    hits: list[tuple[int, int, str]] = []
    for name in names:
        found = list(_LABELS[name].finditer(block))
        if len(found) > 1:
            raise _Reject(DUPLICATE_FIELD, f"field {name!r} appears {len(found)} times")
        hits.extend((m.start(), _value_start(block, m), name) for m in found)
    hits.sort()
    out: dict[str, str] = {}
    for i, (_, end, name) in enumerate(hits):
        stop = hits[i + 1][0] if i + 1 < len(hits) else len(block)
        out[name] = _strip_emphasis(block[end:stop])
    return out


# Balanced emphasis around the whole value; the delimiter must not occur inside, so
# ``**Save** closes **dialog**`` is left alone.
_WRAPPED = re.compile(r"^(\*\*|__|\*|_)((?:(?!\1).)+)\1$", re.DOTALL)


def _strip_emphasis(value: str) -> str:
    text = value.strip()
    while (match := _WRAPPED.match(text)) is not None:
        text = match.group(2).strip()
    return text


def _require(fields: dict[str, str], name: str, label: str) -> str:
    value = fields.get(name)
    if value is None:
        raise _Reject(MISSING_FIELD, f"no {label!r} line")
    if not value:
        raise _Reject(MISSING_FIELD, f"{label!r} is empty")
    return value


# ---------------------------------------------------------------------------------------------
# History


def parse_history(
    text: str, reasoning: str | None = None, *, require_think: bool = False
) -> HistoryOutput | ContractError:
    """Parse ``<think>`` + ``<summary>`` with ``Progress Summary:`` and ``Last Action Result:``.

    Args:
        text: Raw model output.
        reasoning: Reasoning the backend returned separately (vLLM ``reasoning_content``). When
            non-blank it is the think text, is never scanned for tags, and ``text`` is parsed as
            the answer only; ``None`` or blank: the reasoning is split off ``text``.
        require_think: Reject an output without (or with blank) reasoning as ``missing_think``.

    Returns:
        A ``HistoryOutput`` or a ``ContractError``.
    """
    return _returning_errors(_history, text, reasoning, require_think)


def _history(text: str, reasoning: str | None, require_think: bool) -> HistoryOutput:
    think, rest = _think_and_answer(text, reasoning, "summary", require_think)
    fields = _fields(_block(rest, "summary"), ("progress", "last_result"))
    progress = _require(fields, "progress", "Progress Summary")
    last = _require(fields, "last_result", "Last Action Result")
    return HistoryOutput(think=think, progress=progress, last_result=last)


# ---------------------------------------------------------------------------------------------
# Critique

_NONE_VALUES = {"", "none", "n/a", "na", "null", "-"}


def _verdict(value: str) -> Verdict | None:
    word = re.sub(r"[^a-z]", "", value.lower())
    return {"good": "Good", "bad": "Bad"}.get(word)  # type: ignore[return-value]


def parse_critique(
    text: str, reasoning: str | None = None, *, require_think: bool = False
) -> CritiqueOutput | ContractError:
    """Parse ``<think>`` + ``<criticism>`` with grading, dimension (Bad only) and explanation.

    Args:
        text: Raw model output.
        reasoning: Reasoning the backend returned separately (vLLM ``reasoning_content``). When
            non-blank it is the think text, is never scanned for tags, and ``text`` is parsed as
            the answer only; ``None`` or blank: the reasoning is split off ``text``.
        require_think: Reject an output without (or with blank) reasoning as ``missing_think``.

    Returns:
        A ``CritiqueOutput`` or a ``ContractError`` (``bad_verdict``, ``unknown_dimension`` for a
        name outside the taxonomy, ``unexpected_dimension`` for a dimension on a Good verdict, ...).
    """
    return _returning_errors(_critique, text, reasoning, require_think)


def _critique(text: str, reasoning: str | None, require_think: bool) -> CritiqueOutput:
    think, rest = _think_and_answer(text, reasoning, "criticism", require_think)
    fields = _fields(_block(rest, "criticism"), ("grading", "dimension", "explanation"))
    grading = _require(fields, "grading", "Overall Grading")
    verdict = _verdict(grading)
    if verdict is None:
        raise _Reject(BAD_VERDICT, f"grading {grading!r} is neither Good nor Bad")
    explanation = _require(fields, "explanation", "Explanation")
    raw_dim = fields.get("dimension")
    if verdict == "Good":
        if raw_dim is not None and raw_dim.lower().strip(" .") not in _NONE_VALUES:
            raise _Reject(UNEXPECTED_DIMENSION, f"Good verdict names {raw_dim!r}")
        return CritiqueOutput(think, "Good", None, explanation)
    if raw_dim is None or not raw_dim:
        raise _Reject(MISSING_FIELD, "Bad verdict without an 'Error Dimension' line")
    dim = lookup_dimension(raw_dim)
    if dim is None:
        raise _Reject(UNKNOWN_DIMENSION, f"{raw_dim!r} is not one of the 12 dimensions")
    return CritiqueOutput(think, "Bad", dim, explanation)


# ---------------------------------------------------------------------------------------------
# State transition

# "[Action Mechanism]", "**Action Mechanism**" or "(Action Mechanism)", optional colon.
_PART = re.compile(
    r"^[ \t]*(?:\[|\*\*|\()[ \t]*(Action Mechanism|Structural Effect)[ \t]*(?:\]|\*\*|\))"
    r"[ \t]*:?[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)


def _think_parts(think: str | None) -> dict[str, str]:
    if not think:
        return {}
    hits = list(_PART.finditer(think))
    parts: dict[str, str] = {}
    for i, m in enumerate(hits):
        stop = hits[i + 1].start() if i + 1 < len(hits) else len(think)
        value = think[m.end() : stop].strip()
        parts.setdefault(m.group(1).lower(), value)
    return parts


def parse_next_state(
    text: str, reasoning: str | None = None, *, require_think: bool = False
) -> TransitionOutput | ContractError:
    """Parse ``<think>`` (with optional mechanism/effect parts) + ``<next_state>``.

    Args:
        text: Raw model output.
        reasoning: Reasoning the backend returned separately (vLLM ``reasoning_content``). When
            non-blank it is the think text, is never scanned for tags, and ``text`` is parsed as
            the answer only; ``None`` or blank: the reasoning is split off ``text``.
        require_think: Reject an output without (or with blank) reasoning as ``missing_think``.

    Returns:
        A ``TransitionOutput`` or a ``ContractError``.
    """
    return _returning_errors(_next_state, text, reasoning, require_think)


def _next_state(text: str, reasoning: str | None, require_think: bool) -> TransitionOutput:
    think, rest = _think_and_answer(text, reasoning, "next_state", require_think)
    next_state = _block(rest, "next_state").strip()
    if not next_state:
        raise _Reject(MISSING_FIELD, "<next_state> is empty")
    parts = _think_parts(think)
    return TransitionOutput(
        think=think,
        next_state=next_state,
        mechanism=parts.get("action mechanism") or None,
        effect=parts.get("structural effect") or None,
    )


# ---------------------------------------------------------------------------------------------
# JSON outputs (perturbation, judge)


_DECODER = json.JSONDecoder()


def _json_object(text: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The answer object: the last JSON object in ``text`` that has every key of ``keys``.

    Every ``{`` is tried as the start of an object, so a stray brace in prose cannot swallow the
    answer, and objects lacking the contract's keys (tool-call arguments quoted in the reasoning
    or emitted after the answer) never win. With no such object, the object with the most of the
    keys (the last among equals) is returned so the caller reports which key is missing.
    """
    complete: dict[str, Any] | None = None
    partial: dict[str, Any] | None = None
    partial_score = -1
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = _DECODER.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # not an object here; deep nesting is not one either
            continue
        if not isinstance(obj, dict):
            continue
        score = sum(key in obj for key in keys)
        if score == len(keys):
            complete = obj
        elif score >= partial_score:
            partial, partial_score = obj, score
    if complete is not None:
        return complete
    if partial is not None:
        return partial
    raise _Reject(BAD_JSON, "no parseable JSON object in the output")


def _string_key(obj: dict[str, Any], key: str) -> str:
    if key not in obj:
        raise _Reject(MISSING_KEY, f"JSON lacks {key!r}")
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        raise _Reject(BAD_VALUE, f"{key!r} must be a non-empty string")
    value = _FENCE_LINE.sub("", value).strip()
    stray = _STRAY_MARKUP.search(value)
    if stray is not None:
        raise _Reject(STRAY_MARKUP, f"{stray.group(0)!r} inside {key!r}")
    if not value:
        raise _Reject(BAD_VALUE, f"{key!r} holds only a code fence")
    return value


def _json_answer(
    text: str, reasoning: str | None, keys: tuple[str, ...], require_think: bool
) -> tuple[str | None, dict[str, Any]]:
    think, rest = _think_and_answer(text, reasoning, None, require_think)
    return think, _json_object(rest, keys)


_PERTURBATION_KEYS = ("dimension_violated", "rejected_thought", "rejected_proposed_step")
_JUDGE_KEYS = ("better_candidate", "predicted_error_dimension", "reasoning_summary")


def parse_perturbation(
    text: str, reasoning: str | None = None, *, require_think: bool = False
) -> PerturbationOutput | ContractError:
    """Parse the perturbation annotator's JSON answer.

    Expected keys: ``dimension_violated``, ``rejected_thought``, ``rejected_proposed_step``.

    Args:
        text: Raw model output (reasoning, then the JSON object, possibly in a code fence).
        reasoning: Reasoning the backend returned separately (vLLM ``reasoning_content``). When
            non-blank it is the think text, is never scanned for tags, and ``text`` is parsed as
            the answer only; ``None`` or blank: the reasoning is split off ``text``.
        require_think: Reject an output without (or with blank) reasoning as ``missing_think``.

    Returns:
        A ``PerturbationOutput`` or a ``ContractError``. The rejected step must contain a
        ``<tool_call>`` block; the dimension must resolve to one of the 12.
    """
    return _returning_errors(_perturbation, text, reasoning, require_think)


def _perturbation(text: str, reasoning: str | None, require_think: bool) -> PerturbationOutput:
    think, obj = _json_answer(text, reasoning, _PERTURBATION_KEYS, require_think)
    values = {key: _string_key(obj, key) for key in _PERTURBATION_KEYS}
    dim = lookup_dimension(values["dimension_violated"])
    if dim is None:
        raise _Reject(
            UNKNOWN_DIMENSION, f"{values['dimension_violated']!r} is not one of the 12 dimensions"
        )
    if "<tool_call>" not in values["rejected_proposed_step"].lower():
        raise _Reject(BAD_VALUE, "rejected_proposed_step has no <tool_call> block")
    return PerturbationOutput(
        think=think,
        dimension=dim,
        rejected_thought=values["rejected_thought"],
        rejected_proposed_step=values["rejected_proposed_step"],
    )


_CANDIDATE = re.compile(r"^(?:candidate[\s_]*)?([ab])$")


def parse_judge(
    text: str, reasoning: str | None = None, *, require_think: bool = False
) -> JudgeOutput | ContractError:
    """Parse the judge JSON ``{better_candidate, predicted_error_dimension, reasoning_summary}``.

    Args:
        text: Raw model output.
        reasoning: Reasoning the backend returned separately (vLLM ``reasoning_content``). When
            non-blank it is the think text, is never scanned for tags, and ``text`` is parsed as
            the answer only; ``None`` or blank: the reasoning is split off ``text``.
        require_think: Reject an output without (or with blank) reasoning as ``missing_think``.

    Returns:
        A ``JudgeOutput`` (``dimension=None`` for ``Invalid``) or a ``ContractError``. The
        candidate must be exactly A or B (``"Candidate B"`` is B, ``"AB"`` is an error).
    """
    return _returning_errors(_judge, text, reasoning, require_think)


def _judge(text: str, reasoning: str | None, require_think: bool) -> JudgeOutput:
    think, obj = _json_answer(text, reasoning, _JUDGE_KEYS, require_think)
    values = {key: _string_key(obj, key) for key in _JUDGE_KEYS}
    letter = _CANDIDATE.match(_strip_emphasis(values["better_candidate"]).strip("'\"`").lower())
    if letter is None:
        raise _Reject(BAD_VALUE, f"better_candidate {values['better_candidate']!r}")
    raw_dim = values["predicted_error_dimension"]
    dim = lookup_dimension(raw_dim)
    if dim is None and re.sub(r"[^a-z]", "", raw_dim.lower()) != "invalid":
        raise _Reject(UNKNOWN_DIMENSION, f"{raw_dim!r} is neither a dimension nor Invalid")
    choice: Literal["A", "B"] = "A" if letter.group(1) == "a" else "B"
    return JudgeOutput(think, choice, dim, values["reasoning_summary"])


_GROUNDING_KEYS = ("label", "role", "box")


def parse_grounding(text: str, reasoning: str | None = None) -> GroundingOutput | ContractError:
    """Parse the grounding JSON ``{label, role, box: [x1, y1, x2, y2]}``.

    Args:
        text: Raw model output (the JSON object, after any reasoning).
        reasoning: Reasoning the backend returned separately; never scanned for the object.

    Returns:
        A ``GroundingOutput`` or a ``ContractError``: ``bad_json``, ``missing_key``, or
        ``bad_value`` for a label that is not a non-empty string or a box that is not four
        integers with 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000.
    """
    return _returning_errors(_grounding, text, reasoning)


def _grounding(text: str, reasoning: str | None) -> GroundingOutput:
    think, obj = _json_answer(text, reasoning, _GROUNDING_KEYS, False)
    for key in _GROUNDING_KEYS:
        if key not in obj:
            raise _Reject(MISSING_KEY, f"grounding answer lacks {key!r}")
    label, role, box = obj["label"], obj["role"], obj["box"]
    if not isinstance(label, str) or not label.strip() or not isinstance(role, str):
        raise _Reject(BAD_VALUE, f"label {label!r} / role {role!r}")
    if (
        not isinstance(box, list)
        or len(box) != 4
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in box)
    ):
        raise _Reject(BAD_VALUE, f"box must be four integers, got {box!r}")
    x1, y1, x2, y2 = box
    if not (0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000):
        raise _Reject(BAD_VALUE, f"box {box} is not an area on the 0-1000 grid")
    return GroundingOutput(think, label.strip(), role.strip(), (x1, y1, x2, y2))


# ---------------------------------------------------------------------------------------------
# Renderers (training targets)


def _check_target_think(think: str) -> None:
    """Refuse reasoning that must not become a training target.

    Blank reasoning would teach the critic to skip thinking. Think tags inside the reasoning are
    refused although ``split_think`` tolerates quoted ones: they are special tokens of the chat
    template, and serving-side reasoning parsers end the reasoning at the first ``</think>``.
    """
    if not isinstance(think, str) or not think.strip():
        raise ValueError("a training target needs non-blank reasoning (`think`)")
    if _THINK_TAG.search(think):
        raise ValueError("the reasoning of a training target must not contain think tags")


def render_history_target(think: str, progress: str, last_result: str) -> str:
    """Render the history task's assistant target.

    Args:
        think: Reasoning text (without tags).
        progress: The ``Progress Summary:`` content.
        last_result: The ``Last Action Result:`` content.

    Returns:
        ``<think>…</think>`` then the ``<summary>`` block.

    Raises:
        ValueError: An input is empty (a blank ``think`` included: empty reasoning never becomes
            a training target), ``think`` contains a think tag, or the text would not parse back
            to itself (e.g. a field contains a tag).
    """
    _check_target_think(think)
    text = (
        f"<think>\n{think.strip()}\n</think>\n<summary>\n"
        f"Progress Summary: {progress.strip()}\n"
        f"Last Action Result: {last_result.strip()}\n</summary>"
    )
    back = parse_history(text)
    expected = HistoryOutput(think.strip(), progress.strip(), last_result.strip())
    if back != expected:
        raise ValueError(f"history target does not round-trip: {back!r}")
    return text


def render_critique_target(
    think: str, verdict: Verdict, dimension: Dimension | str | None, explanation: str
) -> str:
    """Render the critique task's assistant target in the HiViG format.

    Args:
        think: Reasoning text (without tags).
        verdict: ``"Good"`` or ``"Bad"``.
        dimension: Required for Bad (a ``Dimension`` or a name ``lookup_dimension`` resolves);
            must be ``None`` for Good.
        explanation: The ``Explanation:`` content.

    Returns:
        ``<think>…</think>`` then the ``<criticism>`` block.

    Raises:
        ValueError: ``think`` is blank or contains a think tag, verdict and dimension disagree,
            the name is unknown, or the text would not parse back to the same values.
    """
    _check_target_think(think)
    if verdict not in ("Good", "Bad"):
        raise ValueError(f"verdict must be 'Good' or 'Bad', got {verdict!r}")
    dim = lookup_dimension(dimension) if isinstance(dimension, str) else dimension
    if isinstance(dimension, str) and dim is None:
        raise ValueError(f"unknown dimension {dimension!r}")
    if (verdict == "Bad") != (dim is not None):
        raise ValueError("a Bad verdict needs a dimension and a Good verdict must not have one")
    lines = [f"Overall Grading: {verdict}"]
    if dim is not None:
        lines.append(f"Error Dimension: {dim.name}")
    lines.append(f"Explanation: {explanation.strip()}")
    body = "\n".join(lines)
    text = f"<think>\n{think.strip()}\n</think>\n<criticism>\n{body}\n</criticism>"
    back = parse_critique(text)
    expected = CritiqueOutput(think.strip(), verdict, dim, explanation.strip())
    if back != expected:
        raise ValueError(f"critique target does not round-trip: {back!r}")
    return text
