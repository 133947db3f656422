"""What the console scripts share: a missing install and an unwritable output as one line.

The stages install as extras (``pyproject.toml``): a runner's venv holds ``hivig[agent]`` only,
and a stage started there would otherwise stop on a ``ModuleNotFoundError`` traceback. Each entry
point names the imports its extras bring (``extras``) and runs through ``run_entry``, which turns
exactly those into one line naming the extra to install (exit 2). Any other missing module is a
bug of ours and keeps its traceback.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

EXIT_USER = 2
"""Exit status of a user mistake (and of a stack that is not installed)."""

DATA_IMPORTS = (
    "torch",
    "pyarrow",
    "orjson",
    "isal",
    "simplejpeg",
    "omegaconf",
    "yaml",
    "tqdm",
    "sklearn",
)
"""Import names of the ``data`` extra (``pyproject.toml``)."""

GATEWAY_IMPORTS = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "pydantic",
    "prometheus_client",
    "orjson",
    "simplejpeg",
    "omegaconf",
    "yaml",
)
"""Import names of the ``gateway`` extra: the gateway without the in-process model (no torch)."""

OPTIONAL = {"tensorboard": "tensorboard", "wandb": "wandb", "flash_attn": "flash-attn"}
"""Import names of the single-purpose extras, whichever stage asks for them."""


def extras_of(*groups: tuple[Iterable[str], str]) -> dict[str, str]:
    """Import name -> extra, earlier groups first (an import in two groups names the first)."""
    table = dict(OPTIONAL)
    for names, extra in reversed(groups):
        table.update(dict.fromkeys(names, extra))
    return table


def missing_stack(prog: str, exc: ModuleNotFoundError, extras: Mapping[str, str]) -> str | None:
    """The one line for a module of ``extras`` that is not installed; ``None`` for any other."""
    name = exc.name or ""
    extra = extras.get(name.split(".")[0])
    if extra is None:
        return None
    return (
        f"{prog}: the {extra!r} extra is not installed here (no module named {name!r}); "
        f'install it: pip install "hivig[{extra}]" (from a checkout: pip install -e ".[{extra}]")'
    )


def run_entry(
    prog: str,
    main: Callable[[list[str] | None], int],
    argv: list[str] | None,
    extras: Mapping[str, str],
) -> int:
    """``main(argv)``, with a missing stack reported as one line on stderr and exit 2."""
    try:
        return main(argv)
    except ModuleNotFoundError as exc:
        line = missing_stack(prog, exc, extras)
        if line is None:
            raise
        sys.stderr.write(line + "\n")
        return EXIT_USER


def unwritable(path: str | Path) -> str | None:
    """Why the folder ``path`` (to be created or filled) cannot be written; ``None`` if it can.

    Tested by writing a temporary file in the folder, or in the nearest existing parent it
    will be created in: what the command will do, whatever refuses it (permissions, a
    read-only mount, an immutable folder, an ACL).
    """
    target = Path(path)
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None:
        return f"no parent folder of {target} exists"
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    return None


def prog_name(module_form: str) -> str:
    """How the user started the command: the console script's name, else ``module_form``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name and not name.endswith(".py") and name != "-c" else module_form
