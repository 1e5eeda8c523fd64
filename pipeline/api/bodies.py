"""The API's request and response bodies (pydantic models, and so its OpenAPI schemas), and the
error body every failure answers with."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from models import RunStatus


class ErrorBody(BaseModel):
    error: str = Field(description="What went wrong, in one line.")


def failures(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error statuses a route answers, each with the error body."""
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}


_WHY = {
    401: "The bearer token is missing or wrong.",
    404: "No run, batch or artifact has that id.",
    409: "The Idempotency-Key already started a run with a different agent or input.",
    410: "The artifact's content is gone (deleted by retention).",
    413: "The body or the run's input is larger than the limit.",
    422: "A parameter or the body is invalid (the message names it).",
}


DEADLINE_HELP = (
    "The run must be finished by then, or it stops with reason `deadline` (a waiting run too, "
    "its pending approvals withdrawn): seconds from now, a duration (`90s`, `15m`, `2h`, `1d`) "
    "or an ISO-8601 time with a timezone, at most 366 days ahead (a past or farther one is a "
    '422; the schema lists only the relative forms, as JSON Schema cannot say "ahead").'
)


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str = Field(min_length=1, max_length=100, examples=["nightly_report"])
    input: dict[str, Any] = Field(examples=[{"team": "ops", "date": "2026-11-29"}])
    deadline: float | str | None = Field(
        default=None, description=DEADLINE_HELP, examples=["2h", 3600]
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


class RunOutcomeBody(BaseModel):
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


class StartedBody(BaseModel):
    run_id: uuid.UUID
    created: bool
    """False when the Idempotency-Key named a run that already existed."""
    outcome: RunOutcomeBody | None = None
    """With `?wait=`: the run when it finished or started waiting, or when the wait ended."""


class CancelRequest(BaseModel):
    """Who cancelled is whom the credential speaks for: never a name in the body."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="cancelled", min_length=1, max_length=64)


class ForkRequest(BaseModel):
    """Where the fork goes on live: the steps before it are replayed from the run's journal."""

    model_config = ConfigDict(extra="forbid")
    from_step: int = Field(
        ge=0, le=1_000_000, description="numbered as the run's journal numbers them (from 0)"
    )


class ApprovalDecision(BaseModel):
    """A decision on the action as the approver saw it: its run and its arguments' hash (as
    `GET /runs/{run_id}` lists them under `actions`, and the status page shows them), so that
    it never applies to another run's action under the same key, or to other arguments.
    `decided_by` is whom the bearer token speaks for: never a name in the body."""

    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject"]
    note: str | None = Field(default=None, max_length=2000)
    run_id: uuid.UUID = Field(
        description="The run the approver saw the action in; 409 if the action is another "
        "run's now."
    )
    args_hash: str = Field(
        pattern="^[0-9a-f]{64}$",
        description="The `args_hash` of the arguments the approver saw; 409 if they changed.",
    )


class EventDelivery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any]
