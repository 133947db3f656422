"""Ground truth of history samples: did the screen change, by the pixels and by the words.

A history sample's real transition comes from its two screenshots (``true_transitions``); a
``Last Action Result`` sentence, the label's or a backend's, is classified by
``transition_class``. Both rules are documented in ``docs/evaluation.md``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from hivig.records import SFTRecord
from hivig.vision import ImageError, exact_fingerprint, load_image

CHANGED = "changed"
NO_CHANGE = "no_change"
TRANSITIONS: tuple[str, ...] = (CHANGED, NO_CHANGE)

# Text in quotes is the step's own intent or a UI label ("'Keep unchanged' was clicked") and
# says nothing about the result, so it is removed before the result is classified.
_QUOTED = re.compile(r"(?<!\w)'.*?'(?!\w)|\"[^\"]*\"|“[^”]*”|‘[^’]*’")
_NO_CHANGE = re.compile(
    r"\bno\s+(?:visible\s+|observable\s+|apparent\s+|noticeable\s+)?"
    r"(?:change|changes|effect|response|reaction|difference)\b"
    r"|\b(?:did|does|do)\s*(?:not|n't)\s+(?:visibly\s+)?"
    r"(?:change|respond|react|happen|take\s+effect|have\s+(?:any|an|a\s+visible)\s+effect)\b"
    r"|\bunchanged\b"
    r"|\b(?:remain|remains|remained|stay|stays|stayed)\s+(?:visually\s+)?"
    r"(?:the\s+same|as\s+(?:it\s+was|before)|identical)\b"
    r"|\bnothing\s+(?:happened|changed|visible\s+changed)\b"
    r"|\bsilent(?:ly)?\s+fail",
    re.IGNORECASE,
)


def transition_class(last_result: str) -> str:
    """``no_change`` when a ``Last Action Result`` says the screen did not change, else ``changed``.

    The rule (documented in ``docs/evaluation.md``): quoted text is dropped, then the result is
    ``no_change`` when it contains a no-effect phrase (``no visible change``, ``did not
    respond``, ``unchanged``, ``remained the same``, ``nothing happened``, ``silently failed``,
    ...), and ``changed`` otherwise.

    Args:
        last_result: The ``Last Action Result:`` field of a history answer.

    Returns:
        ``changed`` or ``no_change``.
    """
    return NO_CHANGE if _NO_CHANGE.search(_QUOTED.sub(" ", last_result)) else CHANGED


def _resolve(ref_path: str, image_root: Path) -> Path:
    path = Path(ref_path)
    return path if path.is_absolute() else image_root / path


def _fingerprint(path: Path) -> str | ImageError:
    try:
        return exact_fingerprint(load_image(path))
    except ImageError as e:
        return e


def true_transitions(
    records: Sequence[SFTRecord], image_root: Path, *, progress: bool = False
) -> tuple[dict[str, str | None], dict[str, str]]:
    """The real transition of each history sample, and the records whose images are unreadable.

    A history sample shows the screen before (first image) and after (second image) the step;
    the transition is ``no_change`` when both decode to identical pixels (same size, same RGB
    values: ``hivig.vision.exact_fingerprint``), else ``changed``. Every image of every record is
    decoded once here, so a record with a missing or corrupt screenshot is left out for all
    backends alike instead of counting against the ones that look at images.

    Args:
        records: The records to score.
        image_root: Where relative image paths resolve.
        progress: Show a tqdm bar (stderr).

    Returns:
        ``(transitions, skipped)``: record id → transition (``None`` for critique samples), and
        record id → ``image_<reason>`` for the records to leave out.
    """
    paths = sorted({ref.path for record in records for ref in record.images})
    # Decoding is most of the cost and PIL releases the GIL while it decodes.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests_of = pool.map(lambda p: _fingerprint(_resolve(p, image_root)), paths)
        bar = tqdm(digests_of, total=len(paths), desc="images", unit="image", disable=not progress)
        prints = dict(zip(paths, bar, strict=True))
    transitions: dict[str, str | None] = {}
    skipped: dict[str, str] = {}
    for record in records:
        digests = [prints[ref.path] for ref in record.images]
        bad = next((d for d in digests if isinstance(d, ImageError)), None)
        if bad is not None:
            skipped[record.id] = f"image_{bad.reason}"
            continue
        if record.kind == "history":
            if len(digests) < 2:
                skipped[record.id] = "history_without_two_images"
                continue
            transitions[record.id] = NO_CHANGE if digests[0] == digests[-1] else CHANGED
        else:
            transitions[record.id] = None
    return transitions, skipped
