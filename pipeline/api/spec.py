"""The OpenAPI document as the server behaves, and the docs pages behind the same sign-in.

FastAPI describes the happy path; this adds every error status each route answers, with the
`{"error": ...}` body (the error handlers in pipeline/api/base.py answer all of them that way),
gives `POST /runs` one body per registered agent with that agent's own input schema and the
deadline and notify_url the route takes, and says what PostgreSQL cannot store (NUL
characters). Swagger UI's assets come from the swagger-ui-bundle package, not a CDN.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from pipeline.api import pages
from pipeline.api.base import refusal
from pipeline.api.guards import BearerRequired
from pipeline.registry import registry
from pipeline.runs.deadlines import MAX_DEADLINE, duration_pattern
from pipeline.settings import get_settings

ERROR_BODY = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "What went wrong, in one line."}},
}
_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
NO_NUL = "^[^\\x00]*$"
"""PostgreSQL text cannot hold U+0000: such a value is refused (422), never stored."""
_SCHEMAS = "#/components/schemas/"
_ADMITS_ANY = re.compile(r"\.|\[\^|\\[SWDP]")
r"""A pattern with `.`, `[^...]`, `\S`, `\W`, `\D` or `\P{...}` may admit a NUL."""
JSON_VALUE = {
    "description": "Any JSON value with no NUL (U+0000) in its text, keys included.",
    "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": {"$ref": f"{_SCHEMAS}JsonValue"}},
        {
            "type": "object",
            "additionalProperties": {"$ref": f"{_SCHEMAS}JsonValue"},
            "propertyNames": {"pattern": NO_NUL},
        },
    ],
}

WHY = {
    400: "The body is not valid JSON, or Content-Length is not a number.",
    401: "The credential (bearer token, or a webhook's signature) is missing or wrong.",
    403: "The caller is not among the action's approvers.",
    404: "Nothing has that id, key or name.",
    409: "A conflict: the key already names something different, a different decision was "
    "already made, a run-id prefix names several runs, or (retry) the run is not failed or "
    "cancelled.",
    408: "The body did not arrive whole in time (NIGHTSHIFT_API_BODY_SECONDS).",
    413: "The body (or the run's input) is larger than the limit.",
    422: "A parameter or the body is invalid; the message names which.",
    503: "Cannot answer now: the webhook's secret is not set, (health) the database or the "
    "broker does not answer, or (a body with no valid credential) too many such bodies are "
    "being read already.",
}

# Statuses beyond the rules in `_statuses` (credential, body, parameters), by operation.
ROUTE_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/runs"): (409,),
    ("get", "/runs/{run_id}"): (404, 409),
    ("post", "/runs/{run_id}/cancel"): (404, 409),
    ("post", "/runs/{run_id}/retry"): (404, 409),
    ("get", "/runs/{run_id}/events"): (404, 409),
    ("get", "/batches/{batch_id}"): (404,),
    ("get", "/batches/{batch_id}/events"): (404,),
    ("post", "/approvals/{action_key}"): (401, 403, 404, 409, 503),
    ("post", "/events/{source}"): (401, 404, 409, 503),
    ("get", "/healthz"): (503,),
}


def install(app: FastAPI) -> None:
    """`/openapi.json` and `/docs` for signed-in callers only (a bearer token, or a status-page
    session for the browser), and Swagger UI's own files served from this server."""
    app.mount("/docs/static", StaticFiles(directory=str(swagger_ui_path)), name="docs-static")
    app.openapi = lambda: document(app)  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> Response:
        if not pages.proves_someone(request):
            return refusal(
                BearerRequired("a valid bearer token or a status-page session is required")
            )
        return JSONResponse(document(app))

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> Response:
        if not pages.proves_someone(request):
            return RedirectResponse("/ui/login", status_code=303)
        page: HTMLResponse = get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="nightshift API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/ui/static/favicon.svg",
        )
        return page


def document(app: FastAPI) -> dict[str, Any]:
    """The schema, built once per app: FastAPI's, with what the server really answers."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        app.openapi_schema = complete(schema)
    return app.openapi_schema


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorBody"] = ERROR_BODY
    components["JsonValue"] = JSON_VALUE
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    _start_run_bodies(components)
    for (method, path), operation in _operations(schema):
        for status in _statuses(method, path, operation):
            operation["responses"][str(status)] = {"description": WHY[status], "content": _ERROR}
        for parameter in operation.get("parameters", []):
            parameter["schema"] = _present(parameter.get("schema", {}))
            _no_nul(parameter["schema"])
    for component in components.values():
        _no_nul(component)
    _link_started_runs(schema["paths"]["/runs"]["post"]["responses"])
    return schema


RUN_LINKS = {
    "GetRun": "#/paths/~1runs~1{run_id}/get",
    "CancelRun": "#/paths/~1runs~1{run_id}~1cancel/post",
    "RunEvents": "#/paths/~1runs~1{run_id}~1events/get",
}
"""What a started run's id opens (a run just started has no artifact yet)."""


def _link_started_runs(responses: dict[str, Any]) -> None:
    """OpenAPI links from `POST /runs` to the operations on the run it answers with."""
    links = {
        name: {"operationRef": ref, "parameters": {"run_id": "$response.body#/run_id"}}
        for name, ref in RUN_LINKS.items()
    }
    for status in ("200", "201"):
        responses[status]["links"] = links


def _operations(schema: dict[str, Any]) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "responses" in operation:
                # FastAPI writes `{batch_id:path}` as `{batch_id}`.
                yield (method, path.replace(":path", "")), operation


def _statuses(method: str, path: str, operation: dict[str, Any]) -> list[int]:
    statuses = set(ROUTE_STATUSES.get((method, path), ()))
    if operation.get("security"):  # the bearer token (or the metrics token)
        statuses.add(401)
    if "requestBody" in operation:
        statuses |= {400, 408, 413, 422, 503}
    if operation.get("parameters") or "requestBody" in operation:
        statuses.add(422)
    return sorted(statuses)


def _present(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without FastAPI's `null` for an optional one: a parameter is absent
    or a string, and a client that sent null would send the text "null"."""
    kept = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(kept) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**kept[0], **rest}


def _start_run_bodies(components: dict[str, Any]) -> None:
    """`StartRun` as the route takes it: one body per registered agent (`StartRun.<agent>`),
    whose input is the agent's own input schema, which the route checks the input against.
    Its deadline lists the forms every value of which the server takes (seconds, a duration):
    an ISO-8601 time is taken too, within 366 days ahead, which JSON Schema cannot say (a
    past one would be schema-valid and refused), so the description says it. What the schema
    still cannot say: that the input fits NIGHTSHIFT_MAX_INPUT_BYTES (413), and, with
    NIGHTSHIFT_NOTIFY_SECRET set, whether a notify_url's host resolves to an address
    NIGHTSHIFT_NOTIFY_ALLOWED allows."""
    generic = components.pop("StartRun")["properties"]
    shared = {
        "deadline": {
            **copy.deepcopy(_DEADLINE),
            "description": generic["deadline"]["description"],
            "examples": generic["deadline"]["examples"],
        },
        "notify_url": _notify_url(generic["notify_url"]),
    }
    agents = registry()
    names = sorted(agents.agents)
    for name in names:
        where = f"StartRun.{name}"
        agent_input = _relocated(agents.agent(name).input_schema, f"{_SCHEMAS}{where}")
        components[where] = {
            "title": f"StartRun ({name})",
            "type": "object",
            "properties": {"agent": {"const": name}, "input": agent_input, **shared},
            "required": ["agent", "input"],
            "additionalProperties": False,
        }
    components["StartRun"] = {
        "title": "StartRun",
        "description": "A run of a registered agent (`nightshift agents` lists them; here: "
        + ", ".join(names)
        + ") with the input its input schema takes.",
        "oneOf": [{"$ref": f"{_SCHEMAS}StartRun.{name}"} for name in names],
        "discriminator": {
            "propertyName": "agent",
            "mapping": {name: f"{_SCHEMAS}StartRun.{name}" for name in names},
        },
    }


_DEADLINE = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DEADLINE.total_seconds()},
        {"type": "string", "pattern": duration_pattern()},
        {"type": "null"},
    ]
}


def _notify_url(declared: dict[str, Any]) -> dict[str, Any]:
    """A URL only where the server can sign the events it POSTs there."""
    if get_settings().notify_secret is None:
        return {
            "type": "null",
            "description": "Not taken here: the server has no NIGHTSHIFT_NOTIFY_SECRET to sign "
            "the events with.",
        }
    return {
        "type": "string",
        "maxLength": 2000,
        "pattern": "^[hH][tT][tT][pP][sS]?://[^/?#@\\s]+([/?#][^\\s]*)?$",
        "description": declared["description"] + " Its host must resolve to an address "
        "NIGHTSHIFT_NOTIFY_ALLOWED allows (public ones by default).",
    }


def _relocated(schema: Any, where: str) -> Any:
    """A copy of an agent's JSON Schema (or a part of it) to sit at `where` in this document:
    its own references (`#/$defs/...`) point into it there."""
    if isinstance(schema, dict):
        moved = {k: _relocated(v, where) for k, v in schema.items() if k not in ("$id", "$schema")}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            moved["$ref"] = f"{where}/properties/input{ref[1:]}"
        return moved
    if isinstance(schema, list):
        return [_relocated(item, where) for item in schema]
    return schema


def _no_nul(schema: dict[str, Any]) -> None:
    """Every free text the server stores refuses NUL; say so where the schema has text, and
    where it takes any JSON (an object's other properties, an array's items)."""
    text = schema.get("type") == "string" and not {"enum", "const"} & schema.keys()
    if text and schema.get("format") not in ("uuid", "date-time", "date", "binary"):
        pattern = schema.get("pattern")
        if pattern is None:
            schema["pattern"] = NO_NUL
        elif pattern != NO_NUL and _ADMITS_ANY.search(pattern):  # e.g. an address's [^@\s]+
            schema.setdefault("allOf", []).append({"pattern": NO_NUL})
    free_form = schema.get("additionalProperties", "properties" not in schema) is True
    if schema.get("type") == "object" and free_form:
        schema["additionalProperties"] = {"$ref": f"{_SCHEMAS}JsonValue"}
        schema.setdefault("propertyNames", {"pattern": NO_NUL})
    if schema.get("type") == "array" and "items" not in schema and "prefixItems" not in schema:
        schema["items"] = {"$ref": f"{_SCHEMAS}JsonValue"}
    for child in schema.get("properties", {}).values():
        _no_nul(child)
    for key in ("anyOf", "oneOf", "allOf"):
        for child in schema.get(key, []):
            _no_nul(child)
    for key in ("items", "additionalProperties", "$defs"):
        child = schema.get(key)
        if isinstance(child, dict):
            for each in child.values() if key == "$defs" else (child,):
                _no_nul(each)
