"""Linear-time scanning for ``<tag>...</tag>`` blocks in model output (case-insensitive tags).

A lazy regex such as ``<tag>(.*?)</tag>`` rescans the rest of the text from every unclosed open
tag, which is quadratic on hostile input (thousands of ``<tool_call>`` with no close take
seconds). These helpers use ``str.find`` over an ASCII-lower-cased copy instead: every character
is looked at a bounded number of times.
"""

from __future__ import annotations

# Only ASCII letters are folded, so the copy has the same length as the text and indices found in
# it are valid in the original (``str.lower`` can lengthen a string, e.g. U+0130).
_ASCII_LOWER = {code: code + 32 for code in range(ord("A"), ord("Z") + 1)}


def _tags(tag: str) -> tuple[str, str]:
    return f"<{tag.lower()}>", f"</{tag.lower()}>"


def first_block(text: str, tag: str) -> str | None:
    """The body of the first ``<tag>...</tag>`` block, or ``None`` when there is none.

    Args:
        text: Text to scan.
        tag: ASCII tag name, e.g. ``"action"``; matched case-insensitively.

    Returns:
        The text between the first open tag and the first close tag after it.
    """
    low = text.translate(_ASCII_LOWER)
    open_tag, close_tag = _tags(tag)
    start = low.find(open_tag)
    if start < 0:
        return None
    start += len(open_tag)
    end = low.find(close_tag, start)
    return None if end < 0 else text[start:end]


def all_blocks(text: str, tag: str) -> tuple[list[str], bool]:
    """Bodies of every ``<tag>...</tag>`` block in order, and whether the blocks are well formed.

    Close tags outside any block are ignored. A block is malformed when its open tag has no close
    tag, or when a second open tag appears before the close (the first block never ends).

    Args:
        text: Text to scan.
        tag: ASCII tag name, e.g. ``"tool_call"``; matched case-insensitively.

    Returns:
        ``(bodies, well_formed)``; scanning stops at the first malformed block.
    """
    low = text.translate(_ASCII_LOWER)
    open_tag, close_tag = _tags(tag)
    bodies: list[str] = []
    pos = 0
    while (start := low.find(open_tag, pos)) >= 0:
        start += len(open_tag)
        end = low.find(close_tag, start)
        if end < 0 or low.find(open_tag, start, end) >= 0:
            return bodies, False
        bodies.append(text[start:end])
        pos = end + len(close_tag)
    return bodies, True
