"""What answers the prompts: the oracle (a record's own target) or an inference backend.

Every predictor answers one record at a time and reports failures as ``Answer.error``, never
as an exception, so a failed request counts against its backend instead of stopping the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from hivig.backends import (
    BackendError,
    InferenceBackend,
    Sampling,
    close_backend,
    split_reasoning,
)
from hivig.config import FrameConfig
from hivig.logging import get_logger
from hivig.records import SFTRecord, record_messages
from hivig.vision import CANONICAL, FramePolicy, ImageError, materialise

log = get_logger(__name__)


@dataclass(frozen=True)
class Answer:
    """One backend answer, or why there is none.

    Attributes:
        text: The answer with the reasoning split off (``""`` on failure).
        reasoning: The reasoning, ``None`` when there was none.
        error: ``None``, or ``backend_<reason>`` / ``image_<reason>`` when no answer came back.
        finish_reason: ``stop``, ``length``, ... (``""`` on failure).
        latency_s: Seconds the answer took.
        completion_tokens: Generated tokens (0 when not reported).
    """

    text: str
    reasoning: str | None = None
    error: str | None = None
    finish_reason: str = "stop"
    latency_s: float = 0.0
    completion_tokens: int = 0


class Predictor(Protocol):
    """Answers one record's prompt; ``name`` labels it in the outputs."""

    name: str

    async def predict(self, record: SFTRecord) -> Answer:
        """The answer to ``record``'s prompt (failures as ``Answer.error``, never raised)."""
        ...

    async def aclose(self) -> None:
        """Release what the predictor holds."""
        ...


class OraclePredictor:
    """Replays each record's own target: the reference that must score 100 %.

    The target goes through the backends' reasoning split (``split_reasoning``) and then the same
    parsing and scoring as any model answer, so a metric it does not get right is a bug in the
    benchmark or a label that contradicts the data.
    """

    def __init__(self, name: str = "oracle") -> None:
        self.name = name

    async def predict(self, record: SFTRecord) -> Answer:
        """The record's target as an answer."""
        reasoning, text = split_reasoning(record.target)
        return Answer(text=text, reasoning=reasoning)

    async def aclose(self) -> None:
        """Nothing to release."""


class BackendPredictor:
    """Answers with an ``InferenceBackend`` on the prompt training and serving use.

    Args:
        backend: The backend (HTTP client or in-process model).
        sampling: Sampling parameters sent with every request.
        frame: Canonical-frame budget the images are resized to.
        image_root: Where relative image paths resolve.
        name: Label in the outputs.
        policy: The frame policy of the records' profile.
    """

    def __init__(
        self,
        backend: InferenceBackend,
        sampling: Sampling,
        frame: FrameConfig,
        image_root: Path,
        name: str,
        policy: FramePolicy = CANONICAL,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.sampling = sampling
        self.frame = frame
        self.image_root = image_root
        self.name = name

    def _messages(self, record: SFTRecord) -> list[Any]:
        f = self.frame
        prompt = record_messages(record)[:-1]  # system + user; the target is the answer key
        return materialise(
            prompt,
            self.image_root,
            min_pixels=f.min_pixels,
            max_pixels=f.max_pixels,
            factor=f.factor,
            policy=self.policy,
        )

    async def predict(self, record: SFTRecord) -> Answer:
        """Materialise the frames (in a thread), generate, and report failures as errors."""
        start = time.perf_counter()
        try:
            messages = await asyncio.to_thread(self._messages, record)
        except ImageError as e:
            return Answer("", error=f"image_{e.reason}", finish_reason="")
        try:
            gen = await self.backend.generate(messages, self.sampling)
        except BackendError as e:
            log.debug("%s: %s failed: %s", self.name, record.id, e)
            return Answer(
                "",
                error=f"backend_{e.reason}",
                finish_reason="",
                latency_s=time.perf_counter() - start,
            )
        return Answer(
            text=gen.text,
            reasoning=gen.reasoning,
            finish_reason=gen.finish_reason,
            latency_s=gen.latency_s,
            completion_tokens=gen.usage.completion_tokens,
        )

    async def aclose(self) -> None:
        """Close the backend if it holds connections."""
        await close_backend(self.backend)


async def predict_all(
    predictor: Predictor,
    records: Sequence[SFTRecord],
    *,
    concurrency: int = 8,
    progress: bool = False,
) -> list[Answer]:
    """Answer every record with at most ``concurrency`` requests in flight, in record order."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(records), desc=predictor.name, unit="sample", disable=not progress)

    async def one(record: SFTRecord) -> Answer:
        async with gate:
            answer = await predictor.predict(record)
        bar.update(1)
        return answer

    try:
        return list(await asyncio.gather(*(one(r) for r in records)))
    finally:
        bar.close()
