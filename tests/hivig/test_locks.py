"""hivig.locks: the per-key flock and the lease, provoked where they cannot be taken."""

from __future__ import annotations

import asyncio
import os

import pytest

from hivig.locks import LockUnavailable, file_lock, hold_flock, remove_unheld


def test_a_lock_file_that_cannot_be_made_is_lock_unavailable(tmp_path):
    # A path under a plain file (the folder is not a folder): the gateway answers it as a
    # storage error, never a crash.
    (tmp_path / "state").write_text("not a folder")
    with pytest.raises(LockUnavailable, match="lock file unavailable"):
        asyncio.run(hold_flock(tmp_path / "state" / "s1.lock"))


def test_a_held_flock_is_not_removed_and_a_free_one_is(tmp_path):
    path = tmp_path / "s1.lock"
    fd = asyncio.run(hold_flock(path))
    try:
        assert remove_unheld(path) == 0 and path.exists()  # held: kept
    finally:
        os.close(fd)
    assert remove_unheld(path) == 1 and not path.exists()


def test_the_lease_goes_to_one_holder(tmp_path):
    lock = tmp_path / "job.lock"
    with file_lock(lock) as first, file_lock(lock) as second:
        assert (first, second) == (True, False)
    assert not lock.exists()
