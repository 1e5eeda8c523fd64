"""The JSON API: runs, batches, the signed approval and event webhooks, metrics and health."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

import psycopg
import redis
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.engine import make_url

from models import RunStatus
from pipeline.api import listen, sse, webhooks
from pipeline.api.auth import caller
from pipeline.api.base import ApiConfig, ApiError, describe_validation
from pipeline.api.replays import first_delivery
from pipeline.api.tokens import Authenticated
from pipeline.db import broker_url, database_url
from pipeline.engine import signatures
from pipeline.runs.cancel import cancel_run
from pipeline.runs.deadlines import parse_deadline
from pipeline.runs.decisions import Actor, Seen, decide
from pipeline.runs.events import start_from_event
from pipeline.runs.start import start_run
from pipeline.settings import Settings, get_settings
from pipeline.views.batches import show_batch
from pipeline.views.feed import Subject
from pipeline.views.gauges import DatabaseGauges
from pipeline.views.runs import list_runs, resolve_run_id, show_run

log = logging.getLogger("nightshift.api")
HEALTH_TIMEOUT_SECONDS = 2
"""/healthz answers within a few seconds even when a service's network is gone."""

bearer = HTTPBearer(
    auto_error=False,
    description="A person's token (`nightshift tokens create --for ...`) or NIGHTSHIFT_API_TOKEN.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _config(request: Request) -> ApiConfig:
    config: ApiConfig = request.app.state.config
    return config


def require_caller(request: Request, credentials: Credentials) -> Authenticated:
    """Who the request speaks for (401 if it proves no one); routes record this identity."""
    client = request.client.host if request.client else None
    given = credentials.credentials if credentials else None
    found = caller(_config(request), request.headers, client, given)
    if found is None:
        raise ApiError(
            401,
            "a valid bearer token is required (your own from `nightshift tokens create`, or "
            "NIGHTSHIFT_API_TOKEN)",
            _CHALLENGE,
        )
    return found


Caller = Annotated[Authenticated, Depends(require_caller)]


def require_metrics_token(request: Request, credentials: Credentials) -> None:
    config = _config(request)
    if config.insecure_no_auth:
        return
    if not config.metrics_token_matches(credentials.credentials if credentials else None):
        raise ApiError(
            401,
            "a valid bearer token is required (NIGHTSHIFT_API_TOKEN or NIGHTSHIFT_METRICS_TOKEN)",
            _CHALLENGE,
        )


router = APIRouter()
authed = APIRouter(dependencies=[Depends(require_caller)])


# -- runs and batches -----------------------------------------------------------------------


class ErrorBody(BaseModel):
    error: str = Field(description="What went wrong, in one line.")


def failures(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error statuses a route answers, each with the error body."""
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}


_WHY = {
    401: "The bearer token is missing or wrong.",
    404: "No run or batch has that id.",
    409: "The Idempotency-Key already started a run with a different agent or input.",
    413: "The body or the run's input is larger than the limit.",
    422: "A parameter or the body is invalid (the message names it).",
}


DEADLINE_HELP = (
    "The run must be finished by then, or it stops with reason `deadline` (a waiting run too, "
    "its pending approvals withdrawn): seconds from now, a duration (`90s`, `15m`, `2h`, `1d`) "
    "or an ISO-8601 time with a timezone."
)


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str = Field(min_length=1, max_length=100, examples=["nightly_report"])
    input: dict[str, Any] = Field(examples=[{"team": "ops", "date": "2026-11-29"}])
    deadline: float | str | None = Field(
        default=None, description=DEADLINE_HELP, examples=["2h", 3600, "2026-11-30T06:00:00Z"]
    )

    notify_url: str | None = Field(
        default=None,
        max_length=2000,
        description="POSTed a signed JSON event (run.finished, run.waiting) when the run "
        "finishes or starts waiting for a person; each event once per Idempotency-Key.",
        examples=["https://ops.example.com/hooks/nightshift"],
    )

    @field_validator("deadline", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: object) -> object:
        if isinstance(value, bool):  # pydantic would read true as 1 second
            raise ValueError("must be seconds, a duration or an ISO-8601 time, not a boolean")
        return value


class RunOutcome(BaseModel):
    """Where a run stands: finished (status succeeded, failed or cancelled, with the result or
    the error), waiting (on `waiting_on`, until `wake_at` for a timer) or still running."""

    run_id: uuid.UUID
    status: RunStatus
    stop_reason: str | None
    waiting_on: str | None
    wake_at: str | None
    result: dict[str, Any] | None
    error: str | None
    finished_at: str | None


class Started(BaseModel):
    run_id: uuid.UUID
    created: bool
    """False when the Idempotency-Key named a run that already existed."""
    outcome: RunOutcome | None = None
    """With `?wait=`: the run when it finished or started waiting, or when the wait ended."""


WAIT_HELP = (
    "Wait up to this many seconds (at most 120) for the run to finish or start waiting; no "
    "worker is held while waiting. The answer comes as soon as it does, or when the time is up "
    "with the run still running."
)
Wait = Annotated[float | None, Query(ge=0, le=listen.MAX_WAIT, description=WAIT_HELP)]


@authed.post(
    "/runs",
    status_code=201,
    response_model=Started,
    response_model_exclude_unset=True,  # no `outcome` unless the caller waited
    tags=["runs"],
    responses={
        200: {"model": Started, "description": "The key's existing run."},
        **failures(401, 409, 413, 422),
    },
)
async def start(
    body: StartRun,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    wait: Wait = None,
) -> Started:
    """Start a run. The same Idempotency-Key returns the same run (200); reusing it with a
    different agent or input is refused (409). With `?wait=`, answer once the run finished or
    started waiting (or the time is up), with its outcome."""

    deadline = parse_deadline(body.deadline, "field 'deadline'")
    started = await run_in_threadpool(
        start_run, body.agent, body.input, idempotency_key, deadline=deadline,
        notify_url=body.notify_url,
    )  # fmt: skip
    response.headers["Location"] = f"/runs/{started.run_id}"
    if not started.created:
        response.status_code = 200
    outcome = None
    if wait is not None:
        settled = await listen.wait_settled(started.run_id, wait)
        outcome = RunOutcome.model_validate(settled.as_json())
    if outcome is None:
        return Started(run_id=started.run_id, created=started.created)
    return Started(run_id=started.run_id, created=started.created, outcome=outcome)


@authed.get("/runs", tags=["runs"])
def runs(
    status: RunStatus | None = None,
    agent: Annotated[str | None, Query(max_length=100)] = None,
    batch: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """Runs, newest first."""

    return {"runs": list_runs(status=status, agent=agent, batch=batch, limit=limit)}


@authed.get("/runs/{run_id}", tags=["runs"], responses=failures(401, 404, 422))
async def run(run_id: str, wait: Wait = None) -> dict[str, Any]:
    """A run with its input, result, journal timeline and actions. With `?wait=`, answer once
    the run finished or started waiting (at once if it has), or when the time is up."""
    wanted = await run_in_threadpool(resolve_run_id, run_id)
    if wait:
        await listen.wait_settled(wanted, wait)
    shown: dict[str, Any] = await run_in_threadpool(show_run, wanted)
    return shown


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str | None = Field(
        default=None,
        max_length=200,
        description="Ignored: the run records who the credential speaks for.",
        deprecated=True,
    )
    reason: str = Field(default="cancelled", min_length=1, max_length=64)


@authed.post("/runs/{run_id}/cancel", tags=["runs"])
def cancel(run_id: str, who: Caller, body: CancelRequest | None = None) -> dict[str, Any]:
    """Cancel a run: a waiting run stops now, a running one at its next step. The run records
    the caller's identity as who cancelled it."""
    body = body or CancelRequest()
    result = cancel_run(resolve_run_id(run_id), by=who.actor.identity, reason=body.reason)
    return {"run_id": str(result.run_id), "status": result.status.value}


@authed.get(
    "/runs/{run_id}/events",
    tags=["runs"],
    response_class=StreamingResponse,
    responses={**sse.OPENAPI_STREAM, **failures(401, 404, 422)},
)
async def run_events(
    run_id: str,
    last_event_id: Annotated[str | None, Header(max_length=40)] = None,
    after: Annotated[str | None, Query(max_length=40)] = None,
) -> StreamingResponse:
    """The run's progress as Server-Sent Events: run_started, step_started, model_replied,
    tool_result, note, timer_set, action_changed, waiting, resumed, finished; then `end`.
    Resume with the Last-Event-ID header (or `after`): the stream continues right after it."""
    subject = Subject(run_id=await run_in_threadpool(resolve_run_id, run_id))
    return await sse.event_stream(subject, last_event_id or after)


@authed.get(
    "/batches/{batch_id:path}/events",
    tags=["batches"],
    response_class=StreamingResponse,
    responses={**sse.OPENAPI_STREAM, **failures(401, 404, 422)},
)
async def batch_events(
    batch_id: str,
    last_event_id: Annotated[str | None, Header(max_length=40)] = None,
    after: Annotated[str | None, Query(max_length=40)] = None,
) -> StreamingResponse:
    """Every run of the batch (children and synthesis) and the batch's own status changes
    (batch_changed), as Server-Sent Events, in one order; `end` once all are finished."""
    return await sse.event_stream(Subject(batch_id=batch_id), last_event_id or after)


@authed.get("/batches/{batch_id:path}", tags=["batches"])
def batch(batch_id: str) -> dict[str, Any]:
    """A batch: its status, its children counted by status, its synthesis run and the
    approvals it waits for."""

    return show_batch(batch_id).as_json()


# -- signed webhooks ------------------------------------------------------------------------


def _signed(secret_variable: str, *, bearer_too: bool) -> dict[str, Any]:
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
    signature with this credential), then parse the body: 503, 401, 400 or 422."""
    if secret is None:
        raise ApiError(503, f"this webhook is disabled: {variable} is not set")
    raw = await request.body()
    try:
        digest = signatures.verify(
            secret,
            request.headers.get(signatures.TIMESTAMP_HEADER),
            request.headers.get(signatures.SIGNATURE_HEADER),
            request.method,
            request.scope["path"],  # percent-decoded, as routed: %3A and : sign the same
            raw,
        )
    except signatures.BadSignature as exc:
        raise ApiError(401, str(exc)) from None
    key = webhooks.replay_key(digest, credential)
    if not await run_in_threadpool(first_delivery, key, signatures.TOLERANCE_SECONDS):
        raise ApiError(
            401,
            "this signed request was already received (a replay); sign each delivery anew, "
            "with its own timestamp",
        )
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        problems = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise ApiError(422, describe_validation(problems)) from None


class ApprovalDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject"]
    by: str | None = Field(
        default=None,
        max_length=200,
        description="Ignored: `decided_by` is whom the bearer token speaks for.",
        deprecated=True,
    )
    note: str | None = Field(default=None, max_length=2000)
    run_id: uuid.UUID | None = Field(
        default=None, description="The run the approver saw the action in; 409 if it changed."
    )
    args_hash: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description="The `args_hash` of the arguments the approver saw; 409 if they changed.",
    )


def _extra(model: type[BaseModel], secret_variable: str, bearer_too: bool) -> dict[str, Any]:
    body = {"content": {"application/json": {"schema": model.model_json_schema()}}}
    signed = _signed(secret_variable, bearer_too=bearer_too)
    return {**signed, "requestBody": {"required": True, **body}}


_APPROVAL_SECRET = "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET"
_EVENT_SECRET = "NIGHTSHIFT_EVENT_WEBHOOK_SECRET"


@router.post(
    "/approvals/{action_key:path}",
    tags=["webhooks"],
    openapi_extra=_extra(ApprovalDecision, _APPROVAL_SECRET, bearer_too=True),
)
async def approval(action_key: str, request: Request, who: Caller) -> dict[str, Any]:
    """Approve or reject a pending action, once, as whom the bearer token speaks for: a
    repeated identical decision returns the first outcome with "first": false; a different
    one is refused (409); someone not among the tool's approvers gets 403."""
    secret = _config(request).approval_webhook_secret
    credential = request.headers.get("Authorization")
    body: ApprovalDecision = await signed_body(
        request, ApprovalDecision, secret, _APPROVAL_SECRET, credential
    )
    actor = Actor(who.actor.identity, f"approval webhook, {who.actor.via}")
    seen = Seen(body.run_id, body.args_hash)
    result = await run_in_threadpool(decide, action_key, body.decision, actor, body.note, seen)
    return {
        "action_key": result.action_key,
        "decision": result.decision.value,
        "decided_by": result.decided_by,
        "first": result.first,
        "state": result.state.value,
        "run_id": str(result.run_id),
    }


class EventDelivery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any]


@router.post(
    "/events/{source}",
    tags=["webhooks"],
    openapi_extra=_extra(EventDelivery, _EVENT_SECRET, bearer_too=False),
)
async def event(source: str, request: Request) -> JSONResponse:
    """Start the source's run for this event once; a repeated event id returns its run (200)."""

    secret = _config(request).event_webhook_secret
    body: EventDelivery = await signed_body(request, EventDelivery, secret, _EVENT_SECRET)
    started = await run_in_threadpool(start_from_event, source, body.event_id, body.payload)
    return JSONResponse(
        {
            "run_id": str(started.run_id),
            "duplicate": started.duplicate,
            "deliveries": started.deliveries,
        },
        status_code=200 if started.duplicate else 201,
    )


# -- operations -----------------------------------------------------------------------------


@router.get(
    "/metrics",
    tags=["operations"],
    dependencies=[Depends(require_metrics_token)],
    response_class=PlainTextResponse,
)
def metrics(accept: Annotated[str | None, Header()] = None) -> Response:
    """Counters, histograms and gauges in the Prometheus text format (or OpenMetrics, when
    the scraper asks for it): docs/metrics.md names each one."""

    encode, content_type = choose_encoder(accept or "")
    return Response(encode(registry_for(get_settings())), media_type=content_type)


def registry_for(settings: Settings) -> CollectorRegistry:
    """Every worker's counters (their multi-process files) and the database's gauges."""
    registry = CollectorRegistry(auto_describe=False)
    directory = settings.metrics_dir
    directory.mkdir(parents=True, exist_ok=True)
    MultiProcessCollector(registry, path=str(directory))
    registry.register(DatabaseGauges(settings))
    return registry


@router.get("/healthz", tags=["operations"])
def healthz() -> JSONResponse:
    """The database answers `select 1` and the broker answers PING; 503 if either does not."""
    checks = {"database": _check(_database), "broker": _check(_broker)}
    healthy = all(v == "ok" for v in checks.values())
    body: dict[str, Any] = checks if healthy else {"error": "unhealthy", **checks}
    return JSONResponse(body, status_code=200 if healthy else 503)


def _check(probe: Callable[[], None]) -> str:
    try:
        probe()
    except Exception as exc:  # any failure is "unhealthy"; the type is enough to act on
        log.warning("health check %s failed: %s", probe.__name__, type(exc).__name__)
        return f"unavailable ({type(exc).__name__})"
    return "ok"


def _database() -> None:
    # A connection of its own with a timeout: a pooled one could hang on a dead network.
    url = make_url(database_url()).set(drivername="postgresql")
    conninfo = url.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, connect_timeout=HEALTH_TIMEOUT_SECONDS) as connection:
        connection.execute("select 1")


def _broker() -> None:
    client = redis.Redis.from_url(
        broker_url(get_settings()),
        socket_timeout=HEALTH_TIMEOUT_SECONDS,
        socket_connect_timeout=HEALTH_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    finally:
        client.close()


router.include_router(authed)
