"""The typed error of sample encoding, shared by the Qwen3-VL modules."""

from __future__ import annotations


class EncodeError(ValueError):
    """A conversation cannot be encoded for the model.

    Attributes:
        reason: Short stable code: ``bad_message``, ``not_materialised``, ``not_canonical``,
            ``special_token_in_text``, ``image_token_mismatch``, ``no_assistant_turn``,
            ``unterminated_answer``, ``label_boundary``, ``prefill_mismatch``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
