"""Files every stage writes: atomic replacement, JSON lines, and the cleanup of abandoned temps.

One writer for the whole project, so every output is either its old or its new content (never
half-written) and every temp file can be traced to its writer.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TEMP_SUFFIX = ".tmp"
"""Temp files are ``.<name>.<host>-<pid>-<token>.tmp`` next to their target."""
STALE_TEMP_S = 3600.0
"""Seconds after which a temp file of another host counts as abandoned."""

_TEMP = re.compile(r"^\..+\.(?P<host>[^.]+)-(?P<pid>\d+)-[0-9a-f]{8}\.tmp$")


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace("-", "_")


def temp_name(target: Path) -> Path:
    """A fresh temp path next to ``target``.

    Host, pid and a random token: concurrent writers to one folder (threads, two processes,
    shards on several hosts over a shared filesystem) never share a temp file, and cleanup can
    tell whose leftover it is.
    """
    token = secrets.token_hex(4)
    return target.with_name(f".{target.name}.{_host()}-{os.getpid()}-{token}{TEMP_SUFFIX}")


@contextmanager
def atomic_path(path: str | os.PathLike, *, mkdir: bool = True) -> Iterator[Path]:
    """A temp path to write in full, replacing ``path`` when the block ends without error.

    The temp file is removed otherwise. For writers that want a path: parquet, SQLite backups.
    """
    target = Path(path)
    if mkdir:
        target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(target)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(
    path: str | os.PathLike, data: bytes | str, *, durable: bool = True, mkdir: bool = True
) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` through a temp file and a rename.

    Text is encoded before anything touches the disk, so text that cannot be UTF-8 (a lone
    surrogate) raises without leaving a temp file. ``durable`` syncs the data before the rename,
    so a crash leaves the old content or the new, never an empty file; hot paths whose content
    can be made again (a screenshot store) pass ``False``.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, mkdir=mkdir) as tmp, open(tmp, "wb") as f:
        f.write(raw)
        if durable:
            f.flush()
            os.fsync(f.fileno())


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


# --------------------------------------------------------------------------------------------
# JSON lines


def split_lines(text: str) -> list[str]:
    r"""JSONL lines of ``text``: split on ``\n`` only, one trailing ``\r`` dropped.

    ``str.splitlines`` would also split on U+2028, U+0085 and friends, which JSON strings may
    contain raw.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def dumps_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    """One JSON object per line, keys sorted, UTF-8 kept (byte-stable across runs)."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def loads_jsonl(text: str) -> list[dict[str, Any]]:
    """Inverse of ``dumps_jsonl``."""
    return [json.loads(line) for line in split_lines(text) if line.strip()]


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
    """``rows`` as JSON lines at ``path``, atomically."""
    write_atomic(path, dumps_jsonl(rows))
