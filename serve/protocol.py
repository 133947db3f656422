"""The gateway's wire protocol: every request and response body as a pydantic model.

Request models are strict and closed: a field of the wrong JSON type (``"1"`` for an integer,
``true`` for a number), a non-finite number or a field the route does not know is a 422 in the
documented error shape, never a silent coercion. The OpenAPI document (``/openapi.json``) is
generated from these models. Actions stay JSON values here: their language (typed, raw text,
coordinate spaces) is ``serve.actions``'s to read, with its own ``bad_action`` answers.

Response models are what the services build and the routes dump (``dump_answer``); their fields
are declared in wire order, and an answer keeps any field beyond them (``extra="allow"``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hivig.actions import PLATFORM_ALIASES, platform_name
from serve.config import ACTION_FORMATS, COORD_SPACES

CoordSpace = Literal[COORD_SPACES]  # type: ignore[valid-type]
ActionFormat = Literal[ACTION_FORMATS]  # type: ignore[valid-type]

MAX_TASK_CHARS = 16_384
"""A task instruction longer than this is refused: it is echoed in every answer and prompt."""

StepIdx = Annotated[int, Field(ge=0, lt=2**63, description="0-based step of the episode")]


def _not_a_folder_name(sid: str) -> str:
    if sid in (".", ".."):
        raise PydanticCustomError("session_id", "'.' and '..' are not session ids")
    return sid


SessionId = Annotated[
    str,
    # Session ids name trace files: no path separators, no control characters, no newline
    # (the pattern is matched against the whole string), and not "." or "..".
    Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$", description="letters, digits and _.- only"),
    AfterValidator(_not_a_folder_name),
]
ImageRef = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
GridValue = Annotated[float, Field(ge=0, le=1000)]
Action = Any
"""A typed action object or ``{"raw": text, "format": ...}``; read by ``serve.actions``."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Open(BaseModel):
    """An answer or an echoed object: fields beyond the documented ones are kept."""

    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------------------------------------
# Parts


class Size(_Closed):
    w: Annotated[int, Field(gt=0, lt=2**31)]
    h: Annotated[int, Field(gt=0, lt=2**31)]


class ImageObject(_Closed):
    """An image given as an object: inline base64 or a reference to an uploaded one."""

    screenshot: str | None = None
    image_ref: ImageRef | None = None


class HistoryText(_Closed):
    """The ``history`` object of an answer, passed back as a stateless observe's history."""

    progress_summary: str
    last_action_result: str
    version: int | None = None
    stale: bool | None = None


class EchoSummary(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    progress_summary: str | None = None
    last_action_result: str | None = None
    version: int = 0
    stale: bool = False


class EchoStep(BaseModel):
    """One executed step as the gateway echoed it (kept as sent; the known fields are checked)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    step_idx: StepIdx
    step_text: str
    intent: str | None = None
    action_text: str | None = None
    last_action_result: str | None = None
    progress_summary: str | None = None
    image_ref: ImageRef | None = None
    actions: list[Any] | None = None
    changed: bool | None = None


class Echo(BaseModel):
    """The ``echo`` of an earlier answer: what re-creates a session a gateway lost."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    summary: EchoSummary = Field(default_factory=EchoSummary)
    step_idx: Annotated[int, Field(ge=-1, lt=2**63)] = -1
    screens: dict[Annotated[str, Field(pattern=r"^[0-9]+$")], ImageRef] = Field(
        default_factory=dict
    )
    steps: list[EchoStep] = Field(default_factory=list)
    pointer: Annotated[list[int], Field(min_length=2, max_length=2)] | None = None

    @field_validator("summary", "screens", "steps", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any, info: Any) -> Any:
        # Older clients send ``null`` for an empty part.
        defaults = {"summary": {}, "screens": {}, "steps": []}
        return defaults[info.field_name] if value is None else value


# ---------------------------------------------------------------------------------------------
# Requests


class SessionFields(_Closed):
    """What a session is: the task, the platform, the screen and how actions are stated."""

    task: Annotated[str, Field(min_length=1, max_length=MAX_TASK_CHARS)]
    platform: str = Field(description=f"one of {sorted(PLATFORM_ALIASES)}")
    screen: Size
    coord_space: CoordSpace = "screen_px"
    frame: Size | None = Field(None, description="the frame the policy saw (resized_px)")
    action_format: ActionFormat = "auto"
    policy_id: Annotated[str, Field(max_length=256)] | None = None
    volatile_regions: list[
        Annotated[list[GridValue], Field(min_length=4, max_length=4, description="x0, y0, x1, y1")]
    ] = Field(default_factory=list, description="boxes on the 0-1000 grid the detector ignores")

    @field_validator("task")
    @classmethod
    def _task_has_text(cls, task: str) -> str:
        if not task.strip():
            raise PydanticCustomError("blank", "must be a non-empty string")
        return task

    @field_validator("platform")
    @classmethod
    def _known_platform(cls, name: str) -> str:
        platform = platform_name(name)
        if platform is None:
            raise PydanticCustomError(
                "platform", "must be one of {names}", {"names": sorted(PLATFORM_ALIASES)}
            )
        return platform

    @field_validator("volatile_regions", mode="before")
    @classmethod
    def _null_regions(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("volatile_regions")
    @classmethod
    def _boxes(cls, boxes: list[list[float]]) -> list[list[float]]:
        for box in boxes:
            if not (box[0] < box[2] and box[1] < box[3]):
                raise PydanticCustomError("box", "boxes must be [x0, y0, x1, y1] with x0<x1, y0<y1")
        return boxes

    @model_validator(mode="after")
    def _frame_for_resized(self) -> SessionFields:
        if self.coord_space == "resized_px" and self.frame is None:
            raise PydanticCustomError("frame", "coord_space resized_px needs `frame`")
        return self


class SessionCreate(SessionFields):
    """``POST /v1/sessions``: a new session, or one re-created from an echo."""

    session_id: SessionId | None = None
    echo: Echo | None = None


class _Screenshot(_Closed):
    screenshot: str | ImageObject | None = Field(None, description="base64 PNG/JPEG")
    image_ref: ImageRef | None = None


class Observe(_Screenshot):
    """``POST /v1/sessions/{sid}/observe``: the step that was executed and the screen after it."""

    step_idx: StepIdx
    prev_screenshot: str | ImageObject | None = None
    prev_image_ref: ImageRef | None = None
    prev_action: Action = None
    force: bool = Field(False, description="replace a stored step or jump a gap")


class _Proposal(_Screenshot):
    action: Action = None
    candidates: Annotated[list[Action], Field(min_length=1)] | None = None
    return_thinking: bool = False
    return_image: bool = False

    @model_validator(mode="after")
    def _something_to_judge(self) -> _Proposal:
        if self.candidates is None and "action" not in self.model_fields_set:
            raise PydanticCustomError("bad_action", "critique needs `action` or `candidates`")
        return self


class Critique(_Proposal):
    """``POST /v1/sessions/{sid}/critique``: the proposed action(s) on the latest observed step."""

    step_idx: StepIdx


class ObserveStateless(SessionFields):
    """``POST /v1/observe``: a history update with the caller's history and screenshots."""

    previous_summary: str | HistoryText | None = None
    before: str | ImageObject | None = None
    before_ref: ImageRef | None = None
    after: str | ImageObject | None = None
    after_ref: ImageRef | None = None
    prev_action: Action = None


class CritiqueStateless(SessionFields, _Proposal):
    """``POST /v1/critique``: a verdict with the caller's trajectory and screenshot."""

    trajectory: list[Action] = Field(default_factory=list, description="the executed actions")


class ImageUpload(_Closed):
    """``POST /v1/images``."""

    image: str = Field(description="base64 PNG/JPEG")


class DiagnoseRequest(_Closed):
    """``POST /v1/diagnose``: a session's trace, or a path under the allowed roots."""

    session_id: SessionId | None = None
    path: (
        Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f]*$")] | None
    ) = None

    @model_validator(mode="after")
    def _one_target(self) -> DiagnoseRequest:
        if self.session_id is None and self.path is None:
            raise PydanticCustomError("target", "diagnose needs `session_id` or `path`")
        return self


# ---------------------------------------------------------------------------------------------
# Responses
#
# The services build their answers as these objects (``model_construct``: the values are the
# gateway's own, so nothing is validated on the request path) and the routes dump them with
# ``dump_answer``. Fields are declared in the order they go on the wire; a field left out of
# ``model_construct`` is left out of the answer too (a stateless answer has no ``session_id``),
# and ``trace`` is set only when the session's trace lacks events. Tests validate every route's
# real answer, and every answer documented in ``docs/serving.md``, against these models.

TraceFlag = Literal["pending", "incomplete"]
"""``pending``: some of the session's trace events wait to be written; ``incomplete``: some were
lost."""


class HistoryOut(_Open):
    progress_summary: str
    last_action_result: str
    version: int
    stale: bool


class SessionCreated(_Open):
    session_id: str
    created: bool
    echo: dict[str, Any]
    model_version: str
    prompt_version: str
    schema_version: str
    trace: TraceFlag | None = None


class SessionInfo(_Open):
    session_id: str
    step_idx: int
    closed: bool
    echo: dict[str, Any]
    model_version: str
    prompt_version: str
    schema_version: str


class SessionClosed(_Open):
    session_id: str
    closed: bool
    model_version: str
    prompt_version: str
    schema_version: str
    trace: TraceFlag | None = None


class ObserveAnswer(_Open):
    session_id: str | None = Field(None, description="absent from the stateless answer")
    step_idx: int
    status: Literal["ok", "degraded"]
    reason: str | None = None
    history: HistoryOut
    image_ref: str
    change: dict[str, Any] | None = None
    recurrence: dict[str, Any] | None = None
    recovery: dict[str, Any] | None = Field(None, description="a recovery target (ReTrace)")
    echo: dict[str, Any] | None = None
    timing_ms: dict[str, float]
    usage: dict[str, int]
    model_version: str
    prompt_version: str
    schema_version: str
    trace: TraceFlag | None = None


class Marker(_Open):
    x_1000: int
    y_1000: int
    x_px: int
    y_px: int
    shape: Literal["x", "arrow"]


class VerdictAnswer(_Open):
    """One verdict: the answer to ``action``, or one of ``results`` for ``candidates``."""

    marker: Marker | None = None
    action_text: Any = None
    parse_error: str | None = None
    thinking: str | None = None
    confidence: float | None = None
    annotated_image: str | None = None
    status: Literal["ok", "degraded"]
    verdict: Literal["good", "bad", "abstain"]
    source: Literal["model", "rule", "fallback"]
    reason: str | None = None
    error_dimension: str | None = None
    explanation: str
    parse_status: str
    truncated: bool = False
    usage: dict[str, int] | None = None
    model_ms: float | None = None
    recurrence: dict[str, Any] | None = None


class CritiqueAnswer(VerdictAnswer):
    """The verdict on ``action`` with what every critique answer carries."""

    history_version: int
    echo: dict[str, Any] | None = Field(None, description="absent from the stateless answer")
    timing_ms: dict[str, float]
    model_version: str
    prompt_version: str
    schema_version: str
    trace: TraceFlag | None = None


class RankedAnswer(_Open):
    results: list[VerdictAnswer]
    ranking: list[int]
    history_version: int
    echo: dict[str, Any] | None = Field(None, description="absent from the stateless answer")
    timing_ms: dict[str, float]
    model_version: str
    prompt_version: str
    schema_version: str
    trace: TraceFlag | None = None


class ImageStored(_Open):
    image_ref: str
    w: int
    h: int
    timing_ms: dict[str, float]
    model_version: str
    prompt_version: str
    schema_version: str


class JobAnswer(_Open):
    """A diagnosis job: as started (``pending``), and as ``GET /v1/jobs/{id}`` shows it."""

    job_id: str
    status: Literal["pending", "done", "failed"]
    running: bool | None = None
    input: str | None = None
    out: str | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    html: str | None = None
    finished: float | None = None
    model_version: str
    prompt_version: str
    schema_version: str


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorAnswer(BaseModel):
    """Every failure, on every route (unknown routes included)."""

    error: ErrorDetail


Answer = (
    SessionCreated
    | SessionInfo
    | SessionClosed
    | ObserveAnswer
    | CritiqueAnswer
    | RankedAnswer
    | ImageStored
    | JobAnswer
)
"""What a ``/v1`` route answers on success."""


def dump_answer(answer: BaseModel) -> dict[str, Any]:
    """The JSON object of an answer: the fields it was built with, in declared order, then any
    extra ones (nested answers dumped the same way).

    ``model_dump`` would also write the defaults of fields left out, and re-check every value;
    the answer's own ``__dict__`` is the gateway's data already.
    """
    fields_set = answer.model_fields_set
    out = {k: _dumped(v) for k, v in answer.__dict__.items() if k in fields_set}
    extra = answer.__pydantic_extra__
    if extra:
        out.update(extra)
    return out


def _dumped(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return dump_answer(value)
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return [dump_answer(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Validation errors → the documented codes


_ACTION_FIELDS = frozenset({"action", "candidates", "prev_action", "trajectory"})
_BRANCHES = frozenset({"str", "int", "bool", "float", "list", "dict", "HistoryText", "ImageObject"})


def error_of(exc: ValidationError) -> tuple[str, str]:
    """``(code, message)`` of a validation failure: the first problem, named by its field."""
    first = exc.errors(include_url=False, include_input=False)[0]
    # A union's branch names (``str``, ``ImageObject``) are pydantic's, not the client's fields.
    loc = ".".join(str(p) for p in first["loc"] if str(p) not in _BRANCHES)
    action = first["type"] == "bad_action" or (first["loc"] and first["loc"][0] in _ACTION_FIELDS)
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    extra = f" ({len(exc.errors()) - 1} more)" if exc.error_count() > 1 else ""
    text = f"`{loc}`: {message}{extra}" if loc else f"{message}{extra}"
    return ("bad_action" if action else "bad_request"), text
