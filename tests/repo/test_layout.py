"""The one dependency rule: stages never import each other; hivig never imports a stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("data_gen", "train", "serve")
PACKAGES = ("hivig",) + STAGES


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_forbidden_imports(package):
    forbidden = set(STAGES) - {package}
    offenders = []
    for path in _modules(package):
        bad = _imported_top_levels(path) & forbidden
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, "\n".join(offenders)


def test_rule_detects_a_violation(tmp_path):
    # Negative control: the walker must see both import forms.
    bad = tmp_path / "bad.py"
    bad.write_text("import train.sft\nfrom serve.app import x\n", encoding="utf-8")
    assert {"train", "serve"} <= _imported_top_levels(bad)


def test_no_print_in_library_code():
    offenders = []
    for package in PACKAGES:
        for path in _modules(package):
            if path.name in ("cli.py", "_cli.py", "__main__.py"):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "print"
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_library_code_does_not_import_the_test_fixtures():
    # hivig.tiny builds random models and offline tokenizers for tests and the demo; a
    # library default that reaches it would train or serve a fixture silently.
    offenders = [
        str(path.relative_to(ROOT))
        for path in _modules("hivig")
        if path.name != "testing.py" and "hivig.tiny" in _imported_modules(path)
    ]
    assert not offenders, offenders


def test_the_train_cli_and_recipe_do_not_import_each_other():
    # The CLI dispatches to the recipe; the recipe is importable (and runnable) on its own.
    assert not {"train.cli", "train.__main__"} & _imported_modules(ROOT / "train" / "sft.py")
    assert "train.sft" in _imported_modules(ROOT / "train" / "cli.py")


def test_the_real_tokenizer_fixture_lives_with_the_other_fixtures():
    text = (ROOT / "hivig" / "tiny.py").read_text(encoding="utf-8")
    assert "def qwen_tokenizer(" in text and "def tiny_processor(" in text
    stray = [
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in _modules(package)
        if p.name != "tiny.py" and "qwen.tiktoken" in p.read_text(encoding="utf-8")
    ]
    assert not stray, stray


def test_code_cites_only_documents_in_the_repository():
    """No section-sign pointers into design notes a reader of the repository does not have."""
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for top in (
            "hivig",
            "data_gen",
            "train",
            "serve",
            "benchmarks",
            "tests",
            "configs",
            "slurm",
        )
        for pattern in ("*.py", "*.yaml", "*.sbatch", "*.sh")
        for path in (ROOT / top).rglob(pattern)
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "\u00a7" in line
    ]
    assert offenders == []


def test_test_doubles_live_with_the_tests():
    """The library ships no fakes: the scripted servers and gateway helpers are in tests/fakes."""
    library = [p for package in PACKAGES for p in _modules(package)]
    assert not [p for p in library if p.name in ("testing.py", "scripted_server.py")]
    for path in library:
        assert "tests." not in "".join(
            line
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith(("import ", "from "))
        ), path


def test_the_gateway_starts_without_torch_or_omegaconf():
    """``import serve.app`` (the OpenAI-backend gateway) loads neither: 139 MB resident at start
    instead of 809 MB. torch loads with the first screenshot resized to the canonical frame."""
    import subprocess
    import sys

    code = (
        "import sys, serve.app, serve.__main__; "
        "print(sorted(m for m in ('torch', 'omegaconf', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_module_imports_a_private_name_of_another():
    # What another module uses has a public name (benchmarks/arch_metrics.py counts the cases).
    import subprocess
    import sys

    script = ROOT / "benchmarks" / "arch_metrics.py"
    out = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "private cross-module imports: 0\n" in out.stdout, out.stdout


def test_the_private_import_count_sees_a_violation(tmp_path):
    # Negative control: a tree with one such import is counted.
    import subprocess
    import sys

    (tmp_path / "hivig").mkdir()
    (tmp_path / "hivig" / "a.py").write_text("from hivig.b import _helper\n", encoding="utf-8")
    script = ROOT / "benchmarks" / "arch_metrics.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True
    )
    assert "private cross-module imports: 1\n" in out.stdout, out.stdout


def test_the_private_import_count_refuses_a_folder_that_is_no_checkout(tmp_path):
    import subprocess
    import sys

    script = ROOT / "benchmarks" / "arch_metrics.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 2 and "pass a checkout" in out.stderr and not out.stdout
