"""Batches: one child run per item, and a synthesis run that starts exactly once, when every
child is terminal (a durable join in Postgres, keyed `<batch>:synthesis`). A batch stopped by a
cap (its own or the night's) gets one too, partial: its input says why the batch stopped and
which children it stopped (`stopped`), beside the outcomes of every child. A batch stopped by a
person or replaced by a newer slot gets none."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import Batch, BatchStatus, Run, RunStatus
from models.run import UNFINISHED
from pipeline.agent_definition import BatchPlan
from pipeline.crash import crash_point
from pipeline.db import after_commit, transaction
from pipeline.keys import child_key, synthesis_key
from pipeline.logs import get_logger
from pipeline.runs import notifications
from pipeline.runs.notifications import check_notify_url
from pipeline.runs.start import StartedRun, create_run_txn, create_runs_txn, new_runs
from pipeline.settings import get_settings

log = get_logger("nightshift.fanout")
_TERMINAL = RunStatus.terminal()

BATCH_CAP, NIGHTLY_CAP = "budget", "nightly_budget"
"""The stop reasons of a batch that a cap stopped (engine/budgets.py): the ones that still end
with a partial synthesis."""
CAP_STOPS = (BATCH_CAP, NIGHTLY_CAP)


def create_batch_txn(
    session: Session,
    plan: BatchPlan,
    *,
    deadline: datetime | None = None,
    notify_url: str | None = None,
) -> list[uuid.UUID]:
    """Create the batch and its children once; the children start after the commit. Every
    run of the batch, the synthesis too, must be finished by `deadline`; `notify_url` hears
    when the batch ends and when any of its runs waits for a person. Returns the children's
    run ids: none when the batch id already existed (the same slot fired twice)."""
    inserted = statements.first(
        session,
        "create_batch",
        batch_id=plan.batch_id,
        name=plan.name,
        params=statements.jsonb({**plan.params, "synthesis_agent": plan.synthesis_agent}),
        token_cap=plan.token_cap,
        cost_cap_usd=plan.cost_cap_usd,
        tool_call_cap=plan.tool_call_cap,
        deadline=deadline,
        notify_url=check_notify_url(notify_url),
    )
    if inserted is None:
        return []
    # Every child's input is checked in Python before the INSERT, with the transaction idle
    # meanwhile: at a hundred thousand children longer than the lease the connection allows
    # (PostgreSQL ended the fan-out's session under load). A millisecond a child more.
    idle_ms = int(get_settings().lease_seconds * 1000) + len(plan.child_inputs)
    statements.first(session, "idle_in_transaction_timeout", milliseconds=str(idle_ms))
    # One INSERT for all the children (a night may have a hundred thousand): the workers get
    # none of them before this transaction commits, and then their first steps in chunks.
    children = create_runs_txn(
        session,
        new_runs(
            plan.child_agent,
            plan.child_inputs,
            [child_key(plan.batch_id, index) for index in range(len(plan.child_inputs))],
            batch_id=plan.batch_id,
            deadline=deadline,
        ),
    )
    log.info("batch %s: %d children of %s", plan.batch_id, len(children), plan.child_agent)
    return children


# Whether any child is left, not how many: from the index of unfinished children alone, in
# about the same time for the last child of 10,000 as for the first (a count read every
# child, under the batch's lock, once per child that finished).
_ANY_CHILD_LEFT = text(
    f"SELECT EXISTS (SELECT 1 FROM runs WHERE batch_id = :batch_id AND {UNFINISHED})"
)


def join_after_commit(session: Session, batch_id: str) -> None:
    """In the transaction that makes a child of `batch_id` terminal: once it commits, start
    the batch's synthesis if no child is left (`join`).

    After the commit, not in it: a finishing child then takes no lock while siblings are left
    (taking the batch row in every finish queued each child behind the one before it: nine
    sessions waiting on it in a 10,000-child night), and the last of several children
    finishing at once still sees every other one finished, since each looks only once its own
    finish is committed. A process that dies in between leaves the join to the tick
    (`ready_batches_txn`).
    """
    after_commit(session, lambda: join(batch_id))


def join(batch_id: str) -> None:
    """Start the synthesis of `batch_id` if every child is terminal (once: child_finished_txn)."""
    crash_point("before_batch_join")
    with transaction() as session:
        if not session.scalar(_ANY_CHILD_LEFT, {"batch_id": batch_id}):
            child_finished_txn(session, batch_id)
            notifications.dispatch_new_txn(session)


def child_finished_txn(session: Session, batch_id: str) -> uuid.UUID | None:
    """Start the synthesis if no child is left (in the transaction that made a child
    terminal, the tick's for instance: `join_after_commit` is for the step's).

    The batch row lock serialises the callers that find no child left; the synthesis key makes
    a second start impossible even so. The synthesis starts after the commit. A caller that
    finds the row locked leaves: whoever holds it is joining (or stopping) the batch, and the
    tick's backstop joins it if that transaction fails. Waiting held a connection a caller:
    a 100,000-child synthesis took its joiner minutes, and the ticks queued behind it took
    every connection of both workers.
    """
    # FOR NO KEY UPDATE, not FOR UPDATE: the caller's second UPDATE of the child's run row in
    # this transaction re-checks the runs.batch_id foreign key, which takes a KEY SHARE lock on
    # this batch row; FOR UPDATE conflicts with KEY SHARE, so two children finishing at once
    # would each wait for the other's KEY SHARE lock: a deadlock.
    locked = (
        select(Batch).where(Batch.id == batch_id).with_for_update(key_share=True, skip_locked=True)
    )
    batch = session.scalar(locked)
    if batch is None or batch.synthesis_run_id is not None:
        return None
    stopped = batch.status is BatchStatus.STOPPED and batch.stop_reason in CAP_STOPS
    if batch.status.is_terminal() and not stopped:
        return None
    if session.scalar(_ANY_CHILD_LEFT, {"batch_id": batch_id}):
        return None
    outcomes = _child_outcomes(session, batch_id)
    synthesis_input: dict[str, Any] = {"batch": batch_id, "children": outcomes}
    if stopped:  # a partial synthesis of the children that finished, saying what stopped
        synthesis_input["stopped"] = _stopped_part(batch, outcomes)
    # A stopped batch stays stopped (its reason kept); its synthesis still runs once.
    status = BatchStatus.STOPPED if stopped else BatchStatus.SYNTHESIZING
    started = start_synthesis_txn(session, batch, synthesis_input, status)
    failed = [o["item"] for o in outcomes if o["status"] != RunStatus.SUCCEEDED.value]
    log.info("batch %s: every child is done (%d failed); synthesis %s", batch_id, len(failed),
             started.run_id)  # fmt: skip
    return started.run_id if started.created else None


def start_synthesis_txn(
    session: Session, batch: Batch, synthesis_input: dict[str, Any], status: BatchStatus
) -> StartedRun:
    """Start `batch`'s synthesis run with this input (once: its key is `<batch>:synthesis`) and
    record it as the batch's, which is what makes it the batch's to its tools
    (ToolContext.batch_id), whatever its input says."""
    started = create_run_txn(
        session,
        batch.params["synthesis_agent"],
        synthesis_input,
        synthesis_key(batch.id),
        deadline=batch.deadline,
        caller=False,  # as large as the batch: not held to a request's size limit
    )
    statements.execute(
        session, "synthesis_started", batch_id=batch.id, run_id=started.run_id, status=status.value
    )
    return started


def _stopped_part(batch: Batch, outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """What a partial synthesis is told: why the batch stopped and which children it stopped."""
    reason = batch.stop_reason or "stopped"
    return {
        "reason": reason,
        "finished": sum(1 for o in outcomes if o["status"] == RunStatus.SUCCEEDED.value),
        "stopped": [o["item"] for o in outcomes if o["reason"] == reason],
        "why": next((o["error"] for o in outcomes if o["reason"] == reason and o["error"]), None),
    }


def _child_outcomes(session: Session, batch_id: str) -> list[dict[str, Any]]:
    rows = session.execute(
        select(Run.input, Run.status, Run.stop_reason, Run.error, Run.result)
        .where(Run.batch_id == batch_id)
        .order_by(Run.created_at, Run.id)
    ).all()
    return [
        {
            "item": row.input,
            "status": row.status.value,
            "reason": row.stop_reason,
            "error": (row.error or "")[:300] or None,
            "result": (row.result or {}).get("text"),
        }
        for row in rows
    ]


def synthesis_finished_txn(session: Session, run_id: uuid.UUID, status: RunStatus) -> None:
    """The batch ends with its synthesis."""
    final = BatchStatus.SUCCEEDED if status is RunStatus.SUCCEEDED else BatchStatus.FAILED
    statements.execute(session, "synthesis_finished", run_id=run_id, status=final.value)


def ready_batches_txn(session: Session) -> list[uuid.UUID]:
    """The tick's backstop: join batches whose last child finished outside the engine
    (cancelled while waiting, say)."""
    candidates = session.scalars(
        select(Batch.id).where(
            (Batch.status == BatchStatus.RUNNING)
            | ((Batch.status == BatchStatus.STOPPED) & Batch.stop_reason.in_(CAP_STOPS)),
            Batch.synthesis_run_id.is_(None),
            ~select(Run.id)
            .where(Run.batch_id == Batch.id, Run.status.not_in(RunStatus.terminal()))
            .exists(),
        )
    ).all()
    started = [child_finished_txn(session, batch_id) for batch_id in candidates]
    return [run_id for run_id in started if run_id is not None]
