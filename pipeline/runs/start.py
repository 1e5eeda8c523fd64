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

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
import pipeline.tracing as tracing
from models import Run
from pipeline.app import send_step_after_commit
from pipeline.db import transaction
from pipeline.errors import IdempotencyConflict, InputTooLarge, InvalidInput, NoModel, RunNotFound
from pipeline.keys import check_key, runtime_run_key
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


@dataclass(frozen=True)
class NewRuns:
    """Runs of one agent to create at once (a batch's children, or a single run), their
    requests checked: each one's id, input and key, and what they all share."""

    agent: str
    ids: list[uuid.UUID]
    inputs: list[dict[str, Any]]
    keys: list[str | None]
    parent_id: uuid.UUID | None
    batch_id: str | None
    deadline: Deadline | None
    notify_url: str | None
    max_steps: int
    prompt_version: str
    agent_version: str


def new_runs(
    agent_name: str,
    inputs: Sequence[object],
    keys: Sequence[str | None],
    *,
    parent_id: uuid.UUID | None = None,
    batch_id: str | None = None,
    deadline: Deadline | None = None,
    notify_url: str | None = None,
    caller: bool = True,
) -> NewRuns:
    """New runs of `agent_name`, one an input (and its idempotency key), once every request is
    checked (a clear error for the first that is not right). `caller`: see validate_input."""
    checked = [validate_input(agent_name, run_input, caller=caller) for run_input in inputs]
    for key in keys:
        if key is not None:
            check_key(key)
    agent = get_agent(agent_name)
    return NewRuns(
        agent=agent_name, ids=[uuid.uuid4() for _ in checked], inputs=checked, keys=list(keys),
        parent_id=parent_id, batch_id=batch_id, deadline=deadline,
        notify_url=check_notify_url(notify_url), max_steps=agent.max_steps,
        prompt_version=agent.prompt_version, agent_version=agent_version(agent_name),
    )  # fmt: skip


def _insert_txn(session: Session, runs: NewRuns) -> set[uuid.UUID]:
    """Insert the runs; the ids of those created (not the ones whose key was taken)."""
    deadline = runs.deadline
    contexts = tracing.run_contexts(runs.agent, runs.ids, runs.batch_id)
    # Every run is created by this one statement (runs.sql create_runs), however many at once.
    created = statements.rows(
        session,
        "create_runs",
        ids=runs.ids,
        # One JSON array, not an array of texts: the driver escapes every quote of every
        # element of a text[] in Python (1.6 s of CPU for a 100,000-child synthesis's input).
        inputs=json.dumps(runs.inputs),
        keys=runs.keys,
        agent=runs.agent,
        parent_id=runs.parent_id,
        batch_id=runs.batch_id,
        deadline_at=deadline if isinstance(deadline, datetime) else None,
        deadline_in=deadline.total_seconds() if isinstance(deadline, timedelta) else None,
        notify_url=runs.notify_url,
        max_steps=runs.max_steps,
        code_version=code_version(),
        prompt_version=runs.prompt_version,
        agent_version=runs.agent_version,
        # No Celery client holds a batch child's id: no outcome to publish (published_outcomes).
        nothing_to_publish=runs.batch_id is not None,
        trace_contexts=None if contexts is None else statements.jsonb(contexts),
    )
    return {row.id for row in created}


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
    runs = new_runs(
        agent_name, [run_input], [idempotency_key], parent_id=parent_id, batch_id=batch_id,
        deadline=deadline, notify_url=notify_url, caller=caller,
    )  # fmt: skip
    if _insert_txn(session, runs):
        run_id = runs.ids[0]
        send_step_after_commit(session, run_id, agent=agent_name, batch=batch_id)
        return StartedRun(run_id, created=True)
    existing = session.execute(
        select(Run.id, Run.agent, Run.input).where(Run.idempotency_key == idempotency_key)
    ).one()
    if existing.agent != agent_name or existing.input != runs.inputs[0]:
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} already started run {existing.id} "
            "with a different agent or input"
        )
    return StartedRun(existing.id, created=False)


def request_of(session: Session, run_id: uuid.UUID) -> Row[Any]:
    """What a retry or a fork starts again from: the run's request (agent, input, notify_url,
    the time its deadline gave it) and what they check first (status, compaction, steps)."""
    origin = session.execute(
        select(
            Run.agent, Run.status, Run.input, Run.notify_url, Run.deadline, Run.created_at,
            Run.compacted_at, Run.step,
        ).where(Run.id == run_id)
    ).one_or_none()  # fmt: skip
    if origin is None:
        raise RunNotFound(f"no run has id {run_id}")
    return origin


def start_again_txn(session: Session, origin: Row[Any], key: str) -> StartedRun:
    """A new run of `origin`'s request under `key` (a runtime key naming the origin), given as
    much time from now as the origin's deadline gave it: its own has passed, or soon will."""
    given = None if origin.deadline is None else origin.deadline - origin.created_at
    return create_run_txn(
        session, origin.agent, origin.input, key, deadline=given,
        notify_url=origin.notify_url, caller=False,
    )  # fmt: skip


def create_runs_txn(session: Session, runs: NewRuns) -> list[uuid.UUID]:
    """Create new runs (from new_runs) in one statement, sending each one's first step once
    the caller's transaction commits: a batch's children, thousands at a time. A key that
    already names a run is an error here (a new batch's children's keys cannot)."""
    created = _insert_txn(session, runs) if runs.ids else set()
    if len(created) != len(runs.ids):
        taken = [key for run_id, key in zip(runs.ids, runs.keys, strict=True)
                 if run_id not in created]  # fmt: skip
        raise IdempotencyConflict(
            f"{len(taken)} idempotency key(s) already name runs, e.g. {taken[0]!r}"
        )
    for run_id in runs.ids:
        send_step_after_commit(session, run_id, agent=runs.agent, batch=runs.batch_id)
    return runs.ids


def start_run(
    agent_name: str,
    run_input: object,
    idempotency_key: str | None = None,
    *,
    deadline: Deadline | None = None,
    notify_url: str | None = None,
) -> StartedRun:
    """Create the run; its first step goes to a worker once this commits."""
    reserved = None if idempotency_key is None else runtime_run_key(idempotency_key)
    if reserved is not None:
        raise InvalidInput(f"idempotency key {idempotency_key!r}: {reserved}")
    with transaction() as session:
        return create_run_txn(
            session, agent_name, run_input, idempotency_key, deadline=deadline,
            notify_url=notify_url,
        )  # fmt: skip
