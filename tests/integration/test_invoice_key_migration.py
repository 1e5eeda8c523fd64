"""Upgrading in the middle of a week reminds no one twice: migration 0017 gives each client's
sent reminder of the week (keyed per invoice before) the new per-client key, which the new
code finds; a real worker then reminds only the clients nobody reminded yet. A reminder whose
outcome was still unknown takes the new key too, so a rerun of the week waits for it to be
settled instead of sending another."""

from __future__ import annotations

import json
import uuid
from typing import Any

from alembic import command
from sqlalchemy import select, text

from models import Action, ActionAudit, ActionState, JournalEntry, RunStatus
from pipeline.db import dispose_all, transaction
from pipeline.migrate import alembic_config, upgrade
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.start import create_run_txn, start_run
from pipeline.sandbox.web import OVERDUE_INVOICES
from pipeline.views.actions import show_action
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import wait_for_status

DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}
ACME_FIRST, GLOBEX, ACME_SECOND = "INV-2026-1040", "INV-2026-1041", "INV-2026-1050"


def old_run(
    date: str,
    sent: list[str],
    *,
    compacted: bool = False,
    state: ActionState = ActionState.CONFIRMED,
    status: str = "succeeded",
) -> uuid.UUID:
    """A finished run of the old code: its journaled list and a reminder per invoice in `sent`
    (confirmed, unless `state` says otherwise), keyed `invoice_reminders:<invoice>:<iso
    week>`."""
    week = {"2026-11-30": "2026-W49", "2026-09-28": "2026-W40"}[date]
    listed = {"tool_use_id": "toolu_list", "name": "list_overdue_invoices", "is_error": False,
              "content": json.dumps({"invoices": list(OVERDUE_INVOICES)})}  # fmt: skip
    with transaction() as session:
        run_id = create_run_txn(session, "invoice_reminders", {"date": date}).run_id
        session.add(
            JournalEntry(
                run_id=run_id,
                key="tool:toolu_list",
                step=0,
                step_name="list_overdue_invoices",
                compacted=compacted,
                payload={"compacted": True} if compacted else listed,
            )
        )
        for minutes, invoice in enumerate(reversed(sent)):  # sent in the order given
            key = f"invoice_reminders:{invoice}:{week}"
            session.add(
                Action(
                    idempotency_key=key,
                    run_id=run_id,
                    tool="send_invoice_reminder",
                    service="email",
                    state=state,
                    attempts=1,
                    args={"invoice": invoice, "subject": "s", "body": "b"},
                    first_attempt_at=text(f"now() - interval '{minutes} minutes'"),
                    approvers=[],
                )
            )
            session.add(ActionAudit(action_key=key, run_id=run_id, event="happened", by="ops",
                                    via="cli (OS user)"))  # fmt: skip
        session.flush()
        session.execute(
            text("UPDATE runs SET status = :status, finished_at = now() WHERE id = :id"),
            {"id": run_id, "status": status},
        )
    return run_id


def downgraded_to_before_0017(db_url: str) -> None:
    """The schema back to just before 0017 (later migrations drop their columns), so the test
    keeps working as columns come; the rows were written through today's models."""
    dispose_all()
    command.downgrade(alembic_config(db_url), "0017-1")
    dispose_all()


def keys() -> dict[str, Any]:
    with transaction() as session:
        return {a.idempotency_key: a.args.get("invoice") for a in session.scalars(select(Action))}


def test_an_upgrade_mid_week_reminds_no_one_twice(
    db_url: str, sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a database of the old release: Monday's run reminded acme twice (two invoices)
    # and globex once, keyed per invoice; a run of an old week has its list compacted away.
    # The rows are written through today's models, then the schema goes back to just before
    # 0017 (later migrations drop their columns), so the test keeps working as columns come.
    old_run("2026-11-30", [ACME_FIRST, GLOBEX, ACME_SECOND])
    old_run("2026-09-28", [ACME_FIRST], compacted=True)
    downgraded_to_before_0017(db_url)

    # when the upgrade migrates it
    upgrade(db_url)

    # then each client's first reminder of the week has the new key; the rest keep theirs
    assert keys() == {
        "invoice-reminder:acme:2026-W49": ACME_FIRST,
        "invoice-reminder:globex:2026-W49": GLOBEX,
        f"invoice_reminders:{ACME_SECOND}:2026-W49": ACME_SECOND,
        f"invoice_reminders:{ACME_FIRST}:2026-W40": ACME_FIRST,
    }
    with transaction() as session:
        audited = set(session.scalars(select(ActionAudit.action_key)))
    assert "invoice-reminder:acme:2026-W49" in audited, "the audit trail follows the key"

    # when Wednesday's rerun of the same ISO week runs on the new release
    processes("w1")
    rerun = start_run("invoice_reminders", {"date": "2026-12-02"}).run_id
    row = wait_for_status(rerun, DONE, timeout=90)

    # then acme and globex are not reminded again, and every other client once, with one
    # email for all their overdue invoices
    assert row.status == RunStatus.SUCCEEDED, row.error
    reminded = sorted(d["to"] for d in sandbox.email.deliveries())
    others = {str(i["email"]) for i in OVERDUE_INVOICES if i["client"] not in {"acme", "globex"}}
    assert reminded == sorted(others)


def test_a_reminder_whose_outcome_was_unknown_at_the_upgrade_is_not_sent_again(
    db_url: str, sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a database of the old release: Monday's run reminded acme, then its worker died
    # sending globex's reminder and the run was cancelled, globex's outcome left unknown
    old_run("2026-11-30", [ACME_FIRST])
    monday = old_run("2026-11-30", [GLOBEX], state=ActionState.OUTCOME_UNKNOWN,
                     status="cancelled")  # fmt: skip
    downgraded_to_before_0017(db_url)

    # when the upgrade migrates it
    upgrade(db_url)

    # then globex's open reminder holds the new key, still open, and its audit trail names the
    # key the email API saw (what a person checks before deciding)
    owed = "invoice-reminder:globex:2026-W49"
    assert keys() == {"invoice-reminder:acme:2026-W49": ACME_FIRST, owed: GLOBEX}
    shown = show_action(owed)
    assert (shown["state"], shown["run_id"]) == (ActionState.OUTCOME_UNKNOWN.value, str(monday))
    assert len(shown["audit"]) == 2 and shown["audit"][-1]["event"] == "rekeyed"
    assert f"invoice_reminders:{GLOBEX}:2026-W49" in shown["audit"][-1]["note"]

    # when Wednesday's rerun of the same ISO week runs on the new release
    processes("beat", beat=True)
    processes("w1")
    rerun = start_run("invoice_reminders", {"date": "2026-12-02"}).run_id

    # then it reminds the others and waits on globex's open reminder instead of sending one
    waiting = wait_for_status(rerun, {RunStatus.NEEDS_ATTENTION.value, *DONE}, timeout=90)
    assert (waiting.status, waiting.waiting_on) == (RunStatus.NEEDS_ATTENTION, f"conflict:{owed}")
    globex = {str(i["email"]) for i in OVERDUE_INVOICES if i["client"] == "globex"}
    assert not globex & {d["to"] for d in sandbox.email.deliveries()}

    # when a person finds Monday's email at the email API and says it happened
    decide(owed, Decision.HAPPENED, Actor("ops@example.com", "cli (OS user)"))

    # then the rerun finishes without reminding globex; everyone else heard once
    row = wait_for_status(rerun, DONE, timeout=90)
    assert row.status == RunStatus.SUCCEEDED, row.error
    reminded = sorted(d["to"] for d in sandbox.email.deliveries())
    others = {str(i["email"]) for i in OVERDUE_INVOICES if i["client"] not in {"acme", "globex"}}
    assert reminded == sorted(others)
