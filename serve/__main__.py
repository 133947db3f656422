"""Run the critic gateway, or diagnose a failed trajectory.

    python -m serve --config configs/serve/local.yaml model=runs/demo/train/final port=8080
    python -m serve --config configs/serve/vllm.yaml model=hivig-critic backend.base_url=http://gpu:8000/v1
    python -m serve --config configs/serve/local.yaml --dry-run
    python -m serve diagnose runs/serve/traces/<session>.jsonl --out runs/diagnosis

The gateway listens on ``host:port`` (uvicorn), finishes in-flight requests on SIGTERM/SIGINT
(up to ``graceful_timeout_s``) and keeps sessions in ``sessions.state_dir``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hivig.config import ConfigError, add_config_arguments, config_to_yaml, load_config
from hivig.entry import GATEWAY_IMPORTS, extras_of, prog_name, run_entry
from serve.config import ServeConfig

logger = logging.getLogger("serve")

MODEL_IMPORTS = ("torch", "torchvision", "transformers", "tokenizers", "pyarrow", "isal")
"""Import names only the in-process model (``backend.kind: transformers``) needs: ``serve``."""
EXTRAS = extras_of(
    (GATEWAY_IMPORTS, "gateway"), (MODEL_IMPORTS, "serve"), (("playwright", "matplotlib"), "serve")
)
"""A missing import -> the extra that brings it (the gateway alone needs no torch)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serve",
        description=(
            "Serve the hivig critic over HTTP for agent runners (sessions, observe, critique). "
            "Subcommand: `diagnose TRACE_OR_TRAJECTORY --out DIR` finds the root cause of a "
            "failed episode (see `python -m serve diagnose --help`)."
        ),
        epilog="Overrides for scripts: model=DIR host=H port=N (stable names). Any other "
        "key --dry-run prints takes an override too, e.g. critic.critique_deadline_s=4 "
        "sessions.store=memory.",
    )
    add_config_arguments(parser, example="critic.critique_deadline_s=4")
    return parser


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check(cfg: ServeConfig) -> str | None:
    """A user mistake that would only show once the server runs, as one line; else ``None``."""
    if cfg.backend.kind == "transformers":
        if not cfg.backend.model:
            return "no checkpoint: pass model=DIR (a folder written by `python -m train`)"
        if not Path(cfg.backend.model).is_dir():
            return f"checkpoint folder not found: {cfg.backend.model} (pass model=DIR)"
        if not (Path(cfg.backend.model) / "config.json").is_file():
            return f"{cfg.backend.model} is not a checkpoint (no config.json); pass model=DIR"
        from hivig.checkpoint_files import CheckpointError, read_frame

        try:
            read_frame(cfg.backend.model)
        except CheckpointError as e:
            return f"cannot serve {cfg.backend.model} on the frame it was trained with: {e}"
    if cfg.backend.kind == "openai" and not (cfg.backend.base_url and cfg.backend.model):
        return "the openai backend needs backend.base_url=URL and model=NAME (the served name)"
    if cfg.backend.kind == "offline":
        return "backend.kind offline has no critic to serve; use transformers or openai"
    from hivig.vision import resize_kernel

    try:
        resize_kernel()
    except ValueError as e:
        return str(e)
    if cfg.critic.profile:
        from hivig.profiles import ProfileError, load_profile

        try:
            load_profile(cfg.critic.profile)
        except ProfileError as e:
            return f"critic.profile: {e}"
    problem = _check_profile_fits(cfg)
    if problem:
        return problem
    if cfg.critic.prompt_dir:
        from hivig.prompts import CRITIC_PROMPTS, PromptError, load_prompt_dir

        try:
            load_prompt_dir(cfg.critic.prompt_dir, CRITIC_PROMPTS)
        except PromptError as e:
            return f"critic.prompt_dir: {e}"
    state = Path(cfg.sessions.state_dir)
    try:
        state.mkdir(parents=True, exist_ok=True)
        probe = state / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"sessions.state_dir {state} is not writable ({e.strerror}); pass a writable one"
    return None


def _check_profile_fits(cfg: ServeConfig) -> str | None:
    """The checkpoint served must be served with the profile it was trained with."""
    checkpoint = cfg.backend.model if cfg.backend.kind == "transformers" else cfg.critic.checkpoint
    if not checkpoint or cfg.critic.allow_profile_mismatch:
        return None
    from hivig.profiles import ProfileError, check_served_profile, resolve_profile

    try:
        check_served_profile(checkpoint, resolve_profile(cfg.critic.profile))
    except ProfileError as e:
        return str(e)
    return None


def _check_store(cfg: ServeConfig) -> str | None:
    """Open the session store once before serving: a corrupt one is moved aside here (one
    WARNING line); one that cannot be opened is one line, not a start-up traceback."""
    from serve.errors import StorageError
    from serve.sessions import open_store

    try:
        open_store(cfg.sessions.store, cfg.sessions.state_dir).close()
    except StorageError as e:
        return f"{e} (check sessions.state_dir, or move the file aside)"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m serve`` and ``hivig-serve``; returns the exit status.

    Without the gateway's stack (a runner's venv) the command says which extra to install.
    """
    return run_entry(prog_name("python -m serve"), _main, argv, EXTRAS)


def _main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["diagnose"]:
        from serve.diagnose import main as diagnose_main

        return diagnose_main(args_list[1:])
    args = _parser().parse_args(args_list)
    try:
        cfg = load_config(ServeConfig, args.config, args.overrides)
    except ConfigError as e:
        return _fail(str(e))
    if args.dry_run:
        print(config_to_yaml(cfg), end="")
        return 0
    problem = _check(cfg)
    if problem is not None:
        return _fail(problem)
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get(cfg.auth_token_env):
        print(
            f"warning: listening on {cfg.host} without auth; set {cfg.auth_token_env} to require "
            "a bearer token",
            file=sys.stderr,
        )
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    problem = _check_store(cfg)
    if problem is not None:
        return _fail(problem)

    if cfg.workers > 1:
        from serve.workers import run

        run(cfg)
        return 0

    import uvicorn

    from serve.app import create_app
    from serve.server import GATEWAY_LOOP, http_protocol

    try:
        app = create_app(cfg)
    except ConfigError as e:
        return _fail(str(e))
    uvicorn.run(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        timeout_graceful_shutdown=int(cfg.graceful_timeout_s),
        http=http_protocol(cfg.limits.header_timeout_s),
        loop=GATEWAY_LOOP,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
