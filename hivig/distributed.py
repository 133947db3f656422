"""Rank and world size from the one reliable source.

Under DeepSpeed on CPU, ``Accelerator().process_index`` reports 0 on every rank,
so anything that shards data or decides "main process" asks here.
"""

from __future__ import annotations

import os


def rank_and_world() -> tuple[int, int]:
    """Return ``(rank, world_size)``: from ``torch.distributed`` when initialised, else the env.

    Returns:
        The global rank and world size; ``(0, 1)`` for a single process.
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # torch is optional for pure-data tools
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
