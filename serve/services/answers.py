"""What every answer carries (the versions) and how a trace's state is flagged on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve.protocol import TraceFlag
from serve.traces import TraceWriter

SCHEMA_VERSION = "1"
"""Version of the wire protocol (``serve.protocol``), reported in every answer."""


@dataclass(frozen=True)
class Versions:
    """The versions every answer carries: the model, the critic's prompts, the protocol."""

    model_version: str
    prompt_version: str
    schema_version: str = SCHEMA_VERSION

    def __call__(self) -> dict[str, str]:
        """The three as answer fields, in wire order."""
        return {
            "model_version": self.model_version,
            "prompt_version": self.prompt_version,
            "schema_version": self.schema_version,
        }


def trace_event(traces: TraceWriter, answer: Any, sid: str, event: str, **fields: Any) -> None:
    """Append a trace event once its step is committed; the answer says if the trace lacks
    events.

    The session state is the truth and is committed first: a trace folder that takes no writes
    never turns a committed step into an error (the event waits and is written later, in order).
    """
    traces.write(sid, event, **fields)
    flag_trace(traces, answer, sid)


def flag_trace(traces: TraceWriter, answer: Any, sid: str) -> None:
    """Set ``answer.trace`` when the session's trace lacks events (``TraceFlag``)."""
    status: TraceFlag | None = traces.status(sid)  # type: ignore[assignment]
    if status is not None:
        answer.trace = status
