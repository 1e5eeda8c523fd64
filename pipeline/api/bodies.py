"""The API's request and response bodies (pydantic models, and so its OpenAPI schemas), and the
error body every failure answers with."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, field_validator
from pydantic.json_schema import SkipJsonSchema

from models import BulkKind, RunStatus
from pipeline.keys import WaitKind


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

    @field_validator("from_step", mode="before")
    @classmethod
    def _a_json_integer(cls, value: object) -> object:
        """What JSON Schema calls an integer (3 or 3.0), not what Python would turn into one
        (false, "3")."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a JSON integer")
        return value


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


class BulkFilterBody(BaseModel):
    """Runs whose every given field matches (at least one field)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    # Absent, never null (SkipJsonSchema keeps null out of the schema): a field is given or not.
    # The constraints on the string itself: pydantic applies a Field's to None too.
    agent: Annotated[str, Field(min_length=1, max_length=100)] | SkipJsonSchema[None] = None
    batch: Annotated[str, Field(min_length=1, max_length=200)] | SkipJsonSchema[None] = None
    status: RunStatus | SkipJsonSchema[None] = None
    stop_reason: Annotated[str, Field(min_length=1, max_length=64)] | SkipJsonSchema[None] = None
    started_after: AwareDatetime | SkipJsonSchema[None] = Field(
        default=None, description="Runs created at or after this time."
    )
    started_before: AwareDatetime | SkipJsonSchema[None] = Field(
        default=None, description="Runs created before this time."
    )
    waiting_on: WaitKind | SkipJsonSchema[None] = Field(
        default=None,
        description="Runs waiting on this kind of wait (`approval`: for a person's "
        "approval of an action).",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:  # the schema has no null: a field is left out, not given as null
            raise ValueError("leave the field out rather than give it as null")
        return value

    @field_validator("started_after", "started_before", mode="before")
    @classmethod
    def _a_time_as_text(cls, value: object) -> object:
        if not isinstance(value, str):  # pydantic would read a number as seconds since 1970
            raise ValueError("must be an ISO-8601 time with a timezone, as a string")
        return value

    def given(self) -> dict[str, str]:
        """The fields given, as BulkFilter.parse reads them."""
        return {
            name: value.isoformat() if hasattr(value, "isoformat") else str(value)
            for name, value in self.model_dump(exclude_none=True).items()
        }


class BulkRequest(BaseModel):
    """A bulk operation, or its dry run (the default). Who asks is whom the credential speaks
    for; each item is applied as that caller's single action would be (an approval needs an
    approver of the tool)."""

    model_config = ConfigDict(extra="forbid")
    kind: BulkKind = Field(
        description="cancel (runs not ended), retry (failed or cancelled runs not retried yet), "
        "approve or reject (the pending approvals of the matched runs)."
    )
    filter: BulkFilterBody
    note: str | None = Field(
        default=None, max_length=2000, description="A cancellation's reason, a decision's note."
    )
    dry_run: StrictBool = Field(
        default=True, description="Only say what would be done (true unless said otherwise)."
    )


class BulkAnswer(BaseModel):
    kind: BulkKind
    filter: dict[str, str]
    count: int = Field(description="How many runs (or approvals) the filter matched.")
    run_ids: list[uuid.UUID] = Field(description="The matched runs, oldest first (up to 200).")
    action_keys: list[str] = Field(description="approve, reject: the approvals (up to 200).")
    shown: int
    dry_run: bool
    operation_id: uuid.UUID | None = Field(
        default=None,
        description="The operation made (201); none for a dry run or when nothing matched.",
    )
