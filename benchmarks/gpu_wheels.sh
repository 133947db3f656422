#!/bin/bash
# Download the wheels the GPU check needs beyond the device image (torch, transformers, accelerate,
# peft and their own dependencies) into .gpu_wheels/ (git-ignored), for the CPythons the image may
# run (3.10-3.12; 3.13 as well does not fit), and refuse a set over the device's 64 MiB carry limit:
#
#   bash benchmarks/gpu_wheels.sh                    # then: carry .gpu_wheels with the check
#   PYTHONS="3.11 3.12" bash benchmarks/gpu_wheels.sh
#   TORCHVISION=0.26.0 bash benchmarks/gpu_wheels.sh  # the release that matches the image's torch
#
# Pure-Python wheels are fetched once; compiled ones once per Python version. benchmarks/gpu_check.sh
# installs them one by one and reports any it could not install or any module still missing.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${DEST:-.gpu_wheels}"
PYTHONS="${PYTHONS:-3.10 3.11 3.12}"
# torchvision must be the release built against the image's torch (2.11 -> 0.26): Qwen3-VL's
# processor needs it, and a mismatched one fails at import.
TORCHVISION="${TORCHVISION:-0.26.0}"
LIMIT_MIB="${LIMIT_MIB:-60}"   # the device carries 64 MiB in all; leave room for the tree
PY="${PYTHON:-python3}"
# What the GPU-path code and its tests import beyond the image: pytest (and its two own
# dependencies, and two more on 3.10), Pillow (images, the tiny processor), OmegaConf (configs), orjson and simplejpeg
# (hivig.backends), isal (fast PNG levels), torchvision (the Qwen3-VL processor) and dashscope
# (only for the Qwen BPE ranks it ships); pygments and packaging, which pytest imports, are carried
# too rather than assumed from the image.
PURE=(pytest pluggy iniconfig exceptiongroup tomli pygments packaging omegaconf dashscope)
SDIST_ONLY=(antlr4-python3-runtime==4.9.3)
COMPILED=(pillow orjson simplejpeg isal "torchvision==$TORCHVISION")

mkdir -p "$DEST"
# Pure-Python wheels as such (py3-none-any): a package that also ships compiled builds (tomli's
# mypyc wheels are for one CPython each) must not be fetched as the host's compiled one.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$DEST" \
    --python-version 3.10 --implementation py --abi none --platform any "${PURE[@]}"
# `pip wheel`: antlr4-python3-runtime 4.9.3 (the one OmegaConf accepts) ships as a source archive
# only; it is pure Python, so the wheel built here installs on any version.
"$PY" -m pip wheel --quiet --no-deps -w "$DEST" "${SDIST_ONLY[@]}"
for v in $PYTHONS; do
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$DEST" \
        --python-version "$v" --implementation cp --abi "cp${v/./}" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 "${COMPILED[@]}"
done
size=$(du -sm "$DEST" | cut -f1)
echo "$(ls "$DEST"/*.whl | wc -l) wheels, ${size} MiB in $DEST"
if (( size > LIMIT_MIB )); then
    echo "error: $DEST holds ${size} MiB, over ${LIMIT_MIB} MiB; drop a Python version (PYTHONS=...)" >&2
    exit 2
fi
