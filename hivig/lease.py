"""A cross-process lease lock for one-off jobs that many processes may start at once.

    with file_lock(out / "merge.lock") as held:
        if held:
            merge()
    # or: one process does the job, the others wait for its result
    run_once(out / "ingest.lock", lambda: marker.exists(), ingest)

Shards of an array job run on many hosts over a shared filesystem, where a process id says
nothing about another host. The lock file therefore names ``host:pid`` and works as a lease:
while held, a heartbeat refreshes its mtime every ``lease_s / 4`` seconds, and a lock whose
mtime is older than ``lease_s`` (a crashed or killed holder on any host) is taken over. On the
holder's own host a dead holder is seen at once.
"""

from __future__ import annotations

import contextlib
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
    lock: Path, done: Callable[[], bool], job: Callable[[], object], poll_s: float = POLL_S
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
            time.sleep(poll_s)


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
