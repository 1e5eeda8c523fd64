"""The progress feed: a run's and a batch's events, from committed rows only, in one order,
resumable from any event; as Server-Sent Events and in `nightshift watch`."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import psycopg
import pytest
from sqlalchemy import text, update

from models import Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.engine.time_limit import give_up
from pipeline.runs import fanout
from pipeline.runs.schedules import check_schedule
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.slots import Schedule
from pipeline.views.feed import (
    START,
    FeedEvent,
    Subject,
    format_position,
    latest_position,
    parse_position,
    read,
)
from tests.integration.api_fixtures import AUTH, client, live_server, make_app
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import ServiceUrls, claim, wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}


def everything(subject: Subject) -> list[FeedEvent]:
    return read(subject, START, limit=10_000).events


def set_status(run_id: uuid.UUID, status: RunStatus, **values: object) -> None:
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(status=status, **values))


def test_a_run_tells_its_story_in_order_once_and_ends(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given the nightly report, run to the end by a real worker
    processes("w1")
    run_id = start_run("nightly_report", REPORT).run_id
    wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)

    # then its feed tells the story: started, each step claimed, the model's replies, the
    # tools' results, the email's action states, and the finish
    events = everything(Subject(run_id=run_id))
    types = [e.type for e in events]
    assert types[0] == "run_started" and types[-1] == "finished"
    assert types[1:3] == ["step_started", "model_replied"]
    assert types.count("step_started") == types.count("model_replied")
    with transaction() as session:
        journal = (
            session.execute(
                text("SELECT key FROM journal WHERE run_id = :r ORDER BY id"), {"r": run_id}
            )
            .scalars()
            .all()
        )
    assert [e.data["key"] for e in events if "key" in e.data and e.type != "action_changed"] == (
        list(journal)
    )
    email = [e.data["state"] for e in events if e.type == "action_changed"]
    assert email == ["intended", "attempted", "confirmed"]
    finished = events[-1].data
    assert (finished["status"], finished["stop_reason"]) == ("succeeded", "completed")
    assert "report" in finished["result"]["text"].lower()
    assert all("summary" in e.data for e in events if e.type in ("model_replied", "tool_result"))
    # in one strictly increasing order, and the feed says it is over
    positions = [e.position for e in events]
    assert positions == sorted(set(positions))
    assert read(Subject(run_id=run_id), events[-1].position).done

    # and a reader resuming after any event gets exactly the rest
    for index in (0, 3, len(events) // 2, len(events) - 1):
        rest = read(Subject(run_id=run_id), events[index].position, limit=10_000).events
        assert [e.id for e in rest] == [e.id for e in events[index + 1 :]]


def test_no_event_is_shown_before_its_transaction_commits_nor_any_after_it(
    db_url: str, services: ServiceUrls
) -> None:
    # given a run, and a transaction that changed it and is still open
    run_id = start_run("nightly_report", REPORT).run_id
    subject = Subject(run_id=run_id)
    before = everything(subject)
    assert [e.type for e in before] == ["run_started"]
    open_txn = psycopg.connect(services.admin_conninfo(db_url.rsplit("/", 1)[1]))
    open_txn.execute("UPDATE runs SET status = 'waiting', waiting_on = 'timer:x' WHERE id = %s",
                     (run_id,))  # fmt: skip
    try:
        # when a later transaction commits a change of another run
        other = start_run("nightly_report", {**REPORT, "team": "pricing"}).run_id
        # then neither shows: the older open transaction holds the feed back
        assert everything(subject) == before
        assert everything(Subject(run_id=other)) == []
        # when the open one commits, both show, the older first
        open_txn.commit()
        assert [e.type for e in everything(subject)] == ["run_started", "waiting"]
        assert [e.type for e in everything(Subject(run_id=other))] == ["run_started"]
        # and a change rolled back never shows
        open_txn.execute("UPDATE runs SET status = 'failed' WHERE id = %s", (run_id,))
        open_txn.rollback()
        assert [e.type for e in everything(subject)] == ["run_started", "waiting"]
    finally:
        open_txn.close()


def test_following_from_the_latest_position_misses_nothing_still_open_and_repeats_nothing(
    db_url: str, services: ServiceUrls
) -> None:
    # given a run, a transaction that changed it and is still open, and a later one that
    # committed
    run_id = start_run("nightly_report", REPORT).run_id
    subject = Subject(run_id=run_id)
    open_txn = psycopg.connect(services.admin_conninfo(db_url.rsplit("/", 1)[1]))
    try:
        open_txn.execute("UPDATE runs SET status = 'waiting', waiting_on = 'timer:x' "
                         "WHERE id = %s", (run_id,))  # fmt: skip
        start_run("nightly_report", {**REPORT, "team": "pricing"})
        # when a page reads where to follow from (and then the run, without that change)
        after = latest_position()
        # then nothing before it comes again, and the open change comes once it commits
        assert read(subject, after).events == []
        open_txn.commit()
        assert [e.type for e in read(subject, after).events] == ["waiting"]
    finally:
        open_txn.close()


def test_a_transaction_open_in_another_database_does_not_hold_the_feed_back(
    db_url: str, services: ServiceUrls
) -> None:
    elsewhere = psycopg.connect(services.admin_conninfo("postgres"))
    elsewhere.execute("CREATE TEMP TABLE holding_an_xid (x int)")  # a write: it has an xid
    try:
        run_id = start_run("nightly_report", REPORT).run_id
        assert [e.type for e in everything(Subject(run_id=run_id))] == ["run_started"]
    finally:
        elsewhere.rollback()
        elsewhere.close()


def test_a_batch_feed_merges_its_runs_and_its_own_changes_and_ends_when_all_are_done(
    db_url: str, register_agents: Callable[..., None]
) -> None:
    # given a batch of two children
    register_agents("tests.fixture_agents:TEST_BATCH")
    schedule = Schedule(name="batchy", agent="test_batch", hour="2")
    [night] = check_schedule(schedule, now=datetime(2026, 11, 29, 2, 0, 10, tzinfo=UTC))
    assert night.batch_id is not None
    subject = Subject(batch_id=night.batch_id)
    children = [e.run_id for e in everything(subject) if e.type == "run_started"]
    assert len(children) == 2
    # when both finish, the synthesis starts, and then finishes too
    with transaction() as session:
        for child in children:
            session.execute(
                update(Run).where(Run.id == uuid.UUID(child)).values(status=RunStatus.SUCCEEDED)
            )
        synthesis = fanout.child_finished_txn(session, night.batch_id)
    assert synthesis is not None
    assert not read(subject, latest_position()).done
    with transaction() as session:
        session.execute(update(Run).where(Run.id == synthesis).values(status=RunStatus.SUCCEEDED))
        fanout.synthesis_finished_txn(session, synthesis, RunStatus.SUCCEEDED)

    # then one feed holds every run's events and the batch's, and says it is over
    events = everything(subject)
    assert [e.type for e in events if e.type == "batch_changed"] == ["batch_changed"] * 3
    assert [e.data["status"] for e in events if e.type == "batch_changed"] == [
        "running", "synthesizing", "succeeded",
    ]  # fmt: skip
    assert {e.run_id for e in events if e.type == "finished"} == {*children, str(synthesis)}
    assert read(subject, events[-1].position).done


# -- Server-Sent Events ---------------------------------------------------------------------


def frames(body: str) -> list[dict[str, str]]:
    """The events of an SSE body: each a dict of its fields (comments dropped)."""
    found = []
    for block in body.strip().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if not line.startswith(":")
        )
        if "event" in fields:
            found.append(fields)
    return found


def test_the_event_stream_sends_the_feed_and_resumes_from_last_event_id(db_url: str) -> None:
    # given a run that finished
    run_id = start_run("nightly_report", REPORT).run_id
    set_status(run_id, RunStatus.WAITING, waiting_on="timer:x")
    set_status(run_id, RunStatus.FAILED, stop_reason="deadline", error="too late")
    api = client()
    # when someone reads its events
    response = api.get(f"/runs/{run_id}/events", headers=AUTH)
    # then they are Server-Sent Events, each with its id, ending with `end`
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    sent = frames(response.text)
    assert [f["event"] for f in sent] == ["run_started", "waiting", "finished", "end"]
    finished = json.loads(sent[2]["data"])
    assert (finished["status"], finished["error"], finished["run_id"]) == (
        "failed", "too late", str(run_id),
    )  # fmt: skip
    # and a client that reconnects after the first event gets the rest
    again = api.get(f"/runs/{run_id}/events", headers={**AUTH, "Last-Event-ID": sent[0]["id"]})
    assert [f["event"] for f in frames(again.text)] == ["waiting", "finished", "end"]
    by_query = api.get(f"/runs/{run_id}/events?after={sent[1]['id']}", headers=AUTH)
    assert [f["event"] for f in frames(by_query.text)] == ["finished", "end"]


def test_an_event_id_is_digits_only_and_reads_back_as_its_position() -> None:
    # digits only: a header value generated from the document's pattern can be one (issue 31)
    for position in (START, (1, 0), (7, 42), (2**64 - 1, 2**63 - 1)):
        written = format_position(position)
        assert written.isdigit() and parse_position(written) == position
    assert parse_position("0") == START
    assert parse_position("12-34") == (12, 34)  # the earlier form, from a client still following


def test_the_event_stream_refuses_what_it_cannot_follow(db_url: str) -> None:
    api = client()
    run_id = start_run("nightly_report", REPORT).run_id
    assert api.get(f"/runs/{run_id}/events").status_code == 401
    missing = api.get(f"/runs/{uuid.uuid4()}/events", headers=AUTH)
    assert missing.status_code == 404 and "no run has id" in missing.json()["error"]
    assert api.get("/runs/nope/events", headers=AUTH).status_code == 404
    for resume in ("yesterday", "", "1-2x"):
        bad = api.get(f"/runs/{run_id}/events", headers={**AUTH, "Last-Event-ID": resume})
        assert bad.status_code == 422 and "not a position of this feed" in bad.json()["error"]
    for after in ("", "1-", "123456789012345678901-1", "1" * 40):
        bad = api.get(f"/runs/{run_id}/events?after={after}", headers=AUTH)
        assert bad.status_code == 422 and "not a position of this feed" in bad.json()["error"]
    unknown = api.get("/batches/no:such:batch/events", headers=AUTH)
    assert unknown.status_code == 404 and "no batch has id" in unknown.json()["error"]


def test_a_live_stream_shows_each_change_as_it_commits(db_url: str) -> None:
    # given a client following a run's events over a real connection
    run_id = start_run("nightly_report", REPORT).run_id
    received: list[dict[str, str]] = []
    got_two = threading.Event()

    def follow(base: str) -> None:
        with httpx.stream(
            "GET", f"{base}/runs/{run_id}/events", headers=AUTH, timeout=30
        ) as response:
            block: dict[str, str] = {}
            for line in response.iter_lines():
                if not line:
                    if "event" in block:
                        received.append(block)
                        if len(received) == 2:
                            got_two.set()
                    block = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(": ")
                    block[name] = value

    with live_server(make_app()) as base:
        follower = threading.Thread(target=follow, args=(base,))
        follower.start()
        # when the run starts waiting, and later finishes
        set_status(run_id, RunStatus.WAITING, waiting_on="timer:x")
        assert got_two.wait(10), received
        assert [f["event"] for f in received] == ["run_started", "waiting"]
        set_status(run_id, RunStatus.CANCELLED, stop_reason="cancelled")
        follower.join(timeout=10)
    # then the client saw each as it happened, and the stream ended by itself
    assert not follower.is_alive()
    assert [f["event"] for f in received] == ["run_started", "waiting", "finished", "end"]


# -- nightshift watch -----------------------------------------------------------------------


def test_watch_prints_the_feed_until_the_run_is_done(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = start_run("nightly_report", REPORT).run_id
    set_status(run_id, RunStatus.WAITING, waiting_on="approval:pr:1")
    set_status(run_id, RunStatus.SUCCEEDED, stop_reason="completed")
    assert main(["watch", str(run_id), "--history", "--interval", "0.1"]) == 0
    lines = [line.split("  ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines[0].startswith("nightly_report succeeded")
    assert lines[1:] == [
        "started (nightly_report)",
        "waiting on approval:pr:1",
        "succeeded (completed)",
    ]


def test_watch_history_stamps_each_event_with_when_it_happened(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a run whose events happened two nights ago
    run_id = start_run("nightly_report", REPORT).run_id
    set_status(run_id, RunStatus.SUCCEEDED, stop_reason="completed")
    then = datetime(2026, 11, 29, 3, 4, 5, tzinfo=UTC)
    with transaction() as session:
        session.execute(
            text("UPDATE run_events SET created_at = :then WHERE run_id = :r"),
            {"then": then, "r": run_id},
        )
    # when watch shows its history
    assert main(["watch", str(run_id), "--history", "--interval", "0.1"]) == 0
    # then each event line carries the event's own time, not the time it was printed
    stamps = [line.split("  ", 1)[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert stamps == [then.astimezone().strftime("%H:%M:%S")] * 2


def _expire_lease(run_id: uuid.UUID) -> None:
    with transaction() as session:
        session.execute(
            text("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = :r"),
            {"r": run_id},
        )


def test_a_step_says_which_attempt_it_is_only_after_a_failed_attempt(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a run whose step 0 is claimed and checkpointed, and step 1 claimed: two claims
    # (runs.attempt = 2) and no failure
    run_id = start_run("nightly_report", REPORT).run_id
    assert claim(run_id, "w1:101", 15.0) is not None
    with transaction() as session:
        session.execute(
            text("UPDATE runs SET step = 1, lease_owner = NULL, lease_expires_at = NULL "
                 "WHERE id = :r"), {"r": run_id},
        )  # fmt: skip
    assert claim(run_id, "w1:101", 15.0) is not None
    # when its holder is lost: once taken over by another worker's claim, once by the tick
    _expire_lease(run_id)
    assert claim(run_id, "w2:202", 15.0) is not None
    _expire_lease(run_id)
    assert run_id in tick().resumed
    assert claim(run_id, "w3:303", 15.0) is not None
    # and once its time bound gives the step up (a new fence, no holder: not a claim)
    assert give_up(run_id, "w3:303", 15.0)
    assert claim(run_id, "w4:404", 15.0) is not None

    # then each claim's event, and only a claim's, says which attempt of its step it is: 1
    # until one failed
    starts = [e.data for e in everything(Subject(run_id=run_id)) if e.type == "step_started"]
    assert [(s["step"], s["attempt"], s["step_attempt"]) for s in starts] == [
        (0, 1, 1), (1, 2, 1), (1, 3, 2), (1, 4, 3), (1, 5, 4),
    ]  # fmt: skip
    # and watch shows an attempt only for a step started again after a failure
    set_status(run_id, RunStatus.SUCCEEDED, stop_reason="completed")
    assert main(["watch", str(run_id), "--history", "--interval", "0.1"]) == 0
    started = [line for line in capsys.readouterr().out.splitlines() if "started on" in line]
    assert [line.split("  ", 1)[1] for line in started] == [
        "step 0 started on w1:101",
        "step 1 started on w1:101",
        "step 1 started on w2:202 (attempt 2)",
        "step 1 started on w3:303 (attempt 3)",
        "step 1 started on w4:404 (attempt 4)",
    ]
