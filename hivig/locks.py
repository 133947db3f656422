"""The project's cross-process locks, one home for both kinds.

``file_lock`` / ``run_once``: a lease for one-off jobs that many processes may start at once
(an ingest, a merge), on many hosts over a shared filesystem::

    with file_lock(out / "merge.lock") as held:
        if held:
            merge()
    # or: one process does the job, the others wait for its result
    run_once(out / "ingest.lock", lambda: marker.exists(), ingest)

A process id says nothing about another host, so the lock file names ``host:pid`` and works as
a lease: while held, a heartbeat refreshes its mtime every ``lease_s / 4`` seconds, and a lock
whose mtime is older than ``lease_s`` (a crashed or killed holder on any host) is taken over.
On the holder's own host a dead holder is seen at once.

``hold_flock`` / ``remove_unheld``: a per-key lock for requests served by several worker
processes of one host (a gateway session). The kernel's ``flock`` is released when its holder
dies, so there is no lease to wait out, and taking it costs one system call: right for a lock
taken on every request, wrong across hosts (some network filesystems have no ``flock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LEASE_S = 300.0
"""Seconds without a heartbeat after which a lock counts as abandoned."""
POLL_S = 5.0
"""Seconds between checks while another process holds the lock (``run_once``)."""


@contextlib.contextmanager
def file_lock(path: Path, lease_s: float = LEASE_S) -> Iterator[bool]:
    """Exclusive right to a one-off job: yields True for the one holder, False to the others.

    Args:
        path: The lock file.
        lease_s: Seconds without a heartbeat after which the lock counts as abandoned.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _lock_is_stale(path, lease_s):
                path.unlink(missing_ok=True)
                continue
            yield False
            return
        os.write(fd, lock_owner().encode())
        os.close(fd)
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(path, lease_s / 4, stop), daemon=True)
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join()
            path.unlink(missing_ok=True)
        return
    yield False


def run_once(
    lock: Path, done: Callable[[], bool], job: Callable[[], object], poll_s: float | None = None
) -> None:
    """Make ``done()`` true: the process that takes ``lock`` runs ``job``, the others wait.

    ``done`` must name a result the job writes last (a completion marker): a waiting process
    returns as soon as it holds, and a job killed half-way is run again by whoever takes the
    lock next.
    """
    while not done():
        with file_lock(lock) as held:
            if held and not done():
                job()
        if not done():
            time.sleep(POLL_S if poll_s is None else poll_s)


def lock_owner() -> str:
    """``host:pid`` of this process, as written into lock files."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _heartbeat(path: Path, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)


def _lock_is_stale(path: Path, lease_s: float) -> bool:
    """Whether the lock's lease ran out, or its holder is a dead process on this host."""
    try:
        age = time.time() - path.stat().st_mtime
        owner = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return True  # released meanwhile: try again
    if age > lease_s:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        # Another host's process cannot be probed from here; only its lease can expire.
        # A lock still being written (empty or half a name) is fresh, so it is respected.
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, owned by another user
    return False


# --------------------------------------------------------------------------------------------
# Per-key locks of one host's processes


class LockUnavailable(OSError):
    """A lock file cannot be made or locked (a read-only folder, a filesystem without locks)."""


async def hold_flock(path: Path) -> int:
    """An open descriptor of ``path`` holding its exclusive ``flock`` (close it to release).

    While another process holds it, the lock is polled from the event loop: a thread blocked in
    ``flock`` would hold a place of the default executor, which model calls share.

    Raises:
        LockUnavailable: The file cannot be made, or the filesystem has no locks.
    """
    while True:
        fd = await _lock_open(path)
        # ``remove_unheld`` removes lock files while holding their lock: one locked after it was
        # removed is no longer the key's, and a new one is made.
        if _same_file(fd, path):
            return fd
        os.close(fd)


async def _lock_open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # the folder refuses writes
        raise LockUnavailable(f"lock file unavailable: {e.strerror or e}") from None
    pause = 0.001
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)
    except OSError as e:  # no locks on this filesystem (ENOLCK on some network mounts)
        os.close(fd)
        raise LockUnavailable(f"lock unavailable: {e.strerror or e}") from None
    except BaseException:
        os.close(fd)
        raise


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def remove_unheld(path: Path) -> int:
    """Remove a lock file of ``hold_flock`` unless someone holds it (1 when removed).

    The file is removed while its lock is held here, so a process that opened it before and
    waits for it sees, once it has the lock, that the path names another file
    (``hold_flock``).
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _same_file(fd, path):
            return 0
        path.unlink()
        return 1
    except OSError:  # held (BlockingIOError), or already gone: kept for now
        return 0
    finally:
        os.close(fd)
