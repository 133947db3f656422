"""Accounting for data_gen steps: every input unit is kept or dropped with a reason, never lost.

A ``Ledger`` collects quarantine entries (``file``, 1-based ``line``, stable ``reason`` code, human
``message``) and the kept count, so that ``lines == kept + Σ dropped`` can be checked before any
output is written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


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
