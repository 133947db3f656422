"""Merge LoRA adapters into the base weights for serving (vLLM serves a plain checkpoint).

python -m train merge-lora --adapter runs/lora/final --out runs/lora/merged
"""

from __future__ import annotations

from pathlib import Path

import torch

from hivig.checkpoint_files import write_reader_compat
from hivig.logging import get_logger
from hivig.models.qwen_vl import load_model
from hivig.profiles import CHECKPOINT_PROFILE_DIR, checkpoint_profile

log = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def merge_lora(adapter: str | Path, out: str | Path, *, base: str | Path, dtype: str) -> Path:
    """Load ``base``, apply the adapter in ``adapter``, merge, save model then processor.

    Args:
        adapter: Directory written by a LoRA run's final save (adapter + processor).
        out: Directory for the merged checkpoint.
        base: Base checkpoint the adapter was trained on.
        dtype: Parameter dtype of the merged weights.

    Returns:
        ``out``.
    """
    from peft import PeftModel
    from transformers import AutoProcessor

    out = Path(out)
    model = load_model(base, dtype=_DTYPES[dtype], attn_implementation="sdpa")
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    # Processor last: its files (chat template, pixel budget) must be the ones left on disk.
    AutoProcessor.from_pretrained(str(adapter)).save_pretrained(out)
    write_reader_compat(out)  # vLLM builds on transformers 4.57 read these forms
    trained = checkpoint_profile(adapter)
    if trained is not None:  # the merged model speaks the interface the adapter learnt
        trained.write(out / CHECKPOINT_PROFILE_DIR)
    log.info("merged %s into %s -> %s", adapter, base, out)
    return out
