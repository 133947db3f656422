"""The wheels the GPU check carries install and import on every CPython the device image may run.

The device image's Python is not known in advance (3.10, 3.11 or 3.12): ``benchmarks/gpu_wheels.sh``
must carry pure-Python wheels as such (a compiled ``tomli`` built for 3.11 only left pytest
unable to read ``pyproject.toml`` on 3.10) and each compiled one for every version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("3.10", "3.11", "3.12")
CARRIED = (
    "pytest", "pluggy", "iniconfig", "exceptiongroup", "tomli", "pygments", "packaging",
    "omegaconf", "antlr4-python3-runtime", "pillow", "orjson", "simplejpeg", "isal",
)  # fmt: skip
IMPORTS = "import pytest, tomli, omegaconf, PIL.Image, orjson, simplejpeg, isal.isal_zlib"


def _interpreter(version: str) -> str | None:
    """A working ``python{version}``: on PATH, or one of pyenv's installed versions."""
    home = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = [shutil.which(f"python{version}")]
    found += [str(p) for p in sorted(home.glob(f"versions/{version}.*/bin/python{version}"))]
    for python in filter(None, found):
        if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    built = ROOT / ".gpu_wheels"
    if list(built.glob("tomli-*-py3-none-any.whl")):
        return built  # make test-all builds it first
    dest = tmp_path_factory.mktemp("gpu_wheels")
    env = {**os.environ, "DEST": str(dest), "PYTHON": sys.executable}
    run = subprocess.run(
        ["bash", "benchmarks/gpu_wheels.sh"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return dest


def test_pure_python_packages_are_carried_as_pure_wheels(wheels):
    for name in ("pytest", "pluggy", "iniconfig", "exceptiongroup", "tomli", "omegaconf"):
        found = sorted(wheels.glob(f"{name}-*.whl"))
        assert found, f"{name} is not carried"
        assert all(w.name.endswith("-py3-none-any.whl") for w in found), [w.name for w in found]
    for wheel in wheels.glob("*-py3-none-any.whl"):  # really pure: no extension inside
        with zipfile.ZipFile(wheel) as z:
            assert not [n for n in z.namelist() if n.endswith((".so", ".pyd"))], wheel.name


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_the_carried_wheels_install_and_import_on_each_python(wheels, version, tmp_path):
    python = _interpreter(version)
    if python is None:
        if os.environ.get("CI"):
            pytest.fail(f"python{version} is missing: the CI machine must run this check")
        pytest.skip(f"python{version} is not installed here")
    venv = tmp_path / "image"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    # numpy, typing-extensions and PyYAML come with torch and transformers in the image; the
    # rest only from the carried set.
    image = ["numpy", "typing-extensions", "pyyaml"]
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", *image], check=True, timeout=300,
        capture_output=True,
    )  # fmt: skip
    install = subprocess.run(
        [py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links",
         str(wheels), *CARRIED], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-2000:]
    run = subprocess.run(
        [py, "-c", f"{IMPORTS}; tomli.load(open('pyproject.toml', 'rb'))"], cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    # pytest reads the project's configuration from pyproject.toml on start.
    collect = subprocess.run(
        [py, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "benchmarks/gpu_env.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "pyproject.toml" not in collect.stderr and "tomli" not in collect.stderr, collect.stderr
    assert collect.returncode in (0, 5), collect.stdout[-2000:] + collect.stderr[-2000:]
