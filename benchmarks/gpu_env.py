"""The GPU check's first step: what the machine is, the carried wheels installed one by one, and
what the check's code still cannot import.

    python benchmarks/gpu_env.py --wheels .gpu_wheels --site /tmp/site --json env.json

Standard library plus ``packaging`` (a transformers dependency) only: it runs before anything
else is importable. A wheel is unpacked into ``--site`` when its tags fit this interpreter
(``packaging.tags``), so one wheel for another Python version, or a broken one, never stops the
others; each wheel's outcome is reported. Exit status 0 when every module the check imports is
importable afterwards, 1 otherwise (the missing ones are named).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

# What the GPU check's code imports beyond the image's torch, transformers, accelerate and peft.
NEEDED = (
    "PIL", "torchvision", "omegaconf", "yaml", "numpy", "pytest", "orjson", "simplejpeg",
    "dashscope",
)  # fmt: skip
RESOURCE_ONLY = {"dashscope": "resources/qwen.tiktoken"}
"""Packages the check needs a file of, not the code (the Qwen BPE ranks)."""
REPORTED = (
    "torch", "torchvision", "transformers", "accelerate", "peft", "triton", "flash-attn",
    "deepspeed",
)  # fmt: skip


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unrunnable: {e}"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else ""


def _gpu() -> dict:
    try:
        import torch
    except ImportError as e:
        return {"error": f"torch: {e}"}
    info: dict = {"cuda": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if info["cuda"]:
        free, total = torch.cuda.mem_get_info()
        info |= {
            "device": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "free_gib": round(free / 2**30, 2),
            "total_gib": round(total / 2**30, 2),
        }
    return info


def environment() -> dict:
    """Versions, compiler and headers (Triton builds its launcher with them), memory, disk."""
    include = Path(sysconfig.get_paths()["include"])
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "versions": {name: _version(name) for name in REPORTED},
        "cc": _first_line(["cc", "--version"]) or _first_line(["gcc", "--version"]),
        "python_headers": (include / "Python.h").is_file(),
        "nvidia_smi": _first_line(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.used", "--format=csv,noheader"]
        ),
        "gpu": _gpu(),
        "disk_free_gib": round(shutil.disk_usage(".").free / 2**30, 1),
    }


def install_wheels(folder: Path, site: Path) -> list[dict]:
    """Unpack into ``site`` every wheel of ``folder`` that fits this interpreter and is missing."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    supported = set(sys_tags())
    site.mkdir(parents=True, exist_ok=True)
    rows = []
    for wheel in sorted(folder.glob("*.whl")):
        row = {"wheel": wheel.name}
        try:
            name, _, _, tags = parse_wheel_filename(wheel.name)
            have = _version(name)
            if have is not None:
                # The image's own copy wins: a carried torchvision is built for torch 2.11 and
                # would shadow a matching one on PYTHONPATH.
                row["status"] = f"skipped: {name} {have} is installed"
            elif not tags & supported:
                row["status"] = "skipped: built for another Python or platform"
            else:
                with zipfile.ZipFile(wheel) as zf:
                    zf.extractall(site)
                row["status"] = "installed"
        except (InvalidWheelFilename, zipfile.BadZipFile, OSError) as e:
            row["status"] = f"failed: {e}"
        rows.append(row)
    return rows


def _import_error(module: str) -> str | None:
    """Why ``module`` does not import here, or ``None``.

    Imported for real, not only found: a torchvision built for another torch is found but
    fails on import ("operator torchvision::nms does not exist").
    """
    spec = importlib.util.find_spec(module)
    if spec is None:
        return "not installed"
    if module in RESOURCE_ONLY:
        # Only a data file is used; importing the package would pull in its HTTP stack.
        folder = Path(next(iter(spec.submodule_search_locations or []), ""))
        found = (folder / RESOURCE_ONLY[module]).is_file()
        return None if found else f"{RESOURCE_ONLY[module]} missing"
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 (reported: the message is the diagnosis)
        return f"{type(e).__name__}: {e}"[:300]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", default=".gpu_wheels", help="folder of carried wheels")
    p.add_argument("--site", required=True, help="private folder the wheels are unpacked into")
    p.add_argument("--json", required=True, help="where the report goes")
    args = p.parse_args(argv)
    report = {"env": environment()}
    folder = Path(args.wheels)
    report["wheels"] = install_wheels(folder, Path(args.site)) if folder.is_dir() else []
    sys.path.insert(0, args.site)
    importlib.invalidate_caches()
    report["missing"] = [f"{m} ({why})" for m in NEEDED if (why := _import_error(m))]
    if report["env"]["gpu"].get("cuda"):
        # Triton compiles a small C launcher for every kernel (flex attention's included).
        if not report["env"]["cc"]:
            report["missing"].append("a C compiler (cc/gcc), which Triton needs")
        if not report["env"]["python_headers"]:
            report["missing"].append("Python.h (python3-dev), which Triton needs")
    report["pass"] = not report["missing"]
    Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    for m in report["missing"]:
        sys.stderr.write(f"missing: {m}; run benchmarks/gpu_wheels.sh and carry .gpu_wheels\n")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
