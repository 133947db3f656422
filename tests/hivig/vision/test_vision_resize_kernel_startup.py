"""An explicitly chosen torch resize kernel is loaded when the choice is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_explicit_torch_kernel_is_imported_at_the_check_not_at_the_first_resize():
    pytest.importorskip("torch")
    code = (
        "import os, sys; os.environ['HIVIG_RESIZE_KERNEL'] = 'torch'\n"
        "from hivig.vision import resize_kernel\n"
        "assert 'torch' not in sys.modules\n"
        "assert resize_kernel() == 'torch'\n"
        "print('torch' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "True"
