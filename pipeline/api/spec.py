"""The OpenAPI document as the server behaves, and the docs pages behind the same sign-in.

FastAPI describes the happy path; this adds every error status each route answers, with the
`{"error": ...}` body (the error handlers in pipeline/api/base.py answer all of them that way),
names the registered agents, and says what PostgreSQL cannot store (NUL characters). Swagger
UI's assets come from the swagger-ui-bundle package, not a CDN.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from pipeline.api import pages
from pipeline.api.auth import caller
from pipeline.registry import registry

ERROR_BODY = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "What went wrong, in one line."}},
}
_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
NO_NUL = "^[^\\x00]*$"
"""PostgreSQL text cannot hold U+0000: such a value is refused (422), never stored."""

WHY = {
    400: "The body is not valid JSON, or Content-Length is not a number.",
    401: "The credential (bearer token, or a webhook's signature) is missing or wrong.",
    403: "The caller is not among the action's approvers.",
    404: "Nothing has that id, key or name.",
    409: "A conflict: the key already names something different, a different decision was "
    "already made, or a run-id prefix names several runs.",
    413: "The body (or the run's input) is larger than the limit.",
    422: "A parameter or the body is invalid; the message names which.",
    503: "Cannot answer now: the webhook's secret is not set, or (health) the database or the "
    "broker does not answer.",
}

# Statuses beyond the rules in `_statuses` (credential, body, parameters), by operation.
ROUTE_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/runs"): (409,),
    ("get", "/runs/{run_id}"): (404, 409),
    ("post", "/runs/{run_id}/cancel"): (404, 409),
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
        if not _signed_in(request):
            return JSONResponse(
                {"error": "a valid bearer token or a status-page session is required"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return JSONResponse(document(app))

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> Response:
        if not _signed_in(request):
            return RedirectResponse("/ui/login", status_code=303)
        page: HTMLResponse = get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="nightshift API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/ui/static/favicon.svg",
        )
        return page


def _signed_in(request: Request) -> bool:
    """A credential the API accepts, or the browser's status-page session."""
    header = request.headers.get("authorization", "")
    bearer = header[7:].strip() if header[:7].lower() == "bearer " else None
    client = request.client.host if request.client else None
    if caller(request.app.state.config, request.headers, client, bearer) is not None:
        return True
    return pages.signed_in(request)


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
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    _name_the_agents(components)
    for (method, path), operation in _operations(schema):
        for status in _statuses(method, path, operation):
            operation["responses"][str(status)] = {"description": WHY[status], "content": _ERROR}
        for parameter in operation.get("parameters", []):
            _no_nul(parameter.get("schema", {}))
    for component in components.values():
        _no_nul(component)
    return schema


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
        statuses |= {400, 413, 422}
    if operation.get("parameters") or "requestBody" in operation:
        statuses.add(422)
    return sorted(statuses)


def _name_the_agents(components: dict[str, Any]) -> None:
    names = sorted(registry().agents)
    agent = components.get("StartRun", {}).get("properties", {}).get("agent")
    if agent is not None:
        agent["enum"] = names
        agent["description"] = (
            "A registered agent (`nightshift agents` lists them; here: " + ", ".join(names) + ")"
        )


def _no_nul(schema: dict[str, Any]) -> None:
    """Every free text the server stores refuses NUL; say so where the schema has text."""
    text = schema.get("type") == "string" and not {"pattern", "enum"} & schema.keys()
    if text and schema.get("format") not in ("uuid", "date-time", "date", "binary"):
        schema["pattern"] = NO_NUL
    for child in schema.get("properties", {}).values():
        _no_nul(child)
    for key in ("anyOf", "oneOf", "allOf"):
        for child in schema.get(key, []):
            _no_nul(child)
    if isinstance(schema.get("items"), dict):
        _no_nul(schema["items"])
