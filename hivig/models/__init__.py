"""Model-family adapters. Everything Qwen3-VL specific lives in ``hivig.models.qwen_vl``.

Import the family module directly (``from hivig.models import qwen_vl``); this package does not
import transformers on its own, so ``import hivig.models`` stays cheap.
"""
