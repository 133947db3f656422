#!/bin/bash
# One-GPU check of the training stage, in one call under 7 minutes on one H200; writes one JSON
# file and exits 0 only when every step passed its threshold:
#   0. the environment first (Python, torch/transformers/accelerate/peft, C compiler and Python
#      headers for Triton, free GPU memory, disk), the carried wheels installed one by one, and
#      any module the check still cannot import (benchmarks/gpu_env.py),
#   1. `pytest -m gpu` on the training and backend GPU tests,
#   2. packed-attention equality on a 2-layer Qwen3-VL-8B shape: the last hidden states of one
#      packed row under every available backend against each sample alone under SDPA (bf16
#      tolerance),
#   3. the flex kernel's output and q/k/v gradients at the 8B attention shape on packs of varying
#      lengths against a float64 per-sample reference (its compile also warms the cache the
#      benchmarks reuse, so their timed steps never include it),
#   4. bench_train_gpu.py on the full Qwen3-VL-8B shape per backend: tokens/s/GPU, MFU and peak
#      memory (and a half-checkpointed run under flex), each with its sanity checks.
#
#   bash benchmarks/gpu_wheels.sh                      # once, here: wheels into .gpu_wheels/
#   bash benchmarks/gpu_check.sh                       # on the GPU: ./gpu_check_out/gpu_check.json
#   OUT=/tmp/x bash benchmarks/gpu_check.sh
#   GPU_CHECK_SMALL=1 bash benchmarks/gpu_check.sh      # tiny shapes on CPU: the script's own test
#
# The device image has torch, transformers, accelerate and peft (with their dependencies) and no
# network; everything else the check imports comes from .gpu_wheels/ (git-ignored, carried with
# the run), unpacked into a private folder on PYTHONPATH, never into the image's site-packages.
# No deepspeed, flash-attn, datasets, pyarrow, torchvision or qwen-vl-utils is needed
# (flash_attention_2 is measured only where flash-attn happens to be installed).
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
SMALL="${GPU_CHECK_SMALL:-0}"
PARTS="$(mktemp -d)"
trap 'rm -rf "$PARTS"' EXIT  # wheels unpacked, compile caches, logs (the JSON keeps the tails)
START=$(date +%s)
BUDGET="${GPU_CHECK_BUDGET:-420}"  # seconds for all steps (the device allows 10 min a call)

# One compile cache for every step: the grad check compiles flex once, the benchmarks reuse it.
export TORCHINDUCTOR_CACHE_DIR="$PARTS/inductor" TRITON_CACHE_DIR="$PARTS/triton"
export TOKENIZERS_PARALLELISM=false
SITE="$PARTS/site"
"$PY" benchmarks/gpu_env.py --wheels .gpu_wheels --site "$SITE" --json "$PARTS/env.json" \
    2> "$PARTS/env.log"
echo "env: exit $? (missing modules, if any, in env.log)" >&2
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

# step NAME SECONDS CMD...: run with a time limit; stdout+stderr and the status go to $PARTS.
step() {
    local name="$1" limit="$2"
    shift 2
    local t0=$(date +%s)
    local left=$(( BUDGET - (t0 - START) ))
    (( limit > left )) && limit=$left
    if (( limit < 20 )); then
        echo 124 > "$PARTS/$name.rc"; echo 0 > "$PARTS/$name.s"
        echo "skipped: the check's time budget is spent" > "$PARTS/$name.log"
        echo "$name: skipped (budget)" >&2
        return
    fi
    timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$PARTS/$name.log" 2>&1
    echo $? > "$PARTS/$name.rc"
    echo $(( $(date +%s) - t0 )) > "$PARTS/$name.s"
    echo "$name: exit $(cat "$PARTS/$name.rc") in $(cat "$PARTS/$name.s") s" >&2
}


if [[ "$SMALL" == 1 ]]; then
    DEVICE=cpu
    SHAPE=(--preset tiny --device cpu --screen 200x100 --max-pixels 65536 --images 1
           --samples-per-pack 3 --text 150 --answer 50 --peak-tflops 1)
    BENCH=(--steps 1 --warmup 1)
    COMPARE=("${SHAPE[@]}")
    BACKENDS=(sdpa)            # flex has no CPU backward; its forward is compared above
    PYTEST=(tests/train/test_train_attention.py -k "block_mask or resolve")
else
    DEVICE=cuda
    # Qwen3-VL-8B: 2 samples per 16k-token pack, 4 screenshots of 1920x1080 at the default frame
    # (1,008 tokens each) and 3,800 text tokens per sample, 1,500 of them supervised.
    SHAPE=(--preset 8b --device cuda --samples-per-pack 2 --images 4 --text 3800 --answer 1500)
    BENCH=(--steps 4 --warmup 2)
    COMPARE=("${SHAPE[@]}" --layers 2)
    BACKENDS=(sdpa flex)
    "$PY" -c "import flash_attn" 2> /dev/null && BACKENDS+=(flash_attention_2)
    PYTEST=(-m gpu tests/train/test_train_gpu.py tests/train/test_train_attention.py
            tests/hivig/test_backends_transformers.py)
fi

# pytest: the gpu-marked tests (on CPU the CPU-runnable attention tests); exit 0 is a pass.
step pytest 100 "$PY" -m pytest -q -p no:cacheprovider "${PYTEST[@]}"
step compare 70 "$PY" benchmarks/bench_train_gpu.py --compare-attention "${COMPARE[@]}" \
    --json "$PARTS/compare.json"
step grad_check 100 "$PY" benchmarks/bench_train_gpu.py --grad-check "${SHAPE[@]}" \
    --json "$PARTS/grad_check.json"
for attn in "${BACKENDS[@]}"; do
    step "bench_$attn" 90 "$PY" benchmarks/bench_train_gpu.py "${SHAPE[@]}" "${BENCH[@]}" \
        --attn "$attn" --json "$PARTS/bench_$attn.json"
done
if [[ "$SMALL" != 1 ]]; then
    step bench_flex_ckpt_half 70 "$PY" benchmarks/bench_train_gpu.py "${SHAPE[@]}" \
        "${BENCH[@]}" --attn flex --checkpoint-layers 0.5 --json "$PARTS/bench_flex_ckpt_half.json"
fi

"$PY" - "$PARTS" "$OUT/gpu_check.json" "$START" <<'PY'
import json, re, sys, time
from pathlib import Path

parts, target, start = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])


def read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail(path, n=40):
    return path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []


steps = {}
for rc in sorted(parts.glob("*.rc"), key=lambda p: p.stat().st_mtime):
    name = rc.stem
    code = int(rc.read_text())
    result = read_json(parts / f"{name}.json")
    if name == "pytest":
        # pytest has no result file: exit 0 with at least one test run (all skipped is a fail:
        # on a GPU machine it means CUDA was not seen).
        ran = re.findall(r"(\d+) passed", "\n".join(tail(parts / "pytest.log")))
        passed = code == 0 and bool(ran) and int(ran[-1]) > 0
    else:
        passed = code == 0 and isinstance(result, dict) and result.get("pass") is True
    steps[name] = {
        "pass": passed,
        "exit": code,
        "seconds": int((parts / f"{name}.s").read_text()),
        "result": result,
        "log_tail": tail(parts / f"{name}.log"),
    }
env = read_json(parts / "env.json") or {"error": tail(parts / "env.log"), "pass": False}
report = {
    "pass": bool(env.get("pass")) and bool(steps) and all(s["pass"] for s in steps.values()),
    "env": env,
    "total_seconds": int(time.time()) - start,
    "steps": steps,
}
target.write_text(json.dumps(report, indent=2))
verdicts = ", ".join(f"{k} {'pass' if v['pass'] else 'FAIL'}" for k, v in steps.items())
print(f"wrote {target}: {'PASS' if report['pass'] else 'FAIL'} (env {'pass' if env.get('pass') else 'FAIL'}, {verdicts})")
sys.exit(0 if report["pass"] else 1)
PY
