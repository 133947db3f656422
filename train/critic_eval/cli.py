"""Command line of the offline critic evaluation: flags → ``CriticEvalConfig`` → ``run``.

python -m train.critic_eval --data DATA --backend oracle --out DIR
python -m train evaluate --data DATA --compare transformers:CKPT_A transformers:CKPT_B --out DIR

Exit status: 0 done, 1 a backend answered no request at all, 2 a user error (one line on
stderr, no traceback).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from hivig.config import ConfigError
from hivig.logging import configure_logging
from train.critic_eval.config import CriticEvalConfig, CriticEvalError
from train.critic_eval.runner import run


def _parser() -> argparse.ArgumentParser:
    # Flags left out stay out of the namespace, so the defaults are CriticEvalConfig's alone.
    p = argparse.ArgumentParser(
        prog="python -m train evaluate",
        description="Offline critic benchmark on held-out critique and history samples "
        "(also `python -m train.critic_eval`). Metric definitions: docs/evaluation.md.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--data", required=True, help="data_gen output folder, records folder or shards")
    p.add_argument("--split", help="split to score (default: test for dataset folders)")
    p.add_argument(
        "--backend",
        action="append",
        metavar="SPEC",
        help="oracle | transformers:CKPT_DIR | openai:URL[@MODEL]; repeat to compare",
    )
    p.add_argument("--compare", nargs=2, metavar="SPEC", help="two backends side by side")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--limit", type=int, help="score at most N records (0: all)")
    p.add_argument("--max-tokens", type=int, help="new tokens per answer")
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--seed", type=int, help="sampling seed")
    p.add_argument("--concurrency", type=int, help="requests in flight per backend")
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        metavar="TIMEOUT",
        type=float,
        help="HTTP request timeout (s)",
    )
    p.add_argument("--min-pixels", type=int, help="frame lower bound (0: checkpoint's)")
    p.add_argument("--max-pixels", type=int, help="frame upper bound (0: checkpoint's)")
    p.add_argument("--image-root", help="override of the records' image root")
    p.add_argument("--device", help="device of in-process models (default: auto)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tqdm bars on stderr (default: when stderr is a terminal)",
    )
    return p


def build_config(args: argparse.Namespace) -> CriticEvalConfig:
    """The config the parsed flags describe (``--progress`` is display, not a run setting).

    Raises:
        ConfigError: A value out of range or no backend named; the message names the flag.
    """
    given = {k: v for k, v in vars(args).items() if k != "progress"}
    backends = [*given.pop("backend", []), *given.pop("compare", [])]
    return CriticEvalConfig(backends=backends, **given)


def main(argv: list[str] | None = None) -> int:
    """``python -m train.critic_eval`` / ``python -m train evaluate``.

    Returns:
        0 on success, 1 when a backend answered no request at all, 2 on a user mistake.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    configure_logging()
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    command = "python -m train.critic_eval " + shlex.join(argv)
    try:
        return run(build_config(args), command=command, progress=progress)
    except (ConfigError, CriticEvalError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
