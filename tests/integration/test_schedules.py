"""Schedules against real PostgreSQL: each slot fires once, missed and overlap policies decide,
and two real beats at once start one run per slot."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select, update

from models import (
    Action,
    ActionState,
    Batch,
    BatchStatus,
    FireDecision,
    Run,
    RunStatus,
    ScheduleFire,
)
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.engine.step import StepOutcome, execute_step
from pipeline.errors import ScheduleError, StatusConflict, UnknownAgent
from pipeline.keys import slot_key
from pipeline.runs.decisions import Decision, decide
from pipeline.runs.schedules import check_schedule, check_schedules, fire
from pipeline.runs.start import create_run_txn
from pipeline.runs.tick import tick
from pipeline.settings import get_settings
from pipeline.slots import Missed, Overlap, Schedule
from tests.integration.api_fixtures import PRICING_ACTOR
from tests.integration.conftest import ProcessFactory
from tests.support import nightshift

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def nightly(**policies: object) -> Schedule:
    fields: dict = {"missed": Missed.ONCE, "overlap": Overlap.SKIP} | policies
    return Schedule(
        name="nightly-report-ops", agent="nightly_report", minute="0", hour="2",
        timezone=BERLIN, params={"team": "ops"}, **fields,
    )  # fmt: skip


def berlin(day: int, hour: int, minute: int = 0, second: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=BERLIN)


def fires(schedule: str) -> list[ScheduleFire]:
    with transaction() as session:
        query = select(ScheduleFire).where(ScheduleFire.schedule == schedule)
        return list(session.scalars(query.order_by(ScheduleFire.slot)))


def by_local_time(schedule: Schedule, rows: list[ScheduleFire]) -> dict[str, str]:
    return {schedule.local(r.slot).strftime("%m-%d %H:%M"): r.decision.value for r in rows}


def runs() -> list[Run]:
    with transaction() as session:
        return list(session.scalars(select(Run).order_by(Run.created_at)))


def set_status(run_id: uuid.UUID | None, status: RunStatus) -> None:
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(status=status))


def run(run_id: uuid.UUID | None) -> Run:
    with transaction() as session:
        return session.execute(select(Run).where(Run.id == run_id)).scalar_one()


# -- one run per slot -----------------------------------------------------------------------


def test_a_slot_fires_once_however_often_it_is_asked_for(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # given the nightly report at 02:00 Berlin
    schedule = nightly()
    at = berlin(30, 2, 0, 20)
    # when one beat's check fires the slot, a second beat and a redelivered message check
    # again, and an operator fires the same slot by hand
    first = check_schedule(schedule, now=at)
    again = check_schedule(schedule, now=at + timedelta(seconds=5))
    redelivered = check_schedule(schedule, now=at + timedelta(seconds=40))
    with caplog.at_level(logging.INFO, logger="nightshift.schedules"):
        manual = fire(schedule.name, now=at + timedelta(minutes=1), schedules=[schedule])
    # then one row and one run; the manual fire is counted on the row and starts nothing,
    # and its log line says so
    assert [d.decision for d in first] == [FireDecision.FIRED]
    assert again == redelivered == []
    assert manual.duplicate and manual.run_id == first[0].run_id
    assert "already fired, nothing started (asked again 1 time(s))" in caplog.messages[-1]
    [row] = fires(schedule.name)
    assert (row.decision, row.duplicates, row.run_id) == (FireDecision.FIRED, 1, first[0].run_id)
    [only] = runs()
    assert only.input == {"team": "ops", "date": "2026-11-30"}
    assert only.idempotency_key == "nightly-report-ops:2026-11-30T01:00:00+00:00"


def test_concurrent_checks_of_one_slot_start_one_run(db_url: str) -> None:
    # given eight checks of the same slot at the same moment (beats, workers, redeliveries)
    schedule = nightly()
    at = berlin(30, 2, 0, 5)
    barrier = threading.Barrier(8)
    results: list[int] = []

    def check() -> None:
        barrier.wait()
        results.append(len(check_schedule(schedule, now=at)))

    threads = [threading.Thread(target=check) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then exactly one of them fired it
    assert sorted(results) == [0] * 7 + [1]
    assert len(fires(schedule.name)) == len(runs()) == 1


def test_manual_fire_checks_the_slot(db_url: str) -> None:
    schedule = nightly()
    now = berlin(30, 12)
    with pytest.raises(ScheduleError, match="not a slot"):
        fire(schedule.name, now=now, slot=berlin(30, 2, 30), schedules=[schedule])
    with pytest.raises(ScheduleError, match="in the future"):
        fire(schedule.name, now=now, slot=berlin(31, 2, month=12), schedules=[schedule])
    # a slot without an offset is read in the schedule's timezone
    decision = fire(schedule.name, now=now, slot=datetime(2026, 11, 29, 2), schedules=[schedule])
    assert decision.slot == berlin(29, 2)
    assert (decision.decision, decision.reason) == (FireDecision.FIRED, "fired by hand")


def test_an_agent_that_is_not_registered_fails_clearly_and_records_nothing(db_url: str) -> None:
    # given a schedule naming an agent nobody has registered, next to the report
    monitor = Schedule(name="competitor-monitor", agent="price_scraper", hour="2",
                       timezone=BERLIN)  # fmt: skip
    report = nightly()
    # when both are due
    result = check_schedules(now=berlin(30, 2, 0, 30), schedules=[monitor, report])
    # then the monitor's error names the agent, nothing is recorded for it, the report fires
    assert "unknown agent 'price_scraper'" in result.errors["competitor-monitor"]
    assert fires("competitor-monitor") == []
    assert [d.schedule for d in result.decisions] == ["nightly-report-ops"]
    with pytest.raises(UnknownAgent):
        fire("competitor-monitor", now=berlin(30, 3), schedules=[monitor])


# -- DST ------------------------------------------------------------------------------------


def test_the_spring_forward_slot_fires_at_03_00_local_with_the_right_date(db_url: str) -> None:
    # given a 02:00 New York schedule on the night 02:00 does not exist
    schedule = Schedule(name="ny-report", agent="nightly_report", hour="2", timezone=NEW_YORK,
                        params={"team": "ops"})  # fmt: skip
    # when checks run at 01:59 and 03:00:30 local
    assert check_schedule(schedule, now=datetime(2026, 3, 8, 6, 59, tzinfo=UTC)) == []
    [decision] = check_schedule(schedule, now=datetime(2026, 3, 8, 7, 0, 30, tzinfo=UTC))
    # then the slot is 03:00 EDT and the report is for March 8
    assert schedule.local(decision.slot).isoformat() == "2026-03-08T03:00:00-04:00"
    assert run(decision.run_id).input["date"] == "2026-03-08"


def test_the_repeated_hour_fires_its_slot_once(db_url: str) -> None:
    # given 01:30 New York on the night 01:00-02:00 happens twice
    schedule = Schedule(name="ny-early", agent="nightly_report", minute="30", hour="1",
                        timezone=NEW_YORK, params={"team": "ops"})  # fmt: skip
    # when checks run just after each 01:30 (EDT, then EST)
    first = check_schedule(schedule, now=datetime(2026, 11, 1, 5, 30, 30, tzinfo=UTC))
    second = check_schedule(schedule, now=datetime(2026, 11, 1, 6, 30, 30, tzinfo=UTC))
    # then only the first occurrence fired
    assert [d.decision for d in first] == [FireDecision.FIRED] and second == []
    assert len(runs()) == 1


# -- missed runs ----------------------------------------------------------------------------


def night_sweeps(missed: Missed, catch_up: timedelta = timedelta(hours=6)) -> Schedule:
    return Schedule(
        name="night-sweeps", agent="nightly_report", minute="0", hour="2-4", timezone=BERLIN,
        params={"team": "ops"}, missed=missed, catch_up=catch_up, overlap=Overlap.ALLOW,
    )  # fmt: skip


def ran_last_night(schedule: Schedule) -> None:
    for hour in (2, 3, 4):
        check_schedule(schedule, now=berlin(29, hour, 0, 30))


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        (Missed.SKIP, ["skipped_missed", "skipped_missed", "skipped_missed"]),
        (Missed.ONCE, ["skipped_missed", "skipped_missed", "caught_up"]),
        (Missed.ALL, ["caught_up", "caught_up", "caught_up"]),
    ],
)
def test_down_at_two_up_at_five_the_missed_policy_decides(
    db_url: str, missed: Missed, expected: list[str]
) -> None:
    # given slots at 02:00, 03:00 and 04:00 that fired last night
    schedule = night_sweeps(missed)
    ran_last_night(schedule)
    # when the system is down from 01:00 tonight and its first check is at 05:00
    check_schedule(schedule, now=berlin(30, 5))
    # then tonight's slots are decided from the recorded fires by the policy
    tonight = {k: v for k, v in by_local_time(schedule, fires(schedule.name)).items() if "30 " in k}
    assert tonight == dict(
        zip(["11-30 02:00", "11-30 03:00", "11-30 04:00"], expected, strict=True)
    )
    assert len(runs()) == 3 + expected.count("caught_up")
    # and a catch-up run is for its own slot's date and key
    caught_up = [r for r in fires(schedule.name) if r.decision is FireDecision.CAUGHT_UP]
    for row in caught_up:
        assert run(row.run_id).idempotency_key == slot_key(schedule.name, row.slot)
        assert "first checked" in row.reason


def test_slots_older_than_the_catch_up_window_are_left_alone(db_url: str) -> None:
    # given a catch-up window of 2h30
    schedule = night_sweeps(Missed.ALL, catch_up=timedelta(hours=2, minutes=30))
    ran_last_night(schedule)
    # when the first check after the outage is at 05:00
    check_schedule(schedule, now=berlin(30, 5))
    # then 02:00 (3 hours ago) is neither run nor recorded; 03:00 and 04:00 are caught up
    tonight = {k: v for k, v in by_local_time(schedule, fires(schedule.name)).items() if "30 " in k}
    assert tonight == {"11-30 03:00": "caught_up", "11-30 04:00": "caught_up"}


def test_with_missed_once_a_slot_on_time_supersedes_the_missed_ones(db_url: str) -> None:
    # given an hourly schedule that ran until 01:00
    schedule = Schedule(name="hourly", agent="nightly_report", minute="0", timezone=BERLIN,
                        params={"team": "ops"}, missed=Missed.ONCE,
                        overlap=Overlap.ALLOW)  # fmt: skip
    check_schedule(schedule, now=berlin(30, 1, 0, 10))
    # when the next check is at 05:00:30
    decisions = check_schedule(schedule, now=berlin(30, 5, 0, 30))
    # then 05:00 fires on time and 02:00-04:00 are skipped, saying why
    assert [(schedule.local(d.slot).hour, d.decision.value) for d in decisions] == [
        (2, "skipped_missed"), (3, "skipped_missed"), (4, "skipped_missed"), (5, "fired"),
    ]  # fmt: skip
    assert "is on time" in decisions[0].reason
    assert len(runs()) == 2
    # and 00:00, before the schedule's first recorded slot, was never missed
    assert min(r.slot for r in fires(schedule.name)) == berlin(30, 1)


def test_a_new_schedule_does_not_catch_up_slots_from_before_it_existed(db_url: str) -> None:
    schedule = nightly(missed=Missed.ALL, overlap=Overlap.ALLOW)
    assert check_schedule(schedule, now=berlin(30, 5)) == []
    assert fires(schedule.name) == []


# -- overlap --------------------------------------------------------------------------------


def test_overlap_skip_records_the_busy_run(db_url: str) -> None:
    # given last night's report is still running
    schedule = nightly(overlap=Overlap.SKIP)
    [last_night] = check_schedule(schedule, now=berlin(29, 2, 0, 10))
    # when tonight's slot comes
    [tonight] = check_schedule(schedule, now=berlin(30, 2, 0, 10))
    # then it is skipped, naming the run it waited on
    assert tonight.decision is FireDecision.SKIPPED_OVERLAP
    assert str(last_night.run_id) in tonight.reason and "overlap=skip" in tonight.reason
    assert len(runs()) == 1


def test_overlap_allow_starts_anyway(db_url: str) -> None:
    schedule = nightly(overlap=Overlap.ALLOW)
    check_schedule(schedule, now=berlin(29, 2, 0, 10))
    [tonight] = check_schedule(schedule, now=berlin(30, 2, 0, 10))
    assert tonight.decision is FireDecision.FIRED and "overlap=allow" in tonight.reason
    assert [r.status for r in runs()] == [RunStatus.RUNNING, RunStatus.RUNNING]


def test_overlap_buffer_one_keeps_the_newest_slot_and_starts_it_when_the_other_ends(
    db_url: str,
) -> None:
    # given the report of the 28th is still running
    schedule = nightly(overlap=Overlap.BUFFER_ONE)
    [busy] = check_schedule(schedule, now=berlin(28, 2, 0, 10))
    # when the 29th and the 30th come while it runs
    [buffered] = check_schedule(schedule, now=berlin(29, 2, 0, 10))
    newer = check_schedule(schedule, now=berlin(30, 2, 0, 10))
    # then the 30th is buffered and replaces the 29th, which is recorded as skipped
    assert buffered.decision is FireDecision.BUFFERED
    assert by_local_time(schedule, fires(schedule.name)) == {
        "11-28 02:00": "fired", "11-29 02:00": "skipped_overlap", "11-30 02:00": "buffered",
    }  # fmt: skip
    assert {d.decision for d in newer} == {FireDecision.BUFFERED, FireDecision.SKIPPED_OVERLAP}
    assert len(runs()) == 1
    # when the running report finishes, the next check starts the buffered slot
    assert check_schedule(schedule, now=berlin(30, 3)) == []
    set_status(busy.run_id, RunStatus.SUCCEEDED)
    [started] = check_schedule(schedule, now=berlin(30, 3, 0, 30))
    assert (started.slot, started.decision) == (berlin(30, 2), FireDecision.FIRED)
    assert "started" in started.reason and run(started.run_id).input["date"] == "2026-11-30"
    assert by_local_time(schedule, fires(schedule.name))["11-30 02:00"] == "fired"


def test_overlap_cancel_other_cancels_the_previous_run_and_starts(db_url: str) -> None:
    # given last night's report is waiting (for an approval, say)
    schedule = nightly(overlap=Overlap.CANCEL_OTHER)
    [last_night] = check_schedule(schedule, now=berlin(29, 2, 0, 10))
    set_status(last_night.run_id, RunStatus.WAITING)
    # when tonight's slot comes
    [tonight] = check_schedule(schedule, now=berlin(30, 2, 0, 10))
    # then last night's run is cancelled and tonight's started
    assert tonight.decision is FireDecision.CANCELLED_OTHER and tonight.run_id
    old = run(last_night.run_id)
    assert (old.status, old.stop_reason) == (RunStatus.CANCELLED, "replaced_by_newer_slot")
    assert old.cancel_requested_by and "nightly-report-ops" in old.cancel_requested_by
    assert run(tonight.run_id).status is RunStatus.RUNNING


def test_overlap_cancel_other_cancels_the_unfinished_runs_of_a_running_batch(
    db_url: str, register_agents: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a batch job whose last batch has one finished and one running child (whose
    # services are configured, though nothing here reaches them)
    for name in ("NIGHTSHIFT_WEB_URL", "NIGHTSHIFT_EMAIL_URL"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    get_settings.cache_clear()
    register_agents("tests.fixture_agents:TEST_BATCH")
    schedule = Schedule(name="batchy", agent="test_batch", hour="2", timezone=NEW_YORK,
                        overlap=Overlap.CANCEL_OTHER)  # fmt: skip
    [first] = check_schedule(schedule, now=datetime(2026, 11, 29, 7, 0, 10, tzinfo=UTC))
    done, running = (r.id for r in runs())
    set_status(done, RunStatus.SUCCEEDED)
    # when the next slot comes
    [second] = check_schedule(schedule, now=datetime(2026, 11, 30, 7, 0, 10, tzinfo=UTC))
    # then the running child is asked to stop, the finished one is left alone, a new batch runs
    assert second.decision is FireDecision.CANCELLED_OTHER
    assert first.batch_id and first.batch_id in second.reason
    assert run(running).cancel_requested and not run(done).cancel_requested
    assert second.batch_id == slot_key("batchy", datetime(2026, 11, 30, 7, tzinfo=UTC))

    # and when the cancelled child stops at its next check and the tick looks for batches
    # to join, the old batch stays stopped: it never starts its synthesis (finding 6c)
    assert execute_step(running, "test-worker").outcome is StepOutcome.STOPPED
    assert run(running).status is RunStatus.CANCELLED
    tick()
    old = batch_row(first.batch_id)
    assert (old.status, old.stop_reason) == (BatchStatus.STOPPED, "replaced_by_newer_slot")
    assert old.synthesis_run_id is None
    assert [r.agent for r in runs()].count("price_synthesis") == 0


def test_cancel_other_stops_an_old_synthesis_and_withdraws_its_proposals(
    db_url: str, register_agents: Callable[..., None]
) -> None:
    # given last night's batch is synthesizing: its synthesis waits for a price change to be
    # approved
    register_agents("tests.fixture_agents:TEST_BATCH")
    schedule = Schedule(name="batchy", agent="test_batch", hour="2", timezone=NEW_YORK,
                        overlap=Overlap.CANCEL_OTHER)  # fmt: skip
    [first] = check_schedule(schedule, now=datetime(2026, 11, 29, 7, 0, 10, tzinfo=UTC))
    assert first.batch_id is not None
    synthesis = synthesizing_with_a_proposal(first.batch_id)

    # when the next night's slot replaces it
    [second] = check_schedule(schedule, now=datetime(2026, 11, 30, 7, 0, 10, tzinfo=UTC))

    # then the whole old batch is stopped, its synthesis cancelled, and its proposal can no
    # longer be approved: the old night cannot change prices beside the new one
    assert second.decision is FireDecision.CANCELLED_OTHER
    assert batch_row(first.batch_id).status is BatchStatus.STOPPED
    assert (run(synthesis).status, run(synthesis).stop_reason) == (
        RunStatus.CANCELLED,
        "replaced_by_newer_slot",
    )
    assert all(r.status is RunStatus.SUCCEEDED for r in runs() if r.batch_id == first.batch_id)
    with transaction() as session:
        proposal = session.execute(select(Action)).scalar_one()
    assert proposal.state is ActionState.WITHDRAWN
    with pytest.raises(StatusConflict, match="was withdrawn"):
        decide(proposal.idempotency_key, Decision.APPROVE, PRICING_ACTOR)


def synthesizing_with_a_proposal(batch_id: str) -> uuid.UUID:
    """Every child done; the synthesis parked on a pending price change, as the engine leaves
    it."""
    key = f"price_synthesis:sku-2:{batch_id}"
    with transaction() as session:
        session.execute(
            update(Run).where(Run.batch_id == batch_id).values(status=RunStatus.SUCCEEDED)
        )
        started = create_run_txn(
            session, "price_synthesis", {"batch": batch_id, "children": []}, f"{batch_id}:synthesis"
        )
        session.execute(
            update(Run)
            .where(Run.id == started.run_id)
            .values(status=RunStatus.WAITING, waiting_on=f"approval:{key}", step=3)
        )
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(status=BatchStatus.SYNTHESIZING, synthesis_run_id=started.run_id)
        )
        session.add(
            Action(
                idempotency_key=key, run_id=started.run_id, tool_use_id="toolu_s003_0",
                tool="set_price", service="pricing", state=ActionState.PENDING_APPROVAL,
                args={"sku": "sku-2", "price": 52.0, "currency": "USD", "reason": "market"},
                requires_approval=True, approvers=[PRICING_ACTOR.identity],
            )
        )  # fmt: skip
    return started.run_id


def batch_row(batch_id: str | None) -> Batch:
    with transaction() as session:
        return session.execute(select(Batch).where(Batch.id == batch_id)).scalar_one()


# -- the CLI --------------------------------------------------------------------------------


def test_schedules_list_and_fire_on_the_command_line(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # given a schedules file with an hourly report and an agent nobody registered yet, next to
    # the shipped schedules
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps([{"name": "hourly", "job": "nightly_report", "minute": "0",
                                 "params": {"team": "ops"}},
                                {"name": "scraper", "job": "price_scraper"}]))  # fmt: skip
    monkeypatch.setenv("NIGHTSHIFT_SCHEDULES_FILE", str(path))
    # when an operator fires its latest slot twice and lists the schedules
    assert main(["schedules", "fire", "hourly", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["schedules", "fire", "hourly"]) == 0
    assert "already recorded" in capsys.readouterr().out
    assert main(["schedules", "list", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    # then the second fire started nothing and the list shows the decision and its duplicate
    assert first["decision"] == "fired" and first["run_id"]
    last = listed["hourly"]["last"]
    assert (last["decision"], last["run_id"], last["duplicates"]) == ("fired", first["run_id"], 1)
    assert listed["nightly-report-ops"]["when"] == "every day at 02:00"
    assert listed["nightly-report-ops"]["timezone"] == "Europe/Berlin"
    assert listed["competitor-monitor"]["agent_registered"] is True
    assert listed["scraper"]["agent_registered"] is False
    assert main(["schedules", "list"]) == 0
    assert "(not registered)" in capsys.readouterr().out
    assert main(["schedules", "fire", "nope"]) == 2


def test_schedules_fire_says_its_decision_once(db_url: str, tmp_path: Path) -> None:
    # given an hourly schedule
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps([{"name": "hourly", "job": "nightly_report", "minute": "0",
                                 "params": {"team": "ops"}}]))  # fmt: skip
    # when an operator fires its latest slot with the real command, then fires it again
    fired = nightshift("schedules", "fire", "hourly", NIGHTSHIFT_SCHEDULES_FILE=str(path))
    again = nightshift("schedules", "fire", "hourly", NIGHTSHIFT_SCHEDULES_FILE=str(path))
    # then each says what the slot decided once, in its own words, and logs nothing beside it
    for done, decided in ((fired, ": fired"), (again, "was already recorded: fired")):
        assert done.returncode == 0, done.stderr
        said = done.stdout + done.stderr
        assert said.count(decided) == 1 and said.count("slot") == 1, said
        assert done.stderr == "", said


# -- two real beats -------------------------------------------------------------------------


def test_two_beats_at_once_start_one_run_per_minute_slot(
    db_url: str, processes: ProcessFactory, tmp_path: Path
) -> None:
    # given a per-minute schedule (the shipped ones off), two beats and two workers
    path = tmp_path / "schedules.json"
    entries = [
        {
            "name": "every-minute",
            "job": "nightly_report",
            "minute": "*",
            "hour": "*",
            "params": {"team": "ops"},
            "missed": "skip",
            "overlap": "allow",
        }
    ]
    entries += [
        {"name": name, "enabled": False}
        for name in ("nightly-report-ops", "competitor-monitor", "invoice-reminders")
    ]
    path.write_text(json.dumps(entries))  # fmt: skip
    env = {"NIGHTSHIFT_SCHEDULES_FILE": str(path), "NIGHTSHIFT_SCHEDULE_CHECK_SECONDS": "1"}
    workers = [processes(f"w{i}", env=env) for i in (1, 2)]
    beats = [processes(f"beat{i}", beat=True, env=env) for i in (1, 2)]
    began = datetime.now(UTC)
    # when they run for 70 seconds
    time.sleep(70)
    for beat in beats:
        beat.stop()
    ended = datetime.now(UTC)
    time.sleep(2)  # let the last checks finish
    # then every minute slot in between has exactly one row and one run
    rows = fires("every-minute")
    minutes = {began.replace(second=0, microsecond=0) + timedelta(minutes=i) for i in range(1, 3)}
    expected = {
        m for m in minutes if began + timedelta(seconds=3) < m < ended - timedelta(seconds=3)
    }
    assert expected, "the test should span at least one minute boundary"
    assert expected <= {r.slot for r in rows}
    assert all(r.decision is FireDecision.FIRED and r.run_id for r in rows)
    keys = [r.idempotency_key for r in runs() if r.idempotency_key.startswith("every-minute:")]
    assert sorted(keys) == sorted(slot_key("every-minute", r.slot) for r in rows)
    # and the beats really did race: both sent many checks
    checks = sum(w.log().count("pipeline.fire_schedules") for w in workers)
    assert checks > 60, checks
