"""Shared pytest set-up: GPU tests are skipped without CUDA; fixtures built once per session."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="session")
def sample60(tmp_path_factory):
    """The 60-trajectory sample corpus (seed 0), generated and ingested once per session.

    Read-only: tests write their runs elsewhere (``tests._sample_run.demo_config(sample60,
    out)``). The folder is checked unchanged at the end of the session.
    """
    from _sample_run import ingested_sample

    root = ingested_sample(tmp_path_factory.mktemp("sample60"), 60, 0)
    before = _tree_digest(root)
    yield root
    assert _tree_digest(root) == before, "a test wrote into the shared sample corpus"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A saved tiny Qwen3-VL checkpoint (``hivig.tiny.save_tiny_checkpoint`` defaults), built once.

    Read-only, like ``sample60``: checked unchanged at the end of the session.
    """
    from hivig.tiny import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")
    before = _tree_digest(ckpt)
    yield ckpt
    assert _tree_digest(ckpt) == before, "a test wrote into the shared tiny checkpoint"
