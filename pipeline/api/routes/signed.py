"""Signed webhooks' bodies: the signature over method, path and raw body, refusing a replay, then
the body parsed; and their OpenAPI description (the signature headers, the body's schema)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ValidationError

from pipeline.api import webhooks
from pipeline.api.base import describe_validation
from pipeline.api.replays import first_delivery
from pipeline.api.storable import unstorable_request
from pipeline.delivery import signatures
from pipeline.errors import Invalid, Malformed, Unauthenticated, Unavailable


def _signed_parameters(secret_variable: str, *, bearer_too: bool) -> dict[str, Any]:
    # The event webhook needs only its signature; an approval also needs the approver's token.
    security: dict[str, Any] = {} if bearer_too else {"security": []}
    return {
        **security,
        "parameters": [
            {"name": signatures.TIMESTAMP_HEADER, "in": "header", "required": True,
             "schema": {"type": "string"}, "description": "Unix seconds; at most 5 minutes off."},
            {"name": signatures.SIGNATURE_HEADER, "in": "header", "required": True,
             "schema": {"type": "string"},
             "description": f"v2=<hex HMAC-SHA256({secret_variable}, "
                            'f"{timestamp}\\n{METHOD}\\n{path}\\n" + raw body)>; each '
                            "signature is accepted once."},
        ],
    }  # fmt: skip


async def signed_body(
    request: Request,
    model: type[BaseModel],
    secret: str | None,
    variable: str,
    credential: str | None = None,
) -> Any:
    """Verify the signature over the method, path and raw body, refuse a replay (of this
    signature with this credential), then judge and parse the body (the body guard leaves
    signed requests to this, so that one proving no one is a 401 whatever it holds). Raises
    Unavailable (no secret), Unauthenticated (BadSignature, a replay), Malformed or Invalid."""
    if secret is None:
        raise Unavailable(f"this webhook is disabled: {variable} is not set")
    raw = await request.body()
    digest = signatures.verify(
        secret,
        request.headers.get(signatures.TIMESTAMP_HEADER),
        request.headers.get(signatures.SIGNATURE_HEADER),
        request.method,
        request.scope["path"],  # percent-decoded, as routed: %3A and : sign the same
        raw,
    )
    key = webhooks.replay_key(digest, credential)
    if not await run_in_threadpool(first_delivery, key, signatures.TOLERANCE_SECONDS):
        raise Unauthenticated(
            "this signed request was already received (a replay); sign each delivery anew, "
            "with its own timestamp",
        )
    unstorable = unstorable_request(request.scope, raw)
    if unstorable is not None:
        raise unstorable
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Malformed(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # Python's parser recurses once per level: 100,000 [ end it
        raise Malformed("the request body is not valid JSON: it is nested too deeply") from None
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        problems = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise Invalid(describe_validation(problems)) from None


def openapi_extra(model: type[BaseModel], secret_variable: str, bearer_too: bool) -> dict[str, Any]:
    body = {"content": {"application/json": {"schema": model.model_json_schema()}}}
    signed = _signed_parameters(secret_variable, bearer_too=bearer_too)
    return {**signed, "requestBody": {"required": True, **body}}
