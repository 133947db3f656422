"""Accounting for data_gen steps: every input unit is kept or dropped with a reason, never lost.

A ``Ledger`` collects quarantine entries (``file``, 1-based ``line``, stable ``reason`` code, human
``message``) and the kept count, so that ``lines == kept + Σ dropped`` can be checked before any
output is written.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
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


TEMP_SUFFIX = ".tmp"
"""Temp files are ``.<name>.<host>-<pid>-<token>.tmp`` next to their target."""
STALE_TEMP_S = 3600.0
"""Seconds after which a temp file of another host counts as abandoned."""


def _temp_name(target: Path) -> Path:
    # Host, pid and a random token: concurrent writers to one folder (two ingests, shards on
    # several hosts over a shared filesystem) never share a temp file, and cleanup can tell
    # whose leftover it is.
    token = secrets.token_hex(4)
    return target.with_name(f".{target.name}.{_host()}-{os.getpid()}-{token}{TEMP_SUFFIX}")


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace("-", "_")


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (no half-written files).

    The text is encoded before anything touches the disk, so text that cannot be UTF-8 (a lone
    surrogate) raises without leaving a temp file; any other failure removes the temp file too.
    """
    target = Path(path)
    data = text.encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temps(folder: str | os.PathLike, max_age_s: float = STALE_TEMP_S) -> list[str]:
    """Remove abandoned temp files of ``write_atomic`` in ``folder``; returns their names.

    A temp file is abandoned when its writer is a dead process on this host, or, for another
    host (whose processes cannot be probed), when it is older than ``max_age_s``. Fixed-name
    ``.<name>.tmp`` files of earlier versions have no owner to wait for and are removed.
    """
    base = Path(folder)
    if not base.is_dir():
        return []
    host, removed = _host(), []
    for p in base.glob(f".*{TEMP_SUFFIX}*"):
        if not p.is_file():
            continue
        m = _TEMP.match(p.name)
        try:
            age = time.time() - p.stat().st_mtime
        except FileNotFoundError:
            continue
        if m and m.group("host") == host:
            stale = not _pid_alive(int(m.group("pid")))
        else:
            stale = age > max_age_s or (m is None and p.name.endswith(TEMP_SUFFIX))
        if stale:
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return sorted(removed)


_TEMP = re.compile(r"^\..+\.(?P<host>[^.]+)-(?P<pid>\d+)-[0-9a-f]{8}\.tmp$")


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
