"""JSON on hot paths (the gateway, the OpenAI transport): orjson, behind two functions.

Every gateway request parses one body and writes a session document, a stored response, a trace
line, the response itself and a model request body; with the standard library's encoder that
was the largest fixed cost of a step. orjson is strict where the gateway wants strictness anyway:
``NaN``, ``Infinity``, numbers that overflow a double and lone surrogates are not JSON and are
rejected on input. Output is compact UTF-8 (no ASCII escapes), as ``json.dumps(...,
ensure_ascii=False, separators=(",", ":"))`` writes it.
"""

from __future__ import annotations

from typing import Any

import orjson

# numpy scalars and arrays are written as their values, as the standard library writes a
# numpy float (a float subclass); other numpy values it refused.
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY

JSONDecodeError = orjson.JSONDecodeError
"""Raised by ``loads`` (a ``ValueError`` and a ``json.JSONDecodeError``)."""


def dumps(obj: Any, *, default: Any = None) -> bytes:
    """UTF-8 JSON bytes of ``obj``, compact; ``default`` maps values JSON has no form for."""
    return orjson.dumps(obj, default=default, option=_OPTIONS)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value of a JSON text.

    Raises:
        JSONDecodeError: Not JSON (including ``NaN``, infinities and invalid UTF-8).
    """
    return orjson.loads(data)
