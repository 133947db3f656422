"""Rank-aware logging: INFO on rank 0, WARNING elsewhere, configured once.

Library code gets its logger with ``get_logger(__name__)`` and never prints.
"""

from __future__ import annotations

import logging
import sys

from hivig.distributed import rank_and_world

_CONFIGURED = False
_FORMAT = "%(asctime)s %(levelname)s [rank%(rank)s] %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record, not at configuration.

    A handler bound to the stream of its day keeps writing to it after it was replaced and
    closed (a test's captured stderr, a redirected CLI), which loses records or raises.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - the stream of the moment
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        del value


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = rank_and_world()[0]
        return True


def configure_logging(level: int | None = None) -> None:
    """Configure the ``hivig`` root handlers once; later calls only adjust the level.

    Args:
        level: Explicit level; by default INFO on rank 0 and WARNING on other ranks.
    """
    global _CONFIGURED
    rank = rank_and_world()[0]
    if level is None:
        level = logging.INFO if rank == 0 else logging.WARNING
    root = logging.getLogger()
    if not _CONFIGURED:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler.addFilter(_RankFilter())
        root.addHandler(handler)
        _CONFIGURED = True
    root.setLevel(level)


def get_logger(name: str) -> logging.Logger:
    """Return the module logger; handlers are attached by ``configure_logging``."""
    return logging.getLogger(name)
