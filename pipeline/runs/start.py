"""Starting runs: validate the request, create the record once per idempotency key."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import Run, table_of
from pipeline.app import send_step_after_commit
from pipeline.db import transaction
from pipeline.errors import IdempotencyConflict, InputTooLarge, InvalidInput, NoModel
from pipeline.keys import check_key
from pipeline.registry import agent_version, get_agent
from pipeline.runs.deadlines import Deadline
from pipeline.runs.notifications import check_notify_url
from pipeline.settings import get_settings


@dataclass(frozen=True)
class StartedRun:
    run_id: uuid.UUID
    created: bool
    """False when the idempotency key named a run that already existed."""


@cache
def code_version() -> str:
    try:
        return version("nightshift")
    except PackageNotFoundError:
        return "dev"


def validate_input(agent_name: str, run_input: object, *, caller: bool = True) -> dict[str, Any]:
    """The run's input, if the agent exists, can run here and accepts it; else a clear error.

    A `caller`'s input (a request, an event, a job's plan) is held to NIGHTSHIFT_MAX_INPUT_BYTES;
    one the runtime writes from its own records (a synthesis's: every child's outcome, as large
    as the batch) only to the agent's schema.
    """
    agent = get_agent(agent_name)
    settings = get_settings()
    if agent.script is None and not settings.anthropic_api_key:
        raise NoModel(
            f"agent {agent_name!r} has no script, so it runs only on the real model: "
            "set ANTHROPIC_API_KEY"
        )
    if not isinstance(run_input, dict):
        raise InvalidInput(f"input for agent {agent_name!r} must be a JSON object")
    try:
        size = len(json.dumps(run_input).encode())
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"input for agent {agent_name!r} is not JSON: {exc}") from None
    limit = settings.max_input_bytes
    if caller and size > limit:
        raise InputTooLarge(
            f"input for agent {agent_name!r} is {size} bytes; the limit is {limit} "
            "(NIGHTSHIFT_MAX_INPUT_BYTES)"
        )
    if caller and _nested_deeper(run_input, MAX_INPUT_DEPTH):
        raise InvalidInput(
            f"input for agent {agent_name!r} is nested too deeply: objects and arrays may sit "
            f"at most {MAX_INPUT_DEPTH} levels within each other"
        )
    errors = agent.input_errors(run_input)
    if errors:
        raise InvalidInput(f"input for agent {agent_name!r} is invalid: " + "; ".join(errors))
    return run_input


MAX_INPUT_DEPTH = 64
"""How deep objects and arrays may nest in a caller's input: a run's record is shown, sent and
serialized whole (pydantic's serializer stops at about 255 levels, and such a run could be
started and then never shown)."""


def _nested_deeper(value: object, depth: int) -> bool:
    """Whether `value` nests objects and arrays more than `depth` levels (without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if not isinstance(item, list):
            continue
        if level > depth:
            return True
        pending.extend((child, level + 1) for child in item)
    return False


def new_run(
    agent_name: str,
    run_input: object,
    idempotency_key: str | None = None,
    *,
    parent_id: uuid.UUID | None = None,
    batch_id: str | None = None,
    deadline: Deadline | None = None,
    notify_url: str | None = None,
    caller: bool = True,
) -> dict[str, Any]:
    """A new run's row, once its request is checked (a clear error if it is not right)."""
    checked = validate_input(agent_name, run_input, caller=caller)
    if idempotency_key is not None:
        check_key(idempotency_key)
    agent = get_agent(agent_name)
    version = agent_version(agent_name)
    return {
        "id": uuid.uuid4(),
        "agent": agent_name,
        "input": checked,
        "idempotency_key": idempotency_key,
        "parent_id": parent_id,
        "batch_id": batch_id,
        "deadline": _deadline_value(deadline),
        "notify_url": check_notify_url(notify_url),
        "max_steps": agent.max_steps,
        "state": {},
        "code_version": code_version(),
        "prompt_version": agent.prompt_version,
        "agent_version": version,
        "running_version": version,
    }


def create_run_txn(
    session: Session,
    agent_name: str,
    run_input: object,
    idempotency_key: str | None = None,
    *,
    parent_id: uuid.UUID | None = None,
    batch_id: str | None = None,
    deadline: Deadline | None = None,
    notify_url: str | None = None,
    caller: bool = True,
) -> StartedRun:
    """Create the run unless the key already names one; raise on a different request.

    A run created here has its first step sent once the caller's transaction commits. A
    repeated key returns the first run as it was started: its deadline is not moved.
    `caller`: see validate_input.
    """
    values = new_run(
        agent_name, run_input, idempotency_key, parent_id=parent_id, batch_id=batch_id,
        deadline=deadline, notify_url=notify_url, caller=caller,
    )  # fmt: skip
    statement = insert(Run).values(**values)
    if idempotency_key is not None:
        statement = statement.on_conflict_do_nothing(index_elements=["idempotency_key"])
    run_id = session.execute(statement.returning(Run.id)).scalar_one_or_none()
    if run_id is not None:
        send_step_after_commit(session, run_id, agent=agent_name, batch=batch_id)
        return StartedRun(run_id, created=True)
    existing = session.execute(
        select(Run.id, Run.agent, Run.input).where(Run.idempotency_key == idempotency_key)
    ).one()
    if existing.agent != agent_name or existing.input != values["input"]:
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} already started run {existing.id} "
            "with a different agent or input"
        )
    return StartedRun(existing.id, created=False)


def create_runs_txn(session: Session, rows: Sequence[dict[str, Any]]) -> list[uuid.UUID]:
    """Create new runs (rows from new_run) in one statement, sending each one's first step once
    the caller's transaction commits: a batch's children, thousands at a time. A key that
    already names a run is an error here (a new batch's children's keys cannot)."""
    if rows:
        session.execute(insert(table_of(Run)), list(rows))
    for row in rows:
        send_step_after_commit(session, row["id"], agent=row["agent"], batch=row["batch_id"])
    return [row["id"] for row in rows]


def _deadline_value(deadline: Deadline | None) -> datetime | ColumnElement[datetime] | None:
    """A relative deadline counts from PostgreSQL's clock, as every deadline check does."""
    if isinstance(deadline, timedelta):
        return func.now() + deadline
    return deadline


def start_run(
    agent_name: str,
    run_input: object,
    idempotency_key: str | None = None,
    *,
    deadline: Deadline | None = None,
    notify_url: str | None = None,
) -> StartedRun:
    """Create the run; its first step goes to a worker once this commits."""
    with transaction() as session:
        return create_run_txn(
            session, agent_name, run_input, idempotency_key, deadline=deadline,
            notify_url=notify_url,
        )  # fmt: skip
