"""Retention lets personal data go and keeps the outcome: after compaction no column of any
table holds a reminded client's address or the email's body (what invoice_reminders declares
personal), the runs' results, decisions and costs and the undeclared fields of their actions
stay, and an unknown outcome that compaction kept whole is still reconciled by a person, with
real workers and the sandbox email API."""

from __future__ import annotations

import uuid
from hashlib import sha256
from typing import Any

from sqlalchemy import select, text

from models import Action, ActionState, Artifact, ExternalEvent, Run, RunStatus
from pipeline.db import transaction
from pipeline.runs.cancel import cancel_run
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.retention import cleanup
from pipeline.runs.start import start_run
from pipeline.sandbox.web import OVERDUE_INVOICES
from pipeline.views.actions import list_actions
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import wait_for, wait_for_status

DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}
ADDRESS = str(OVERDUE_INVOICES[0]["email"])
BODY = "Please arrange payment, or reply if it has crossed"
"""A phrase of every reminder's body."""

# Every column that can hold text or bytes: discovered, so a column added later is checked too.
_COLUMNS = text(
    """
    SELECT table_name, column_name, data_type FROM information_schema.columns
     WHERE table_schema = current_schema() AND table_name <> 'alembic_version'
       AND (data_type IN ('text', 'character varying', 'json', 'jsonb', 'ARRAY', 'bytea')
            OR data_type LIKE 'character%')
     ORDER BY table_name, column_name
    """
)


def holding(needle: str) -> set[str]:
    """`table.column` of every column with a row that contains `needle` (in bytes, as text
    with its non-ASCII bytes escaped: the needles are ASCII)."""
    with transaction() as session:
        columns = session.execute(_COLUMNS).all()
        assert len(columns) > 40, "the schema's text and JSON columns were found"
        assert ("artifacts", "content", "bytea") in columns, "and the byte columns"
        found = set()
        for table, column, data_type in columns:
            value = (
                f"encode(\"{column}\", 'escape')" if data_type == "bytea" else f'"{column}"::text'
            )
            hit = session.execute(
                text(f'SELECT 1 FROM "{table}" WHERE {value} ILIKE :needle LIMIT 1'),
                {"needle": f"%{needle}%"},
            ).first()
            if hit is not None:
                found.add(f"{table}.{column}")
    return found


def age(run_id: uuid.UUID, days: int) -> None:
    """Make a run (and its actions' attempts) look `days` old."""
    with transaction() as session:
        for statement in (
            "UPDATE runs SET finished_at = now() - make_interval(days => :days) WHERE id = :id",
            "UPDATE actions SET first_attempt_at = now() - make_interval(days => :days)"
            " WHERE run_id = :id",
        ):
            session.execute(text(statement), {"days": days, "id": run_id})


def test_compaction_leaves_no_address_or_body_and_a_kept_obligation_still_reconciles(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given Monday's reminders, whose worker dies after the first email went out and before
    # its reply was saved, and the run is then cancelled: that reminder's outcome is unknown
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})
    monday = start_run("invoice_reminders", {"date": "2026-11-30"}).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die after the first send")
    assert len(sandbox.email.deliveries()) == 1
    cancel_run(monday, by="ops@example.com")
    processes("healthy")
    assert wait_for_status(monday, DONE, timeout=60).status == RunStatus.CANCELLED
    with transaction() as session:  # an event that started it, as a webhook would have, and
        # a copy of the reminders kept as an artifact, as a tool's large output would be
        session.add(ExternalEvent(source="billing", event_id="ev-1", run_id=monday,
                          payload={"contact": ADDRESS}))  # fmt: skip
        copy = f"To: {ADDRESS}\n\n{BODY} with this email.\n".encode()
        session.add(Artifact(run_id=monday, name="reminders.txt", sha256=sha256(copy).hexdigest(),
                             size=len(copy), content=copy))  # fmt: skip
    before = holding(BODY) | holding(ADDRESS)
    assert {"actions.args", "journal.payload", "events.payload", "artifacts.content"} <= before, (
        "the data is there before compaction (the check can fail)"
    )

    # when retention compacts it, 40 days later
    age(monday, 40)
    report = cleanup()
    assert [c.run_id for c in report.compacted] == [monday]
    assert [k.run_id for k in report.kept] == [monday]

    # then only the open obligation still holds what a lookup needs: its arguments
    assert holding(BODY) == {"actions.args"}
    assert holding(ADDRESS) == set()

    # when a person reconciles it: the kept key and arguments are what they check the email
    # API with, and they say it happened
    [owed] = list_actions(state=ActionState.OUTCOME_UNKNOWN.value, limit=10)
    assert owed["args"]["body"].count(BODY) == 1
    owed_client = owed["args"]["client"]
    assert len(sandbox.email.deliveries(owed["idempotency_key"])) == 1
    decide(owed["idempotency_key"], Decision.HAPPENED, Actor("ops@example.com", "cli (OS user)"))

    # and Wednesday's rerun of the same ISO week runs
    wednesday = start_run("invoice_reminders", {"date": "2026-12-02"}).run_id
    row = wait_for_status(wednesday, DONE, timeout=90)

    # then the first client is not reminded again, and every client heard exactly once
    assert row.status == RunStatus.SUCCEEDED, row.error
    deliveries = sandbox.email.deliveries()
    clients = {invoice["client"] for invoice in OVERDUE_INVOICES}
    assert len(deliveries) == len({d["key"] for d in deliveries}) == len(clients)
    with transaction() as session:
        states = session.execute(text("SELECT state FROM actions")).scalars().all()
    assert set(states) == {ActionState.CONFIRMED.value}

    # and once both runs are old and compacted, no table holds the address or the body
    before = outcome(wednesday)
    age(wednesday, 40)
    assert {c.run_id for c in cleanup().compacted} == {monday, wednesday}
    assert holding(ADDRESS) == set()
    assert holding(BODY) == set()
    assert cleanup().compacted == [], "nothing left to redact"

    # yet each run keeps its outcome: the result, usage and cost, each reminder's state and
    # decision, and what it did not declare personal (the client, the delivery's id and time)
    after = outcome(wednesday)
    assert after["run"] == before["run"] and "sent" in after["run"][0][0]["text"]
    assert after["actions"] == [
        (
            state,
            resolution,
            {**args, "subject": "[redacted]", "body": "[redacted]"},
            {**result, "to": "[redacted]", "subject": "[redacted]"},
        )
        for state, resolution, args, result in before["actions"]
    ]
    assert {args["client"] for _, _, args, _ in after["actions"]} == clients - {owed_client}
    assert all(result["message_id"].startswith("em_") for _, _, _, result in after["actions"])
    with transaction() as session:
        cancelled = session.get(Run, monday)
        assert cancelled is not None and cancelled.input == {"date": "2026-11-30"}
        assert cancelled.status == RunStatus.CANCELLED and cancelled.compacted_at is not None


def outcome(run_id: uuid.UUID) -> dict[str, list[tuple[Any, ...]]]:
    """What a run's outcome is: its result, input, usage and cost, and each action's state,
    resolution, arguments and result."""
    with transaction() as session:
        run = session.execute(
            select(Run.result, Run.input, Run.stop_reason, Run.input_tokens, Run.cost_usd).where(
                Run.id == run_id
            )
        ).one()
        actions = session.execute(
            select(Action.state, Action.resolution, Action.args, Action.result)
            .where(Action.run_id == run_id)
            .order_by(Action.created_at)
        ).all()
    return {"run": [tuple(run)], "actions": [tuple(a) for a in actions]}
