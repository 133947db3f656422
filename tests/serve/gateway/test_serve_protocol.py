"""The gateway's typed protocol: closed, strict request models, their OpenAPI document, one
error shape on every route, and routes grouped one router per resource."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from serve import protocol
from serve.config import ACTION_FORMATS, COORD_SPACES
from serve.routes import ROUTERS
from tests.fakes.gateway import CLICK, b64, gateway_client, observe, screen, session_body


def _error(r) -> tuple[int, str, str]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return r.status_code, body["error"]["code"], body["error"]["message"]


def _session(c) -> str:
    r = c.post("/v1/sessions", json=session_body())
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def test_the_literals_are_the_configs_names():
    assert get_args(protocol.CoordSpace) == COORD_SPACES
    assert get_args(protocol.ActionFormat) == ACTION_FORMATS


@pytest.mark.parametrize(
    ("route", "body", "unknown"),
    [
        ("/v1/sessions", session_body(colour="blue"), "colour"),
        ("/v1/images", {"image": "", "tags": []}, "tags"),
        ("/v1/diagnose", {"session_id": "x", "why": "curious"}, "why"),
        ("/v1/observe", {**session_body(), "after_ref": "sha256:" + "0" * 64, "x": 1}, "x"),
        ("/v1/critique", {**session_body(), "action": CLICK, "screen_shot": "?"}, "screen_shot"),
    ],
)
def test_an_unknown_field_is_refused_by_name(tmp_path, route, body, unknown):
    with gateway_client(tmp_path) as c:
        status, code, message = _error(c.post(route, json=body))
    assert (status, code) == (422, "bad_request")
    assert message.startswith(f"`{unknown}`: unknown field"), message


def test_unknown_fields_in_session_routes_and_nested_objects_are_refused(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = _session(c)
        r = observe(c, sid, 0, retry=3)
        assert _error(r)[:2] == (422, "bad_request") and "`retry`" in _error(r)[2]
        r = c.post("/v1/sessions", json=session_body(screen={"w": 320, "h": 200, "dpi": 2}))
        assert "`screen.dpi`" in _error(r)[2]
        assert observe(c, sid, 0).status_code == 200
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK, "k": 2})
        assert _error(r)[:2] == (422, "bad_request")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_idx", "0"),  # a string is not coerced to an integer
        ("step_idx", True),  # nor a boolean
        ("step_idx", 0.0),
        ("step_idx", 2**63),  # past int64: refused, not an overflow inside the store
        ("step_idx", -1),
        ("force", "yes"),
    ],
)
def test_wrong_json_types_are_refused_not_coerced(tmp_path, field, value):
    with gateway_client(tmp_path) as c:
        sid = _session(c)
        body: dict[str, Any] = {"step_idx": 0, "screenshot": b64(screen()), field: value}
        r = c.post(f"/v1/sessions/{sid}/observe", json=body)
        assert _error(r)[:2] == (422, "bad_request") and f"`{field}`" in _error(r)[2]


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"session_id": "abc\n"}, "session_id"),  # a newline would name a trace file
        ({"session_id": "../x"}, "session_id"),
        ({"task": "x" * (protocol.MAX_TASK_CHARS + 1)}, "task"),
        ({"task": "   "}, "task"),
        ({"platform": "amiga"}, "platform"),
        ({"screen": {"w": 0, "h": 200}}, "screen.w"),
        ({"screen": {"w": True, "h": 200}}, "screen.w"),
        ({"coord_space": "inches"}, "coord_space"),
        ({"action_format": "cobol"}, "action_format"),
        ({"volatile_regions": [[10, 10, 5, 20]]}, "volatile_regions"),
        ({"volatile_regions": [[0, 0, 1001, 20]]}, "volatile_regions.0.2"),
        ({"policy_id": 7}, "policy_id"),
        ({"echo": {"step_idx": "3"}}, "echo.step_idx"),
        ({"echo": {"screens": {"0": "not-a-ref"}}}, "echo.screens.0"),
    ],
)
def test_session_fields_are_validated_in_the_model(tmp_path, extra, where):
    with gateway_client(tmp_path) as c:
        status, code, message = _error(c.post("/v1/sessions", json=session_body(**extra)))
    assert (status, code) == (422, "bad_request")
    assert f"`{where}`" in message, message


def test_resized_px_needs_its_frame_and_critique_needs_something_to_judge(tmp_path):
    with gateway_client(tmp_path) as c:
        r = c.post("/v1/sessions", json=session_body(coord_space="resized_px"))
        assert _error(r)[:2] == (422, "bad_request") and "`frame`" in _error(r)[2]
        sid = _session(c)
        assert observe(c, sid, 0).status_code == 200
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0})
        assert _error(r)[:2] == (422, "bad_action")
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "candidates": []})
        assert _error(r)[:2] == (422, "bad_action")
        r = c.post("/v1/diagnose", json={})
        assert _error(r)[:2] == (422, "bad_request")


def test_a_newline_in_a_session_path_is_an_unknown_session(tmp_path):
    with gateway_client(tmp_path) as c:
        sid = _session(c)
        r = c.get(f"/v1/sessions/{sid}%0A")
        assert _error(r)[:2] == (404, "unknown_session")


def test_every_route_answers_errors_in_one_shape(tmp_path):
    with gateway_client(tmp_path) as c:
        assert _error(c.get("/v1/nope"))[:2] == (404, "not_found")
        assert _error(c.put("/v1/sessions"))[:2] == (405, "method_not_allowed")
        assert _error(c.post("/v1/sessions", content=b"[1, 2]"))[:2] == (422, "bad_request")
        assert _error(c.post("/v1/images", json={"image": 5}))[:2] == (422, "bad_request")
        assert _error(c.get("/v1/jobs/none"))[:2] == (404, "unknown_job")


def test_the_openapi_document_comes_from_the_models(tmp_path):
    with gateway_client(tmp_path) as c:
        doc = c.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    bodies = {
        ("/v1/sessions", "post"): "SessionCreate",
        ("/v1/sessions/{sid}/observe", "post"): "Observe",
        ("/v1/sessions/{sid}/critique", "post"): "Critique",
        ("/v1/observe", "post"): "ObserveStateless",
        ("/v1/critique", "post"): "CritiqueStateless",
        ("/v1/images", "post"): "ImageUpload",
        ("/v1/diagnose", "post"): "DiagnoseRequest",
    }
    for (path, method), name in bodies.items():
        body = doc["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert schemas[name]["additionalProperties"] is False, name
        assert doc["paths"][path][method]["responses"]["422"]["content"]["application/json"][
            "schema"
        ] == {"$ref": "#/components/schemas/ErrorAnswer"}
    assert "HTTPValidationError" not in schemas  # FastAPI's own error shape is never answered
    assert set(schemas["SessionCreate"]["properties"]["coord_space"]["enum"]) == set(COORD_SPACES)

    def refs(node: Any):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    missing = {r for r in refs(doc) if r.removeprefix("#/components/schemas/") not in schemas}
    assert not missing


def test_one_router_per_resource():
    prefixes = {r.prefix for r in ROUTERS}
    assert prefixes == {"/v1/sessions", "/v1", "/v1/images", ""}
    paths = sorted(route.path for r in ROUTERS for route in r.routes)
    assert "/v1/sessions/{sid}/observe" in paths and "/healthz" in paths
