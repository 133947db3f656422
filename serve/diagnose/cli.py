"""Command line of the diagnoser: ``python -m serve.diagnose PATH --out DIR``.

``add_cli(subparsers)`` adds the same options as a ``diagnose`` subcommand of another parser
(``python -m serve diagnose ...``); its handler is stored as the ``handler`` default.

Exit status: 0 on success, 2 on a user mistake (bad path, bad option), printed as one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2

EXAMPLES = """examples:
  python -m serve.diagnose results/pyautogui/screenshot/model/chrome/TASK_ID --out diag/
  python -m serve.diagnose STATE_DIR/traces/SESSION.jsonl --out diag/ --backend none
  python -m serve.diagnose WAA_RESULTS/.../TASK_ID --out diag/            # WindowsAgentArena
  python -m serve.diagnose logs/evaluation/NAME/TASK_TIMESTAMP --out diag/  # AndroidLab
  python -m serve.diagnose results/EXP/TASK --out diag/                   # WebArenaLiteV2
  python -m serve.diagnose trajectories.jsonl --images-root CORPUS --out diag/ \\
      --backend openai:http://localhost:8000/v1@hivig-critic --top-k 5
"""


class BackendSpecError(ValueError):
    """A ``--backend`` value is malformed."""


def parse_backend_spec(spec: str) -> tuple[str, str, str]:
    """Split ``none``, ``transformers:CKPT`` or ``openai:URL@MODEL`` into ``(kind, where, model)``.

    Raises:
        BackendSpecError: Any other form.
    """
    if spec == "none":
        return "none", "", ""
    kind, sep, rest = spec.partition(":")
    if kind == "transformers" and sep and rest:
        return kind, "", rest
    if kind == "openai" and sep and "@" in rest:
        url, _, model = rest.rpartition("@")
        if url and model:
            return kind, url, model
    raise BackendSpecError(
        f"--backend {spec!r}: expected none, transformers:CHECKPOINT or openai:URL@MODEL"
    )


def _build_backend(spec: str) -> Any:
    from hivig.backends import SyncBackend, build_backend
    from hivig.config import BackendConfig

    kind, url, model = parse_backend_spec(spec)
    if kind == "none":
        return None
    if kind == "transformers" and not Path(model).is_dir():
        raise BackendSpecError(f"--backend transformers:{model}: no checkpoint folder there")
    cfg = BackendConfig(kind=kind, base_url=url, model=model)
    return SyncBackend(build_backend(cfg))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The diagnoser's options, on any parser."""
    p.add_argument(
        "path",
        help="trace .jsonl, a result folder (OSWorld, WindowsAgentArena, AndroidLab, "
        "WebArenaLiteV2 task), or trajectories .jsonl",
    )
    p.add_argument("--out", required=True, help="output folder (diagnosis.json, .html, images/)")
    p.add_argument(
        "--backend",
        default="none",
        help="none (default), transformers:CHECKPOINT or openai:URL@MODEL",
    )
    p.add_argument("--top-k", type=int, default=3, help="candidates to inspect (default 3)")
    p.add_argument("--images-root", help="corpus root of an ingested trajectories file")
    p.add_argument("--trajectory", help="id of the trajectory to diagnose in a trajectories file")
    p.add_argument("--max-tokens", type=int, default=1024, help="critic answer budget (tokens)")
    p.add_argument(
        "--no-history", action="store_true", help="skip the history task on before/after pairs"
    )


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``diagnose`` subcommand to an ``argparse`` subparsers object.

    Args:
        subparsers: The object ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The new parser; ``args.handler(args)`` runs it and returns the exit status.
    """
    p = subparsers.add_parser(
        "diagnose",
        help="root-cause diagnosis of a failed trajectory",
        description="Find the step that made a run fail: cheap signals, then the critic.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(handler=run_args)
    return p


def _fail(message: str) -> int:
    print(f"diagnose: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _unwritable(out: Path) -> str | None:
    """Why ``out`` cannot take the outputs (checked before any work), or ``None``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"--out {out} is not writable ({e.strerror or e}); pass a folder you can write to"
    return None


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def run_args(args: argparse.Namespace) -> int:
    """Run a diagnosis from parsed arguments; prints a short summary and returns the status."""
    from hivig.backends import BackendError, Sampling
    from hivig.config import ConfigError
    from hivig.logging import configure_logging
    from serve.diagnose.loaders import DiagnoseInputError
    from serve.diagnose.pipeline import diagnose

    configure_logging()
    if args.top_k < 1:
        return _fail(f"--top-k must be at least 1, got {args.top_k}")
    if args.max_tokens < 1:
        return _fail(f"--max-tokens must be at least 1, got {args.max_tokens}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return _fail(f"--out {out} exists and is not a folder")
    unwritable = _unwritable(out)
    if unwritable is not None:
        return _fail(unwritable)
    try:
        backend = _build_backend(args.backend)
    except (BackendSpecError, ConfigError) as e:
        return _fail(str(e))
    except (OSError, ValueError) as e:  # an unreadable or incompatible checkpoint
        return _fail(f"cannot load the backend {args.backend}: {e}".splitlines()[0])
    try:
        result = diagnose(
            args.path,
            backend=backend,
            top_k=args.top_k,
            out_dir=out,
            images_root=args.images_root,
            trajectory_id=args.trajectory,
            sampling=Sampling(max_tokens=args.max_tokens),
            use_history=not args.no_history,
        )
    except DiagnoseInputError as e:
        return _fail(str(e))
    except BackendError as e:
        return _fail(f"backend failed: {e}".splitlines()[0])
    except OSError as e:
        # Writing the outputs failed after the check above passed (the folder changed since).
        if e.filename is None or not _inside(Path(e.filename), out):
            raise
        return _fail(f"cannot write {e.filename}: {e.strerror}; pass a folder you can write to")
    finally:
        if backend is not None:
            backend.close()
    if result.root_cause_step is None and result.method == "run_succeeded":
        print("the run succeeded: no root-cause step")
        print(f"wrote {out / 'diagnosis.json'} and {out / 'diagnosis.html'}")
        return 0
    err = result.error
    label = f"{err['l1']}/{err['l2']}" if err["l2"] else "unknown"
    dim = f" ({err['hivig_dimension']})" if err["hivig_dimension"] else ""
    print(
        f"root cause: step {result.root_cause_step}, {label}{dim}, confidence "
        f"{result.confidence:.2f} via {result.method}; candidates {result.candidates_considered}"
    )
    print(f"wrote {out / 'diagnosis.json'} and {out / 'diagnosis.html'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The stand-alone parser of ``python -m serve.diagnose``."""
    p = argparse.ArgumentParser(
        prog="python -m serve.diagnose",
        description="Find the step that made a run fail: cheap signals, then the critic.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m serve.diagnose``; returns the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_args(args)
