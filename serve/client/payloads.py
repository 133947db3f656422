"""Request bodies: the image and action fields, the session body, and what makes them sendable."""

from __future__ import annotations

import base64
import logging
import numbers
from dataclasses import replace
from typing import Any

from serve.client.transport import Call

# One logger for the whole client package: runners set its level under one name.
log = logging.getLogger("serve.client")

ImageInput = bytes | str
"""PNG/JPEG bytes, a base64 string (``data:`` URL prefix allowed) or an ``image_ref``."""

ActionInput = dict[str, Any] | str
"""An API action object, or the policy's raw action text."""

# 413: the next resend shrinks the image by this factor per side.
_SHRINK = 0.5


def image_field(image: ImageInput) -> dict[str, str]:
    """The API image field for bytes, a base64 string or an ``image_ref``."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return {"screenshot": base64.b64encode(bytes(image)).decode("ascii")}
    if isinstance(image, str) and image.startswith("sha256:"):
        return {"image_ref": image}
    return {"screenshot": str(image)}


def shrunk(image: ImageInput) -> bytes | None:
    """The screenshot at half size as PNG, for one resend after 413; ``None`` if impossible."""
    if not isinstance(image, (bytes, bytearray, memoryview)):
        return None
    try:
        # Deferred: the image stack is only needed on this rare path.
        from hivig.vision import encode_png, load_image

        img = load_image(bytes(image))
        w, h = max(1, int(img.width * _SHRINK)), max(1, int(img.height * _SHRINK))
        return encode_png(img.resize((w, h)))
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot shrink", fail open
        log.warning("cannot shrink the screenshot for resend: %s", exc)
        return None


def action_field(action: ActionInput, action_format: str = "auto") -> dict[str, Any]:
    """An API action object: dicts pass through, text becomes ``{"raw", "format"}``."""
    if isinstance(action, dict):
        return action
    return {"raw": str(action), "format": action_format}


def session_body(
    task: str,
    platform: str,
    screen: tuple[int, int] | dict[str, int],
    coord_space: str,
    frame: tuple[int, int] | dict[str, int] | None,
    action_format: str,
    policy_id: str | None,
    volatile_regions: list[list[int]] | None,
) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body of ``CriticClient.start``'s arguments."""

    def size(value: Any) -> dict[str, int]:
        if isinstance(value, dict):
            return {"w": int(value["w"]), "h": int(value["h"])}
        return {"w": int(value[0]), "h": int(value[1])}

    body: dict[str, Any] = {
        "task": task,
        "platform": platform,
        "screen": size(screen),
        "coord_space": coord_space,
        "action_format": action_format,
    }
    if frame is not None:
        body["frame"] = size(frame)
    if policy_id is not None:
        body["policy_id"] = policy_id
    if volatile_regions:
        body["volatile_regions"] = [list(r) for r in volatile_regions]
    return body


def sendable(call: Call) -> Call:
    """``call`` without private keys (``_image``: the caller's original screenshot) and with a
    JSON-safe body (numpy scalars from an adapter's action become Python numbers)."""
    if not call.body:
        return call
    body = {k: v for k, v in call.body.items() if not k.startswith("_")}
    return replace(call, body=json_safe(body))


def json_safe(value: Any) -> Any:
    """``value`` with numpy-style scalars and arrays turned into Python numbers and lists.

    Anything else is left alone (the HTTP layer reports what still cannot be encoded).
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    tolist = getattr(value, "tolist", None)  # numpy bool_, arrays and other scalars
    if callable(tolist):
        try:
            return json_safe(tolist())
        except Exception:  # noqa: BLE001 - not numpy after all: leave it to the encoder
            return value
    return value
