"""Accounting for data_gen steps: every input unit is kept or dropped with a reason, never lost.

A ``Ledger`` collects quarantine entries (``file``, 1-based ``line``, stable ``reason`` code, human
``message``) and the kept count, so that ``lines == kept + Σ dropped`` can be checked before any
output is written.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class QuarantineEntry:
    """One rejected input line or step."""

    file: str
    line: int
    reason: str
    message: str

    def to_json(self) -> dict:
        """The JSONL form written to ``quarantine.jsonl``."""
        return {
            "file": self.file,
            "line": self.line,
            "reason": self.reason,
            "message": self.message,
        }


class AccountingError(RuntimeError):
    """The counts identity ``lines == kept + Σ dropped`` does not hold (a bug, never data)."""


@dataclass
class Ledger:
    """Counts of input lines, kept steps and drops by reason, plus the quarantine entries."""

    lines: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    entries: list[QuarantineEntry] = field(default_factory=list)

    def drop(self, file: str, line: int, reason: str, message: str) -> None:
        """Quarantine one line with a reason."""
        self.dropped[reason] += 1
        self.entries.append(QuarantineEntry(file, line, reason, message))

    def check(self) -> None:
        """Raise ``AccountingError`` unless every line is kept or dropped exactly once."""
        total = self.kept + sum(self.dropped.values())
        if total != self.lines:
            raise AccountingError(
                f"{self.lines} lines read but {self.kept} kept + {sum(self.dropped.values())} "
                f"dropped = {total}"
            )

    def sorted_entries(self) -> list[QuarantineEntry]:
        """Entries in file, line order (deterministic whatever the processing order)."""
        return sorted(self.entries, key=lambda e: (e.file, e.line, e.reason))


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (no half-written files)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)


def split_lines(text: str) -> list[str]:
    """JSONL lines of ``text``: split on ``\\n`` only (``str.splitlines`` would also split on
    U+2028, U+0085 and friends, which JSON strings may contain raw), one trailing ``\\r`` dropped.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def jsonl(objects) -> str:
    """Objects as JSON lines (UTF-8 text, one object per line, trailing newline when non-empty)."""
    lines = [json.dumps(o, ensure_ascii=False) for o in objects]
    return "\n".join(lines) + ("\n" if lines else "")
