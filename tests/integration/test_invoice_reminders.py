"""Invoice reminders with real workers: one email per client and ISO week, one per step,
so a worker killed after the third email resumes at the fourth and nobody hears twice."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from sqlalchemy import select

from models import Action, ActionState, JournalEntry, RunStatus
from pipeline.db import transaction
from pipeline.runs.schedules import fire
from pipeline.runs.start import start_run
from pipeline.sandbox.web import OVERDUE_INVOICES
from pipeline.slots import Overlap, Schedule
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, wait_for, wait_for_status

BERLIN = ZoneInfo("Europe/Berlin")
REMINDERS = Schedule(
    name="invoice-reminders", agent="invoice_reminders", day_of_week="mon", hour="9",
    timezone=BERLIN, overlap=Overlap.SKIP,
)  # fmt: skip
MONDAY = datetime(2026, 11, 30, 9, 5, tzinfo=BERLIN)  # ISO week 2026-W49
CLIENTS = {str(invoice["client"]) for invoice in OVERDUE_INVOICES}
KEYS = {f"invoice-reminder:{client}:2026-W49" for client in CLIENTS}
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}


def confirmed() -> list[Action]:
    """Reminders whose reply was saved, in the order they were sent."""
    with transaction() as session:
        query = select(Action).where(Action.state == ActionState.CONFIRMED)
        return list(session.scalars(query.order_by(Action.first_attempt_at)))


def test_a_worker_killed_after_the_third_reminder_resumes_at_the_fourth(
    sandbox: Sandbox, processes: ProcessFactory, duplicate_report: list[int]
) -> None:
    # given ten overdue clients and an email API that takes a moment to answer each send
    sandbox.email.delay_seconds = 0.3
    processes("beat", beat=True)
    doomed = processes("doomed", concurrency=1)

    # when Monday's slot fires and the worker is SIGKILLed once the third reminder is confirmed
    run_id = fire(REMINDERS.name, now=MONDAY, schedules=[REMINDERS]).run_id
    assert run_id is not None
    wait_for(lambda: len(confirmed()) >= 3, timeout=60, what="three reminders to be sent")
    doomed.kill()
    first_three = [action.idempotency_key for action in confirmed()[:3]]
    assert 3 <= len(sandbox.email.deliveries()) <= 4, "killed after the third email"
    processes("healthy")
    row = wait_for_status(run_id, DONE, timeout=60)

    # then every client got exactly one reminder, and the first three were not sent again
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.fence >= 2, "another worker took the run over"
    deliveries = sandbox.email.deliveries()
    duplicate_report.append(len(deliveries) - len(KEYS))
    assert sorted(d["key"] for d in deliveries) == sorted(KEYS)
    [acme] = [d for d in deliveries if d["key"] == "invoice-reminder:acme:2026-W49"]
    assert "INV-2026-1040, INV-2026-1050" in acme["subject"], "one reminder for both invoices"
    with transaction() as session:
        actions = {a.idempotency_key: a for a in session.scalars(select(Action))}
        sends = session.scalars(
            select(JournalEntry.step).where(
                JournalEntry.run_id == run_id, JournalEntry.step_name == "send_invoice_reminder"
            )
        ).all()
    assert set(actions) == KEYS
    assert all(actions[key].attempts == 1 for key in first_three), "none of the first three resent"
    assert sorted(sends) == list(range(1, 11)), "one reminder per step"
    assert sandbox.web.requests()["/invoices/overdue"] == 1, "the list was replayed, not refetched"
    assert "10 sent" in row.result["text"]

    # and a second run in the same ISO week (Wednesday's rerun) reminds nobody again
    rerun = start_run("invoice_reminders", {"date": "2026-12-02"}).run_id
    again = wait_for_status(rerun, DONE, timeout=60)
    assert again.status == RunStatus.SUCCEEDED, again.error
    assert len(sandbox.email.deliveries()) == len(KEYS)
    assert run_row(run_id).step == 12  # the list, ten reminders, the closing line
