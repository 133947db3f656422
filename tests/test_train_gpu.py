"""The GPU throughput benchmark: a CPU smoke run of its plumbing and a GPU run of a short 8B."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_train_gpu  # noqa: E402

SMALL = ["--steps", "2", "--warmup", "1", "--images", "1", "--samples-per-pack", "2"]


@pytest.mark.slow
def test_benchmark_plumbing_on_cpu_with_the_tiny_model():
    args = ["--preset", "tiny", "--device", "cpu", "--screen", "200x100", "--max-pixels", "65536"]
    args += ["--peak-tflops", "1"]  # CPU has no table entry: MFU needs an explicit peak
    result = bench_train_gpu.run([*args, *SMALL, "--text", "200", "--answer", "100"])
    assert result["tokens_per_s_per_gpu"] > 0 and math.isfinite(result["loss"])
    assert 0 < result["mfu"] < result["mfu_non_causal"]


@pytest.mark.gpu
def test_benchmark_runs_a_two_layer_8b_shape_on_gpu():
    result = bench_train_gpu.run(
        ["--preset", "8b", "--layers", "2", *SMALL, "--text", "1024", "--answer", "512"]
    )
    assert math.isfinite(result["loss"]) and result["tokens_per_s_per_gpu"] > 0
    assert 0 < result["mfu"] < 1 and result["peak_mem_gib"] > 0


def test_gpu_check_script_parses_and_writes_one_json():
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    # One JSON under $OUT, a time budget under the device's 8 minutes, no silent fallback.
    assert 'OUT="${OUT:-./gpu_check_out}"' in text and "gpu_check.json" in text
    assert 'BUDGET="${GPU_CHECK_BUDGET:-450}"' in text
    assert '--attn "$attn"' in text and "--compare-attention" in text
