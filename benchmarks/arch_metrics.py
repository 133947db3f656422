"""Architecture figures of the tree: files over 800 lines and private names imported across modules.

    python benchmarks/arch_metrics.py [ROOT]

A private cross-module import is ``from m import _name`` with ``m`` another module of the
project, or an import of another package's ``_module`` (``from hivig.vision._png import ...``
outside ``hivig.vision``). Prints both counts and every case.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("hivig", "data_gen", "train", "serve")
LONG = 800


def _private_imports(path: Path, module: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if node.module.split(".")[0] not in PACKAGES:
            continue
        out += [f"from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        parts = node.module.split(".")
        for i, part in enumerate(parts):
            if _private(part):
                owner = ".".join(parts[:i])
                if module != owner and not module.startswith(owner + "."):
                    out.append(f"from {node.module} (a private module of {owner})")
                break
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def main() -> None:
    """Print the figures for the tree at ``ROOT`` (this checkout by default)."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    if not any((root / pkg).is_dir() for pkg in PACKAGES):
        # Counting nothing would print 0 for a mistyped path: say so instead.
        print(f"arch_metrics: {root} holds none of {', '.join(PACKAGES)}; pass a checkout",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    long_files, private = [], []
    for path in sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")):
        rel = path.relative_to(root)
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > LONG:
            long_files.append((lines, str(rel)))
        module = ".".join(rel.with_suffix("").parts)
        private += [f"{rel}: {imp}" for imp in _private_imports(path, module)]
    print(f"files over {LONG} lines: {len(long_files)}")
    for lines, rel in sorted(long_files, reverse=True):
        print(f"  {lines} {rel}")
    print(f"private cross-module imports: {len(private)}")
    for line in private:
        print(f"  {line}")


if __name__ == "__main__":
    main()
