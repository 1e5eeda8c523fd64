"""/runs: start a run (optionally waiting for its outcome), list them, show one, cancel one,
retry one, fork one from a step, and its progress as Server-Sent Events."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

import pipeline.tracing as tracing
from models import RunStatus
from pipeline.api import listen, sse
from pipeline.api.bodies import (
    CancelRequest,
    ForkRequest,
    RunOutcomeBody,
    StartedBody,
    StartRun,
    failures,
)
from pipeline.api.guards import Caller, require_caller
from pipeline.api.tokens import still_valid
from pipeline.keys import MAX_KEY_LENGTH
from pipeline.runs.cancel import cancel_run
from pipeline.runs.deadlines import parse_deadline
from pipeline.runs.fork import fork_run
from pipeline.runs.retry import retry_run
from pipeline.runs.start import StartedRun, start_run
from pipeline.views.feed import Subject
from pipeline.views.runs import list_runs, resolve_run_id, show_run

authed = APIRouter(dependencies=[Depends(require_caller)])

WAIT_HELP = (
    "Wait up to this many seconds (at most 120) for the run to finish or start waiting; no "
    "worker is held while waiting. The answer comes as soon as it does, or when the time is up "
    "with the run still running."
)
KEY_HELP = "Starts the run once: the same key again returns the run it started."
Wait = Annotated[float | None, Query(ge=0, le=listen.MAX_WAIT, description=WAIT_HELP)]


@authed.post(
    "/runs",
    status_code=201,
    response_model=StartedBody,
    response_model_exclude_unset=True,  # no `outcome` unless the caller waited
    tags=["runs"],
    responses={
        200: {"model": StartedBody, "description": "The key's existing run."},
        **failures(401, 409, 413, 422),
    },
)
async def start(
    body: StartRun,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(max_length=MAX_KEY_LENGTH, pattern="\\S", description=KEY_HELP)
    ] = None,
    wait: Wait = None,
) -> StartedBody:
    """Start a run. The same Idempotency-Key returns the same run (200); reusing it with a
    different agent or input is refused (409). With `?wait=`, answer once the run finished or
    started waiting (or the time is up), with its outcome. A W3C `traceparent` header puts the
    run in the caller's trace."""

    deadline = parse_deadline(body.deadline, "field 'deadline'")
    started = await run_in_threadpool(
        _start_run, request, body.agent, body.input, idempotency_key, deadline=deadline,
        notify_url=body.notify_url,
    )  # fmt: skip
    response.headers["Location"] = f"/runs/{started.run_id}"
    if not started.created:
        response.status_code = 200
    outcome = None
    if wait is not None:
        settled = await listen.wait_settled(started.run_id, wait)
        outcome = RunOutcomeBody.model_validate(settled.as_json())
    if outcome is None:
        return StartedBody(run_id=started.run_id, created=started.created)
    return StartedBody(run_id=started.run_id, created=started.created, outcome=outcome)


def _start_run(request: Request, *args: Any, **kwargs: Any) -> StartedRun:
    with tracing.continuing(request.headers):
        return start_run(*args, **kwargs)


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
    """A run with its input, result, agent state, journal timeline and actions. With `?wait=`,
    answer once the run finished or started waiting (at once if it has), or when the time is
    up, with its `outcome` as `POST /runs?wait=` gives it."""
    wanted = await run_in_threadpool(resolve_run_id, run_id)
    settled = None if wait is None else await listen.wait_settled(wanted, wait)
    shown: dict[str, Any] = await run_in_threadpool(show_run, wanted)
    if settled is not None:
        shown["outcome"] = settled.as_json()
    return shown


@authed.post("/runs/{run_id}/cancel", tags=["runs"])
def cancel(run_id: str, who: Caller, body: CancelRequest | None = None) -> dict[str, Any]:
    """Cancel a run: a waiting run stops now, a running one at its next step. The run records
    the caller's identity as who cancelled it."""
    body = body or CancelRequest()
    result = cancel_run(resolve_run_id(run_id), by=who.actor.identity, reason=body.reason)
    return {"run_id": str(result.run_id), "status": result.status.value}


@authed.post(
    "/runs/{run_id}/retry",
    status_code=201,
    response_model=StartedBody,
    response_model_exclude_unset=True,
    tags=["runs"],
    responses={200: {"model": StartedBody, "description": "The run's earlier retry."}},
)
def retry(run_id: str, who: Caller, response: Response) -> StartedBody:
    """Start a failed or cancelled run again from its original request (agent, input,
    notify_url, as long a deadline as it had) as a new run under the key `retry-of:<run id>`;
    `GET /runs/{run_id}` of each names the other (`retry_of`, `retried_as`). A run is retried
    once: asking again answers with that retry (200); retry the retry if it failed too. A run
    that is not failed or cancelled, or whose input retention redacted, is a 409."""
    retried = retry_run(resolve_run_id(run_id), by=who.actor.identity)
    return _new_run(retried.started, response)


@authed.post(
    "/runs/{run_id}/fork",
    status_code=201,
    response_model=StartedBody,
    response_model_exclude_unset=True,
    tags=["runs"],
    responses={
        200: {"model": StartedBody, "description": "The run's earlier fork from that step."},
        **failures(401, 404, 409, 422),
    },
)
def fork(run_id: str, body: ForkRequest, who: Caller, response: Response) -> StartedBody:
    """Start a finished run again from one of its steps, as a new run under the key
    `fork-of:<run id>:<step>`: its steps before `from_step` are replayed from the run's journal
    (no model call or side effect of theirs is made again), and it goes on live from
    `from_step`. `GET /runs/{run_id}` of each names the other (`fork_of`, `forks`). Asked again
    for the same step, it answers with that fork (200). A run that has not finished, or whose
    journal retention compacted, or a step the run never reached, is a 409."""
    forked = fork_run(resolve_run_id(run_id), body.from_step, by=who.actor.identity)
    return _new_run(forked.started, response)


def _new_run(started: StartedRun, response: Response) -> StartedBody:
    """A run a retry or a fork started (201), or the one it had started before (200)."""
    response.headers["Location"] = f"/runs/{started.run_id}"
    if not started.created:
        response.status_code = 200
    return StartedBody(run_id=started.run_id, created=started.created)


@authed.get(
    "/runs/{run_id}/events",
    tags=["runs"],
    response_class=StreamingResponse,
    responses={**sse.OPENAPI_STREAM, **failures(401, 404, 422)},
)
async def run_events(
    run_id: str,
    who: Caller,
    last_event_id: sse.LastEventId = None,
    after: sse.After = None,
) -> StreamingResponse:
    """The run's progress as Server-Sent Events: run_started, step_started, model_replied,
    tool_result, note, timer_set, action_changed, version_changed, waiting, resumed,
    finished; then `end`. Resume with the Last-Event-ID header (or `after`): the stream
    continues right after it."""
    subject = Subject(run_id=await run_in_threadpool(resolve_run_id, run_id))
    return await sse.event_stream(subject, last_event_id, lambda: still_valid(who), after=after)
