#!/bin/bash
# One-GPU check of the training stage, under 8 minutes on one H200; writes one JSON file:
#   1. `pytest -m gpu` on the training and backend GPU tests,
#   2. packed-attention equality on a 2-layer Qwen3-VL-8B shape: the last hidden states of one
#      packed row under every available backend (sdpa, flex, flash_attention_2 if installed)
#      against each sample alone under SDPA (bf16 tolerance),
#   3. bench_train_gpu.py on the full Qwen3-VL-8B shape per backend: tokens/s/GPU, MFU and
#      peak memory (and a half-checkpointed run under flex).
#
#   bash benchmarks/gpu_check.sh                       # JSON in ./gpu_check_out/gpu_check.json
#   OUT=/tmp/x bash benchmarks/gpu_check.sh
#   GPU_CHECK_SMALL=1 bash benchmarks/gpu_check.sh      # tiny shapes on CPU: the script's own test
#
# It needs torch, transformers, accelerate and pytest, plus this repository's small pure-Python
# dependencies. On an image without them, put wheels in .gpu_wheels/ (ignored by git) first:
#   pip download --no-deps --only-binary=:all: -d .gpu_wheels \
#       omegaconf antlr4-python3-runtime pyyaml dashscope pyarrow
# they are installed into a private folder on PYTHONPATH, never into the image's site-packages.
# No deepspeed, flash-attn, datasets or qwen-vl-utils is needed: the code paths used here do
# not import them (flash_attention_2 is measured only where flash-attn happens to be installed).
set -uo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
SMALL="${GPU_CHECK_SMALL:-0}"
PARTS="$(mktemp -d)"
START=$(date +%s)
BUDGET="${GPU_CHECK_BUDGET:-450}"  # seconds for all steps together (the device allows 8 min)

if compgen -G ".gpu_wheels/*.whl" > /dev/null; then
    SITE="$PARTS/site"
    "$PY" -m pip install --quiet --no-deps --target "$SITE" .gpu_wheels/*.whl \
        > "$PARTS/pip.log" 2>&1 || echo "wheel install failed (see pip.log in the JSON)" >&2
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false

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

"$PY" - > "$PARTS/env.json" 2> "$PARTS/env.log" <<'PY'
import importlib.util, json, platform
import torch, transformers
mods = ["omegaconf", "yaml", "pyarrow", "dashscope", "accelerate", "peft", "flash_attn",
        "deepspeed", "datasets", "qwen_vl_utils"]
print(json.dumps({
    "python": platform.python_version(), "torch": torch.__version__,
    "transformers": transformers.__version__,
    "cuda": torch.cuda.is_available(),
    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    "importable": {m: importlib.util.find_spec(m) is not None for m in mods},
}))
PY

if [[ "$SMALL" == 1 ]]; then
    DEVICE=cpu
    SHAPE=(--preset tiny --device cpu --screen 200x100 --max-pixels 65536 --images 1
           --samples-per-pack 3 --text 150 --answer 50 --peak-tflops 1)
    BENCH=(--steps 1 --warmup 1)
    COMPARE=("${SHAPE[@]}")
    BACKENDS=(sdpa)            # flex has no CPU backward; its forward is compared above
    PYTEST=(tests/test_train_attention.py -k "block_mask or resolve")
else
    DEVICE=cuda
    # Qwen3-VL-8B: 2 samples per 16k-token pack, 4 screenshots of 1920x1080 at the default frame
    # (1,008 tokens each) and 3,800 text tokens per sample, 1,500 of them supervised.
    SHAPE=(--preset 8b --device cuda --samples-per-pack 2 --images 4 --text 3800 --answer 1500)
    BENCH=(--steps 4 --warmup 2)
    COMPARE=("${SHAPE[@]}" --layers 2)
    BACKENDS=(sdpa flex)
    "$PY" -c "import flash_attn" 2> /dev/null && BACKENDS+=(flash_attention_2)
    PYTEST=(-m gpu tests/test_train_gpu.py tests/test_train_attention.py
            tests/test_backends_transformers.py)
fi

step pytest 110 "$PY" -m pytest -q -p no:cacheprovider "${PYTEST[@]}"
step compare 80 "$PY" benchmarks/bench_train_gpu.py --compare-attention "${COMPARE[@]}" \
    --json "$PARTS/compare.json"
for attn in "${BACKENDS[@]}"; do
    step "bench_$attn" 90 "$PY" benchmarks/bench_train_gpu.py "${SHAPE[@]}" "${BENCH[@]}" \
        --attn "$attn" --json "$PARTS/bench_$attn.json"
done
if [[ "$SMALL" != 1 ]]; then
    step bench_flex_ckpt_half 90 "$PY" benchmarks/bench_train_gpu.py "${SHAPE[@]}" \
        "${BENCH[@]}" --attn flex --checkpoint-layers 0.5 --json "$PARTS/bench_flex_ckpt_half.json"
fi

"$PY" - "$PARTS" "$OUT/gpu_check.json" "$START" <<'PY'
import json, sys, time
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
for rc in sorted(parts.glob("*.rc")):
    name = rc.stem
    steps[name] = {
        "exit": int(rc.read_text()),
        "seconds": int((parts / f"{name}.s").read_text()),
        "result": read_json(parts / f"{name}.json"),
        "log_tail": tail(parts / f"{name}.log"),
    }
report = {
    "env": read_json(parts / "env.json") or {"error": tail(parts / "env.log")},
    "total_seconds": int(time.time()) - start,
    "steps": steps,
    "pip_log": tail(parts / "pip.log", 10),
}
target.write_text(json.dumps(report, indent=2))
print(f"wrote {target}: " + ", ".join(f"{k} exit {v['exit']}" for k, v in steps.items()))
PY
