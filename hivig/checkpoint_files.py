"""A saved checkpoint's files as every reader sees them.

The frame it was trained with, and the files that make it loadable by transformers 4.57 as well
as 5.x.

Training (transformers 5) writes ``processor_config.json`` with the image processor nested under
``image_processor``, ``extra_special_tokens`` as a list and ``rope_parameters`` in the text
config. Readers built on transformers 4.57 — every vLLM release before 0.19.1 — look for
``preprocessor_config.json``, fail on a list of extra special tokens ("'list' object has no
attribute 'keys'") and read ``rope_scaling``/``rope_theta`` (without them they silently fall back
to the default MRoPE sections). ``write_reader_compat`` adds the 4.57 forms next to the 5.x ones;
transformers 5 keeps reading its own keys, so one folder serves both.

This module imports only the standard library: ``slurm/serve.sbatch`` and the gateway read the
frame without loading torch or transformers.

    hivig checkpoint frame RUN/final         # prints "MIN_PIXELS MAX_PIXELS"
    hivig checkpoint context RUN/final       # prints the context length to serve it with
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
"""Where the image processor's settings live: transformers 5 (nested), then 4.57 (flat)."""


class CheckpointError(ValueError):
    """A checkpoint folder lacks, or holds unreadable, files a reader needs."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from e


def _image_processor(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    nested = obj.get("image_processor")
    return nested if isinstance(nested, dict) else obj


def read_frame(path: str | os.PathLike) -> tuple[int, int]:
    """The pixel budget (min, max) a checkpoint's image processor was saved with.

    Args:
        path: A checkpoint folder written by ``train`` (or any Qwen3-VL checkpoint).

    Returns:
        ``(min_pixels, max_pixels)`` from the processor's ``size`` (``shortest_edge`` and
        ``longest_edge`` are pixel counts for Qwen-VL processors, not edge lengths).

    Raises:
        CheckpointError: No processor file, or one without a numeric ``size``.
    """
    folder = Path(path)
    without_images = []
    for name in PROCESSOR_FILES:
        file = folder / name
        if not file.is_file():
            continue
        obj = _read_json(file)
        nested = obj.get("image_processor") if isinstance(obj, dict) else None
        if name == "processor_config.json" and not isinstance(nested, dict):
            without_images.append(name)
            continue  # a processor file without an image processor: the flat file may have it
        size = (_image_processor(obj) or {}).get("size")
        if not isinstance(size, dict):
            raise CheckpointError(f"{file}: the image processor has no `size` entry")
        lo, hi = size.get("shortest_edge"), size.get("longest_edge")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (lo, hi)):
            raise CheckpointError(
                f"{file}: size.shortest_edge/longest_edge must be positive pixel counts, "
                f"got {lo!r}/{hi!r}"
            )
        return lo, hi
    if without_images:
        raise CheckpointError(
            f"{folder}: processor_config.json has no image_processor and there is no "
            "preprocessor_config.json; the checkpoint records no frame"
        )
    raise CheckpointError(
        f"{folder}: no {' or '.join(PROCESSOR_FILES)}; pass a checkpoint folder that train/ "
        "wrote (RUN/final, or RUN/merged after merge-lora)"
    )


SERVE_CONTEXT_CAP = 16_384
"""Longest context the critic needs served (two screenshots, a long trajectory, a Thinking
answer); a checkpoint allowing more is served with this much, so the KV cache is not sized for
a context nothing sends."""


def read_context_length(path: str | os.PathLike, cap: int = SERVE_CONTEXT_CAP) -> int:
    """The context length to serve a checkpoint with: its own limit, at most ``cap``.

    vLLM refuses to start when ``--max-model-len`` exceeds the model's
    ``max_position_embeddings``, so the serving length is read from the checkpoint, never
    hard-coded.

    Args:
        path: A checkpoint folder (its ``config.json``).
        cap: Upper bound on the result.

    Returns:
        ``min(text_config.max_position_embeddings, cap)``.

    Raises:
        CheckpointError: No readable ``config.json``, or one without a positive
            ``max_position_embeddings``.
    """
    file = Path(path) / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{Path(path)}: no config.json; pass a checkpoint folder")
    obj = _read_json(file)
    text = obj.get("text_config") if isinstance(obj, dict) else None
    limit = (text if isinstance(text, dict) else obj).get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise CheckpointError(f"{file}: no positive max_position_embeddings")
    return min(limit, cap)


def _write_json(path: Path, obj: Any) -> None:
    # Not hivig.files.write_atomic: this module runs with the standard library alone (above).
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _legacy_processor_files(folder: Path) -> None:
    nested = folder / "processor_config.json"
    if not nested.is_file():
        return
    obj = _read_json(nested)
    if not isinstance(obj, dict):
        return
    processor_class = obj.get("processor_class")
    for key, name in (
        ("image_processor", "preprocessor_config.json"),
        ("video_processor", "video_preprocessor_config.json"),
    ):
        part = obj.get(key)
        # Rewritten from the nested file every time: a flat file left from an earlier save into
        # the same folder would show 4.57 readers another frame.
        if isinstance(part, dict):
            flat = dict(part)
            if processor_class:
                flat.setdefault("processor_class", processor_class)
            _write_json(folder / name, flat)


def _legacy_special_tokens(obj: dict[str, Any]) -> bool:
    # tokenizer_config.json: 4.57 wants a name -> token mapping under `extra_special_tokens`;
    # both versions read the plain list under the older key.
    extra = obj.get("extra_special_tokens")
    if not isinstance(extra, list):
        return False
    del obj["extra_special_tokens"]
    known = obj.get("additional_special_tokens")
    merged = list(known) if isinstance(known, list) else []
    obj["additional_special_tokens"] = merged + [t for t in extra if t not in merged]
    return True


def _legacy_rope(obj: dict[str, Any]) -> bool:
    # config.json: 4.57 reads the MRoPE sections from `rope_scaling` and the base separately.
    text = obj.get("text_config")
    rope = text.get("rope_parameters") if isinstance(text, dict) else None
    if not isinstance(rope, dict) or "rope_scaling" in text:
        return False
    text["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "rope_theta" in rope:
        text.setdefault("rope_theta", rope["rope_theta"])
    return True


def _update(file: Path, change: Callable[[dict[str, Any]], bool]) -> None:
    """Apply ``change`` to a JSON object file; rewrite it only when something changed."""
    if not file.is_file():
        return
    obj = _read_json(file)
    if isinstance(obj, dict) and change(obj):
        _write_json(file, obj)


def write_reader_compat(path: str | os.PathLike) -> None:
    """Add the transformers-4.57 forms of a saved checkpoint's files next to the 5.x ones.

    Idempotent; the flat processor files always follow the nested one. Call it after the model
    and processor are saved.

    Args:
        path: The checkpoint folder.

    Raises:
        CheckpointError: A file there is not valid JSON.
    """
    folder = Path(path)
    _legacy_processor_files(folder)
    _update(folder / "tokenizer_config.json", _legacy_special_tokens)
    _update(folder / "config.json", _legacy_rope)
