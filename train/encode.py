"""One sample from record to model tensors: messages → canonical frames → tokens and labels.

The same three shared steps data_gen and serve use (``hivig.records.record_messages``,
``hivig.vision.materialise``, ``hivig.models.qwen_vl.encode_sample``), so the prompt the model
is trained on is byte-identical to the one it is served with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hivig.config import FrameConfig
from hivig.messages import ChatMessage
from hivig.models.qwen_vl import EncodedSample, encode_sample
from hivig.records import SFTRecord, record_messages
from hivig.vision import CANONICAL, FramePolicy, materialise


class RecordEncoder:
    """Picklable callable run in dataloader workers: ``encoder(payload) -> EncodedSample``.

    ``payload`` is an ``SFTRecord`` or a ``(messages, target)`` pair whose messages are the
    system and user turns (image parts as ``ImageRef`` or already-canonical PIL frames).
    """

    def __init__(
        self, processor: Any, frame: FrameConfig, root: str | Path, policy: FramePolicy = CANONICAL
    ):
        self.processor = processor
        self.frame = frame
        self.root = Path(root)
        self.policy = policy

    def prompt_and_target(self, payload: Any) -> tuple[list[ChatMessage], str]:
        """The prompt turns (system, user) and the assistant target of a payload."""
        if isinstance(payload, SFTRecord):
            messages = record_messages(payload)
            if messages[-1].role != "assistant":
                raise ValueError(f"record {payload.id}: last message is not the assistant target")
            return messages[:-1], messages[-1].text()
        messages, target = payload
        return list(messages), str(target)

    def materialise(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        """Canonical frames with markers for every referenced image."""
        f = self.frame
        return materialise(
            list(messages),
            self.root,
            min_pixels=f.min_pixels,
            max_pixels=f.max_pixels,
            factor=f.factor,
            policy=self.policy,
        )

    def __call__(self, payload: Any) -> EncodedSample:
        messages, target = self.prompt_and_target(payload)
        return encode_sample(self.processor, self.materialise(messages), target)
