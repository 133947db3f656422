"""Strict JSON decoding for tool-call and AndroidWorld bodies.

``json.loads`` accepts ``NaN``/``Infinity`` and silently keeps the last of duplicated keys, so
``{"coordinate": [1, 2], "coordinate": [3, 4]}`` would bind one parameter twice without notice.
Both are rejected here with a typed error.
"""

from __future__ import annotations

import json
from typing import Any

from hivig.actions.model import ActionError


class _DuplicateKey(ValueError):
    """A JSON object names one key twice."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(f"key {key!r} given twice")
        obj[key] = value
    return obj


def loads(text: str, what: str) -> Any | ActionError:
    """Decode strict JSON, or return an ``ActionError``.

    Args:
        text: The JSON text.
        what: What the text is, for messages (``"tool call"``, ``"action"``).

    Returns:
        The decoded value; ``bad_argument`` for a duplicated object key, ``bad_syntax`` for
        anything else that is not strict JSON (including ``NaN``/``Infinity``). Never raises.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        return ActionError("bad_argument", f"{what}: {exc}")
    except (ValueError, RecursionError) as exc:
        return ActionError("bad_syntax", f"{what} is not strict JSON: {exc}")


MAX_OBJECT_STARTS = 256
"""Open braces tried by ``decode_objects``; bounds the work on hostile text (each try can scan
to the end of the text when a string never closes)."""


def decode_objects(text: str, limit: int = MAX_OBJECT_STARTS) -> list[Any]:
    """Every strict-JSON object embedded in free text, in order of appearance.

    Decoding is tried at each ``{`` not inside an object already decoded, so prose around the
    JSON, a doubled opening brace (``{{"name": ...}``) and a stray closing brace are skipped.

    Args:
        text: Text that may hold JSON objects among other characters.
        limit: Most ``{`` positions tried.

    Returns:
        The decoded objects (dicts only). Never raises.
    """
    decoder = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    found: list[Any] = []
    pos = 0
    for _ in range(limit):
        start = text.find("{", pos)
        if start < 0:
            break
        try:
            obj, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            pos = start + 1
            continue
        if isinstance(obj, dict):
            found.append(obj)
        pos = end
    return found
