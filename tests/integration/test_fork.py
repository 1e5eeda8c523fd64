"""`nightshift runs fork RUN --from-step N` and `POST /runs/{id}/fork`: a new run that replays
a finished run's journal before step N (no model call or send of those steps again) and goes on
live from N; what it meets of its origin's actions is settled from the origin's record, never
sent twice and never a key conflict; the two name each other. On real workers, with the real
SDK against the Messages API sandbox and an email service that sends every request it gets."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, update

from models import Action, ActionAudit, ActionState, JournalEntry, Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import InvalidInput
from pipeline.runs.cancel import cancel_run, cancel_run_txn
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.fork import fork_run, fork_run_txn
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from pipeline.views.runs import show_run
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_status_page import sign_in
from tests.support import nightshift, wait_for_status

DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
AGENT = "tests.fixture_agents:STATUS_REPORTER"
REQUEST = {"team": "ops", "id": "night-7"}


def emailed(sandbox: Sandbox) -> list[str]:
    """Every email the service sent, by subject, in order: a resend would be a second one."""
    return [delivery["subject"] for delivery in sandbox.email.deliveries()]


def journal_keys(run_id: uuid.UUID) -> list[tuple[int, str]]:
    with transaction() as session:
        rows = session.execute(
            select(JournalEntry.step, JournalEntry.key)
            .where(JournalEntry.run_id == run_id)
            .order_by(JournalEntry.id)
        )
        return [(row.step, row.key) for row in rows]


def start_reporter(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    email_mode: str = "lookup",
) -> Sandbox:
    """A worker with the status reporter; the status page says `outage`; the email service
    honours no key: every request it gets is an email (asked what it sent under a key unless
    `email_mode` is none)."""
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", email_mode)
    get_settings.cache_clear()
    sandbox.email.mode = "no-keys-lookup" if email_mode == "lookup" else "no-keys"
    sandbox.web.sources["status"] = {"title": "outage", "body": "The API is down."}
    register_agents(AGENT)
    processes("worker")
    return sandbox


PART_1 = "status_reporter:night-7:part-1"


@pytest.fixture
def unknown_first_email(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Sandbox, uuid.UUID]:
    """A run whose first email went out but was answered with a 500, from a service that can
    neither dedup a key nor say what it sent (a person must say what happened), cancelled
    instead: the email's outcome stays unknown."""
    start_reporter(sandbox, processes, register_agents, monkeypatch, email_mode="none")
    sandbox.email.status_after_work = 500
    origin = start_run("status_reporter", REQUEST).run_id
    row = wait_for_status(origin, {RunStatus.NEEDS_ATTENTION})
    assert row.waiting_on == f"action:{PART_1}"
    sandbox.email.status_after_work = None
    cancel_run(origin, by="test")
    assert wait_for_status(origin, DONE).status is RunStatus.CANCELLED
    return sandbox, origin


@pytest.fixture
def reporter(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> Sandbox:
    return start_reporter(sandbox, processes, register_agents, monkeypatch)


@pytest.mark.timeout(180)
def test_a_fork_from_step_2_sends_nothing_already_done_and_goes_on_live(
    reporter: Sandbox,
) -> None:
    sandbox = reporter
    # given a run whose steps 0 and 1 each confirmed an email, whose step 2 read the status
    # page (then wrong: `outage`) and whose step 3 emailed it
    origin = start_run("status_reporter", REQUEST).run_id
    row = wait_for_status(origin, DONE)
    assert row.status is RunStatus.SUCCEEDED, row.error
    assert emailed(sandbox) == ["Part 1", "Part 2", "Status: outage"]
    asked = len(sandbox.messages.log.entries())
    assert asked == 5

    # when the page is corrected and an operator forks the run from step 2 by its short id
    sandbox.web.sources["status"]["title"] = "clear"
    forked = nightshift("runs", "fork", str(origin)[:8], "--from-step", "2", "--json")
    assert forked.returncode == 0, forked.stderr
    answer = json.loads(forked.stdout)
    fork = uuid.UUID(answer["run_id"])
    assert answer == {
        "run_id": str(fork), "created": True, "fork_of": str(origin), "from_step": 2
    }  # fmt: skip

    # then the fork replays steps 0-1 from the origin's journal and goes on live from step 2:
    # the model is asked for steps 2-4 only, the page is read again, and the only new email is
    # the status it now says; parts 1 and 2 are not sent again
    row = wait_for_status(fork, DONE)
    assert row.status is RunStatus.SUCCEEDED, row.error
    assert row.result["text"] == "Sent parts 1 and 2 and the status (clear).", row.result
    assert emailed(sandbox) == ["Part 1", "Part 2", "Status: outage", "Status: clear"]
    assert len(sandbox.messages.log.entries()) == asked + 3
    assert sandbox.web.requests()["/sources/status"] == 2
    assert row.idempotency_key == f"fork-of:{origin}:2"
    assert journal_keys(fork)[:4] == journal_keys(origin)[:4]
    assert show_run(fork)["run"]["agent_state"] == {"parts_sent": [1, 2]}  # as steps 0-1 left it
    assert [step for step, _ in journal_keys(fork)] == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    # and each names the other, in the API's record and in `nightshift show`
    assert show_run(fork)["run"]["fork_of"] == {"id": str(origin), "from_step": 2}
    assert show_run(origin)["run"]["forks"] == [
        {"id": str(fork), "status": "succeeded", "from_step": 2}
    ]
    shown = nightshift("show", str(origin))
    assert f"forked from step 2 as run {fork} (succeeded)" in shown.stdout, shown.stderr
    assert f"fork of run {origin} from step 2" in nightshift("show", str(fork)).stdout
    page = client()
    sign_in(page)
    assert f"{str(fork)[:8]}</a> from step 2 (succeeded)" in page.get(f"/ui/runs/{origin}").text
    assert f"{origin}</a> from step 2" in page.get(f"/ui/runs/{fork}").text
    # and asking again starts nothing new
    again = nightshift("runs", "fork", str(origin), "--from-step", "2")
    assert again.returncode == 0, again.stderr
    assert f"already forked from step 2 as run {fork}; nothing new started" in again.stdout

    # when it is forked from step 1 too: its live step 1 means the origin's part-2 email, and
    # its step 3 the first fork's status email
    second = uuid.UUID(client().post(
        f"/runs/{origin}/fork", json={"from_step": 1}, headers=AUTH
    ).json()["run_id"])  # fmt: skip

    # then both are settled from the record that has them: sent by neither, no key conflict
    row = wait_for_status(second, DONE)
    assert row.status is RunStatus.SUCCEEDED, (row.stop_reason, row.error)
    assert emailed(sandbox) == ["Part 1", "Part 2", "Status: outage", "Status: clear"]
    assert sandbox.web.requests()["/sources/status"] == 3
    assert [f["from_step"] for f in show_run(origin)["run"]["forks"]] == [1, 2]


@pytest.mark.timeout(180)
def test_a_fork_carries_on_its_origins_unknown_send_and_never_parks_on_its_key(
    unknown_first_email: tuple[Sandbox, uuid.UUID],
) -> None:
    # given a run that left its first email's outcome unknown (cancelled instead of asking)
    sandbox, origin = unknown_first_email

    # when it is forked from step 0
    fork = fork_run(origin, 0, by="test").started.run_id

    # then the fork takes the origin's open send over as it stands and waits for a person on
    # that action, as the origin would have: no key conflict with its origin, nothing resent
    row = wait_for_status(fork, {RunStatus.NEEDS_ATTENTION})
    assert (row.waiting_on, row.stop_reason) == (f"action:{PART_1}", None)
    with transaction() as session:
        action = session.execute(
            select(Action).where(Action.idempotency_key == PART_1)
        ).scalar_one()
        assert (action.run_id, action.state, action.attempts) == (
            fork, ActionState.OUTCOME_UNKNOWN, 1
        )  # fmt: skip
        events = session.scalars(
            select(ActionAudit.event).where(ActionAudit.action_key == PART_1)
        ).all()
        assert "forked" in events
    assert emailed(sandbox) == ["Part 1"]
    # and once a person says it happened, the fork goes on and sends each email once
    decide(PART_1, Decision.HAPPENED, Actor("oncall@example.com", "test"), note="in the inbox")
    row = wait_for_status(fork, DONE)
    assert row.status is RunStatus.SUCCEEDED, row.error
    assert emailed(sandbox) == ["Part 1", "Part 2", "Status: outage"]


@pytest.mark.timeout(180)
def test_a_fork_of_a_fork_carries_on_what_the_first_run_left_open(
    unknown_first_email: tuple[Sandbox, uuid.UUID],
) -> None:
    # given a run that left its first email's outcome unknown, and a fork of it cancelled in the
    # transaction that started it (it ends before its first model call, the email untouched)
    sandbox, origin = unknown_first_email
    with transaction() as session:
        first = fork_run_txn(session, origin, 0, by="test").started.run_id
        cancel_run_txn(session, first, by="test")
    assert wait_for_status(first, DONE).status is RunStatus.CANCELLED

    # when that fork is forked in turn
    second = fork_run(first, 0, by="test").started.run_id

    # then the second takes the first run's open send over (its origin's origin), and a person
    # is asked about it: no key conflict, nothing resent
    row = wait_for_status(second, {RunStatus.NEEDS_ATTENTION})
    assert (row.waiting_on, row.stop_reason) == (f"action:{PART_1}", None)
    with transaction() as session:
        owner = session.scalar(select(Action.run_id).where(Action.idempotency_key == PART_1))
    assert owner == second
    assert emailed(sandbox) == ["Part 1"]


def test_forks_are_refused_with_the_reason(
    db_url: str, register_agents: Callable[..., None]
) -> None:
    # given a running run, and a finished one of 2 steps whose journal retention compacted
    register_agents(AGENT)
    api = client()
    running = start_run("status_reporter", REQUEST).run_id
    done = start_run("status_reporter", {**REQUEST, "id": "night-8"}).run_id
    with transaction() as session:
        session.execute(update(Run).where(Run.id == done).values(status=RunStatus.FAILED, step=2))

    # when each is forked, then each refusal names what was wrong
    busy = api.post(f"/runs/{running}/fork", json={"from_step": 0}, headers=AUTH)
    assert (busy.status_code, busy.json()) == (409, {"error": (
        f"run {running} is running: only a finished run (succeeded, failed or cancelled) "
        "is forked"
    )})  # fmt: skip
    past = nightshift("runs", "fork", str(done), "--from-step", "3")
    assert past.returncode == 2
    assert past.stderr.strip() == (
        f"nightshift: run {done} has steps 0 to 2: it cannot be forked from step 3"
    )
    assert api.post(f"/runs/{done}/fork", json={"from_step": 3}, headers=AUTH).status_code == 409
    assert api.post(f"/runs/{done}/fork", json={"from_step": -1}, headers=AUTH).status_code == 422
    assert api.post(f"/runs/{done}/fork", json={"from_step": False},
                    headers=AUTH).status_code == 422  # fmt: skip
    assert api.post(f"/runs/{uuid.uuid4()}/fork", json={"from_step": 0},
                    headers=AUTH).status_code == 404  # fmt: skip
    with transaction() as session:
        session.execute(
            update(Run).where(Run.id == done).values(compacted_at=datetime(2026, 12, 1, tzinfo=UTC))
        )
    compacted = api.post(f"/runs/{done}/fork", json={"from_step": 1}, headers=AUTH)
    assert (compacted.status_code, compacted.json()) == (409, {"error": (
        f"run {done} cannot be forked: retention compacted its journal on 2026-12-01"
    )})  # fmt: skip
    # and a caller cannot take a fork's key
    with pytest.raises(InvalidInput, match="keys starting 'fork-of:' are the forks' own"):
        start_run("status_reporter", REQUEST, f"fork-of:{done}:1")
