"""Per-session JSONL traces: the input of ``diagnose`` and a source of new training data.

One file per session (``traces/<session_id>.jsonl``), one JSON object per event, appended and
flushed before the response is sent, so a trace is complete up to the last answered request.
Images are referenced by ``image_ref`` (stored once under ``images/``), never inlined.
"""

from __future__ import annotations

import datetime as _dt
import re
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hivig import jsonio
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart

_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def messages_json(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Prompt messages as JSON; images as their reference and marks."""
    out = []
    for message in messages:
        content: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart) and isinstance(part.image, ImageRef):
                marks = [{"kind": type(m).__name__, **asdict(m)} for m in part.image.marks]
                content.append({"type": "image", "ref": part.image.path, "marks": marks})
            else:
                content.append({"type": "image", "ref": None, "marks": []})
        out.append({"role": message.role, "content": content})
    return out


class TraceWriter:
    """Appends events to ``<root>/<session_id>.jsonl``."""

    def __init__(self, root: str | Path) -> None:
        """Write under ``root`` (created)."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def path(self, session_id: str) -> Path:
        """The trace file of a session."""
        return self.root / f"{session_id}.jsonl"

    def write(self, session_id: str, event: str, **fields: Any) -> None:
        """Append one event (``time`` is added)."""
        record = {
            "event": event,
            "session_id": session_id,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
            **fields,
        }
        line = jsonio.dumps(record, default=str) + b"\n"
        with self._lock, self.path(session_id).open("ab") as f:
            f.write(line)


def valid_session_id(session_id: str) -> bool:
    """Session ids become file names: letters, digits, ``_.-`` only."""
    # fullmatch: ``$`` would also match before a final newline ("abc\n" names a file too).
    return bool(_SAFE_ID.fullmatch(session_id)) and session_id not in (".", "..")
