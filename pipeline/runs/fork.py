"""Forking a run from a step: a new run of a finished run's agent and request that takes the
run's journal before that step (its model replies and tool results, replayed as a takeover
replays a run's own, never asked or run again) and goes on live from the step, under a key that
names its origin (`fork-of:<run id>:<step>`). A run is forked from a step once: asking again
answers with that fork. Steps are numbered as `nightshift show` and the status page number them
(the first is 0). The CLI and the API call this.

What the origin did before the step is in the copied journal, so the fork sends none of it
again; what it meets of its origin's actions after the step (the same key) is settled as its
own record says (pipeline/engine/actions.py), never sent twice and never a key conflict.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import RunStatus
from pipeline.db import transaction
from pipeline.errors import InvalidInput, StatusConflict
from pipeline.keys import fork_key
from pipeline.logs import get_logger
from pipeline.runs.start import StartedRun, request_of, start_again_txn

log = get_logger("nightshift.fork")


@dataclass(frozen=True)
class Fork:
    origin: uuid.UUID
    step: int
    started: StartedRun
    """The fork: created, or the one an earlier request for the same origin and step started."""


def last_step(status: RunStatus, steps: int) -> int:
    """The last step a run with `steps` completed steps can be forked from: the step it ended
    in (a failed or cancelled run's unfinished one), or its final step if it succeeded."""
    return steps - 1 if status is RunStatus.SUCCEEDED else steps


def fork_run_txn(session: Session, run_id: uuid.UUID, step: int, by: str) -> Fork:
    """Start a fork of `run_id` from `step`, unless one was started already. Refused: a run that
    has not finished, whose journal retention compacted or that never reached `step`
    (StatusConflict); a negative step (InvalidInput). Its first step is sent once the caller
    commits."""
    origin = request_of(session, run_id)
    if not origin.status.is_terminal():
        raise StatusConflict(
            f"run {run_id} is {origin.status.value}: only a finished run (succeeded, failed "
            "or cancelled) is forked"
        )
    if origin.compacted_at is not None:
        raise StatusConflict(
            f"run {run_id} cannot be forked: retention compacted its journal on "
            f"{origin.compacted_at:%Y-%m-%d}"
        )
    last = last_step(origin.status, origin.step)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidInput(f"a run is forked from a step numbered 0 or more, not {step!r}")
    if step > last:  # a step this run never reached: its record disagrees, not the request
        raise StatusConflict(
            f"run {run_id} has steps 0 to {last}: it cannot be forked from step {step!r}"
        )
    started = start_again_txn(session, origin, fork_key(run_id, step))
    if started.created:
        copied = statements.first(
            session, "fork_from_step", fork_id=started.run_id, origin_id=run_id, step=step
        )
        assert copied is not None and copied.forked == 1, f"fork {started.run_id} not fresh"
        log.info("run %s (%s): forked from step %d by %s as run %s (%d journal entries)",
                 run_id, origin.status.value, step, by, started.run_id, copied.entries)  # fmt: skip
    return Fork(run_id, step, started)


def fork_run(run_id: uuid.UUID, step: int, by: str) -> Fork:
    with transaction() as session:
        return fork_run_txn(session, run_id, step, by)
