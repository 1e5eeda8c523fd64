"""Read models for people: run lists and a run's timeline, as plain JSON-ready dicts."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Action, ActionKind, Artifact, JournalEntry, Run, RunStatus, artifact_url
from pipeline.db import read_only
from pipeline.errors import AmbiguousRunId, RunNotFound
from pipeline.keys import fork_key, forked_from, retried_run, retry_key
from pipeline.runs.summaries import describe, summarize
from pipeline.tools.agent_state import agent_part

RUN_FIELDS = (
    "id", "agent", "status", "step", "max_steps", "tool_calls", "input_tokens", "output_tokens",
    "cache_creation_input_tokens", "cache_read_input_tokens", "cost_usd", "attempt",
    "failed_step", "failed_attempts", "fence",
    "lease_owner", "lease_expires_at", "batch_id", "parent_id", "wake_at", "waiting_on",
    "cancel_requested", "stop_reason", "error", "created_at", "updated_at", "finished_at",
    "idempotency_key", "code_version", "prompt_version", "agent_version", "running_version",
)  # fmt: skip


MIN_PREFIX = 4
"""The shortest run-id prefix accepted; people copy the 8 characters the status page shows."""
_HEX = frozenset("0123456789abcdef")


def resolve_run_id(text: str) -> uuid.UUID:
    """A run id from its full form or from a unique prefix of it (`3f2a9c1e`).

    The prefix becomes a range of the primary key, so the lookup is an index scan however many
    runs are kept. Raises RunNotFound (no such run, or not an id) or AmbiguousRunId.
    """
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    digits = text.strip().lower().replace("-", "")
    if not MIN_PREFIX <= len(digits) < 32 or not set(digits) <= _HEX:
        raise RunNotFound(
            f"{text!r} is not a run id (a UUID, or at least its first {MIN_PREFIX} characters)"
        )
    low, high = uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))
    with read_only() as session:
        found = session.scalars(
            select(Run.id).where(Run.id.between(low, high)).order_by(Run.id).limit(3)
        ).all()
    if not found:
        raise RunNotFound(f"no run id starts with {text!r}")
    if len(found) > 1:
        some = ", ".join(str(run_id) for run_id in found[:2])
        more = " and more" if len(found) > 2 else ""
        raise AmbiguousRunId(
            f"{text!r} is the start of several run ids ({some}{more}): give more characters"
        )
    return found[0]


def run_dict(run: Run) -> dict[str, Any]:
    described = {name: plain(getattr(run, name)) for name in RUN_FIELDS}
    return described | {"version": version_words(run.agent_version, run.running_version)}


def version_words(started: str | None, running: str | None) -> str:
    """The agent version a run runs under, in words: `started under X, now running under Y`
    once a new release has run a step of it."""
    if started is None:
        return f"running under {running}" if running else "not recorded (an older run)"
    if running is None or running == started:
        return started
    return f"started under {started}, now running under {running}"


def plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def list_runs(
    *,
    status: str | None = None,
    agent: str | None = None,
    batch: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Newest first; runs created together (a batch's children) in one order, page after page."""
    query = select(Run).order_by(Run.created_at.desc(), Run.id).limit(limit).offset(offset)
    if status:
        query = query.where(Run.status == status)
    if agent:
        query = query.where(Run.agent == agent)
    if batch:
        query = query.where(Run.batch_id == batch)
    with read_only() as session:
        return [run_dict(run) for run in session.scalars(query)]


def show_run(run_id: uuid.UUID, *, full: bool = False) -> dict[str, Any]:
    """A run, its timeline, actions and artifacts (each with the API URL that serves it);
    `full` adds each entry's whole text (the status page's expanded view)."""
    with read_only() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFound(f"no run has id {run_id}")
        entries = session.scalars(
            select(JournalEntry).where(JournalEntry.run_id == run_id).order_by(JournalEntry.id)
        ).all()
        actions = session.scalars(
            select(Action)
            .where(Action.run_id == run_id, Action.kind == ActionKind.TOOL)
            .order_by(Action.created_at)
        ).all()
        shown = {
            "run": {
                **run_dict(run),
                "input": run.input,
                "result": run.result,
                "state": run.state,
                "agent_state": agent_part(run.state),
                "retry_of": plain(retried_run(run.idempotency_key)),
                "retried_as": [
                    {"id": str(retry), "status": status.value}
                    for retry, status in retries_of(session, run_id)
                ],
                "fork_of": fork_of(run.idempotency_key),
                "forks": forks_of(session, run_id, run.step),
            },
            "journal": [
                {
                    "key": e.key,
                    "step": e.step,
                    "step_name": e.step_name,
                    "created_at": e.created_at.isoformat(),
                    "summary": summarize(e.key, e.payload),
                    **({"text": describe(e.key, e.payload)} if full else {}),
                }
                for e in entries
            ],
            "actions": [
                {
                    "idempotency_key": a.idempotency_key,
                    "tool": a.tool,
                    "state": a.state.value,
                    "attempts": a.attempts,
                    "resolution": a.resolution,
                    "decision": a.decision,
                    "run_id": str(a.run_id),
                    "args_hash": a.args_hash,
                }
                for a in actions
            ],
        }
        shown["artifacts"] = [
            {"id": a.id, "name": a.name, "url": artifact_url(run_id, a.id),
             "media_type": a.media_type, "size": a.size, "deleted": a.deleted_at is not None,
             "missing": a.missing}
            for a in session.scalars(
                select(Artifact).where(Artifact.run_id == run_id).order_by(Artifact.id)
            )
        ]  # fmt: skip
        return shown


MAX_RETRIES_SHOWN = 20
"""How many retries of retries a run's record follows (a run retried every night for weeks)."""


def retries_of(session: Session, run_id: uuid.UUID) -> list[tuple[uuid.UUID, RunStatus]]:
    """The run's retry, that retry's retry, and so on (each a lookup of the unique key)."""
    chain: list[tuple[uuid.UUID, RunStatus]] = []
    current = run_id
    while len(chain) < MAX_RETRIES_SHOWN:
        found = session.execute(
            select(Run.id, Run.status).where(Run.idempotency_key == retry_key(current))
        ).one_or_none()
        if found is None:
            break
        chain.append((found.id, found.status))
        current = found.id
    return chain


def fork_of(key: str | None) -> dict[str, Any] | None:
    """The run and step a fork was forked from, None for a run that is no fork."""
    origin = forked_from(key)
    return None if origin is None else {"id": str(origin.run_id), "from_step": origin.step}


def forks_of(session: Session, run_id: uuid.UUID, steps: int) -> list[dict[str, Any]]:
    """The run's forks, by the step each went on live from (a lookup of each step's unique key:
    a run is forked from a step once, and never from past the step it ended in)."""
    keys = [fork_key(run_id, step) for step in range(steps + 1)]
    found = session.execute(
        select(Run.id, Run.status, Run.idempotency_key).where(Run.idempotency_key.in_(keys))
    ).all()
    forks = [
        {"id": str(fork.id), "status": fork.status.value, "from_step": origin.step}
        for fork in found
        if (origin := forked_from(fork.idempotency_key)) is not None
    ]
    return sorted(forks, key=lambda fork: (fork["from_step"], fork["id"]))
