"""Slot math: cron fields read in the schedule's own timezone, correct across DST changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pipeline.errors import ScheduleError
from pipeline.keys import slot_key
from pipeline.runs.schedule_list import load_schedules
from pipeline.slots import Missed, Overlap, Schedule, parse_field, wall_to_instant

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def daily(hour: str, zone: ZoneInfo, minute: str = "0") -> Schedule:
    return Schedule(name="daily", agent="nightly_report", minute=minute, hour=hour, timezone=zone)


def slots_on(schedule: Schedule, day: datetime) -> list[str]:
    """The slots of one local day, as local ISO times."""
    start = day.replace(tzinfo=schedule.timezone)
    found = schedule.slots(start - timedelta(seconds=1), start + timedelta(hours=23, minutes=59))
    return [schedule.local(slot).isoformat() for slot in found]


# -- cron fields ----------------------------------------------------------------------------


def test_cron_fields_read_like_crontab() -> None:
    assert parse_field("minute", "*/15") == {0, 15, 30, 45}
    assert parse_field("hour", "8-18/5") == {8, 13, 18}
    assert parse_field("day_of_week", "mon-fri") == {1, 2, 3, 4, 5}
    assert parse_field("day_of_week", "sun,7") == {0}
    assert parse_field("month_of_year", "jan,jul") == {1, 7}
    assert parse_field("minute", "5,10") == {5, 10}


@pytest.mark.parametrize(
    ("name", "spec"),
    [("minute", "60"), ("hour", "x"), ("minute", "*/0"), ("day_of_month", "0"), ("hour", "5-2")],
)
def test_a_bad_cron_field_is_refused(name: str, spec: str) -> None:
    with pytest.raises(ScheduleError):
        parse_field(name, spec)


def test_a_schedule_that_can_never_fire_is_refused() -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        Schedule(name="x", agent="j", day_of_month="30", month_of_year="2")


def test_missed_all_needs_overlap_allow() -> None:
    with pytest.raises(ScheduleError, match="overlap='allow'"):
        Schedule(name="x", agent="j", missed=Missed.ALL, overlap=Overlap.SKIP)
    Schedule(name="x", agent="j", missed=Missed.ALL, overlap=Overlap.ALLOW)


def test_schedules_say_when_in_words() -> None:
    assert daily("2", BERLIN).describe() == "every day at 02:00"
    weekly = Schedule(name="w", agent="j", day_of_week="mon", hour="9", timezone=BERLIN)
    assert weekly.describe() == "Mondays at 09:00"
    assert Schedule(name="m", agent="j", minute="*").describe() == "every minute"
    assert Schedule(name="h", agent="j", minute="30").describe() == "every hour at :30"


# -- ordinary days --------------------------------------------------------------------------


def test_a_daily_slot_is_the_local_time_in_utc() -> None:
    # given 02:00 in Berlin (UTC+1 in winter, UTC+2 in summer)
    schedule = daily("2", BERLIN)
    # then the slot's instant follows the local offset
    assert schedule.slots(utc(2026, 1, 14), utc(2026, 1, 15)) == [utc(2026, 1, 14, 1)]
    assert schedule.slots(utc(2026, 7, 13, 23), utc(2026, 7, 14, 23)) == [utc(2026, 7, 14, 0)]


def test_latest_and_next_slot() -> None:
    schedule = daily("2", NEW_YORK)
    now = utc(2026, 1, 14, 12)
    assert schedule.latest_slot(now) == utc(2026, 1, 14, 7)
    assert schedule.next_slot(now) == utc(2026, 1, 15, 7)
    assert schedule.latest_slot(utc(2026, 1, 14, 7)) == utc(2026, 1, 14, 7)
    assert schedule.next_slot(utc(2026, 1, 14, 7)) == utc(2026, 1, 15, 7)
    assert schedule.is_slot(utc(2026, 1, 14, 7))
    assert not schedule.is_slot(utc(2026, 1, 14, 8))


def test_the_slot_key_names_the_instant_in_utc() -> None:
    assert slot_key("nightly", utc(2026, 3, 8, 7)) == "nightly:2026-03-08T07:00:00+00:00"
    local = datetime(2026, 3, 8, 3, tzinfo=NEW_YORK)
    assert slot_key("nightly", local) == "nightly:2026-03-08T07:00:00+00:00"


# -- spring forward: the wall time does not exist -------------------------------------------


@pytest.mark.parametrize(
    ("zone", "day", "expected_utc"),
    [
        (NEW_YORK, datetime(2026, 3, 8), utc(2026, 3, 8, 7)),  # 02:00 EST -> 03:00 EDT
        (BERLIN, datetime(2026, 3, 29), utc(2026, 3, 29, 1)),  # 02:00 CET -> 03:00 CEST
    ],
)
def test_a_slot_in_the_spring_forward_gap_fires_at_the_end_of_the_gap(
    zone: ZoneInfo, day: datetime, expected_utc: datetime
) -> None:
    # given a 02:00 slot on the night the clocks jump from 02:00 to 03:00
    schedule = daily("2", zone)
    # then it fires once, at 03:00 local, the first instant after the gap
    assert slots_on(schedule, day) == [expected_utc.astimezone(zone).isoformat()]
    assert schedule.local(expected_utc).strftime("%H:%M") == "03:00"


def test_gap_slots_merge_with_a_real_slot_at_the_end_of_the_gap() -> None:
    # given an hourly schedule on the spring-forward night in New York
    hourly = Schedule(name="h", agent="j", minute="0", timezone=NEW_YORK)
    # then 02:00 (missing) and 03:00 are one slot: 23 slots that day, no duplicate
    local = slots_on(hourly, datetime(2026, 3, 8))
    assert len(local) == len(set(local)) == 23
    assert local[1:3] == ["2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"]


def test_a_half_past_slot_in_the_gap_also_moves_to_the_end_of_the_gap() -> None:
    schedule = daily("2", BERLIN, minute="30")
    assert slots_on(schedule, datetime(2026, 3, 29)) == ["2026-03-29T03:00:00+02:00"]
    assert wall_to_instant(datetime(2026, 3, 29, 2, 30), BERLIN) == utc(2026, 3, 29, 1)


# -- fall back: the wall time happens twice -------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "hour", "day", "first_occurrence"),
    [
        (NEW_YORK, "1", datetime(2026, 11, 1), utc(2026, 11, 1, 5, 30)),  # 01:30 EDT
        (BERLIN, "2", datetime(2026, 10, 25), utc(2026, 10, 25, 0, 30)),  # 02:30 CEST
    ],
)
def test_a_slot_in_the_repeated_hour_fires_once_at_its_first_occurrence(
    zone: ZoneInfo, hour: str, day: datetime, first_occurrence: datetime
) -> None:
    # given a slot at half past the hour that the clocks repeat
    schedule = daily(hour, zone, minute="30")
    # then the day has exactly one slot, the first occurrence (summer time)
    assert slots_on(schedule, day) == [first_occurrence.astimezone(zone).isoformat()]
    # and checking again after the second occurrence finds nothing new
    second = first_occurrence + timedelta(hours=1)
    assert schedule.local(second).strftime("%H:%M") == schedule.local(first_occurrence).strftime(
        "%H:%M"
    )
    assert schedule.slots(first_occurrence, second + timedelta(minutes=1)) == []
    assert schedule.latest_slot(second) == first_occurrence


def test_an_hourly_schedule_follows_the_wall_clock_through_fall_back() -> None:
    hourly = Schedule(name="h", agent="j", minute="0", timezone=NEW_YORK)
    local = slots_on(hourly, datetime(2026, 11, 1))
    assert len(local) == 24  # the day has 25 hours; the repeated 01:00 fires once
    assert local[1:3] == ["2026-11-01T01:00:00-04:00", "2026-11-01T02:00:00-05:00"]


def test_the_shipped_02_00_schedules_around_both_dst_changes() -> None:
    # New York's 02:00 on fall-back day exists once (EST); Berlin's happens twice
    assert slots_on(daily("2", NEW_YORK), datetime(2026, 11, 1)) == ["2026-11-01T02:00:00-05:00"]
    assert slots_on(daily("2", BERLIN), datetime(2026, 10, 25)) == ["2026-10-25T02:00:00+02:00"]


# -- the schedules file ---------------------------------------------------------------------


def test_the_schedules_file_adds_overrides_and_disables(tmp_path: Path) -> None:
    # given a file that adds a per-minute schedule, moves the report, disables the reminders
    path = tmp_path / "schedules.json"
    entries = [
        {"name": "minutely", "agent": "nightly_report", "minute": "*", "hour": "*",
         "params": {"team": "ops"}, "missed": "skip", "overlap": "allow",
         "catch_up_minutes": 30},
        {"name": "nightly-report-ops", "hour": "3", "timezone": "America/New_York"},
        {"name": "invoice-reminders", "enabled": False},
    ]  # fmt: skip
    path.write_text(json.dumps({"schedules": entries}))
    # when the schedules are loaded
    schedules = {s.name: s for s in load_schedules(path)}
    # then the file's changes are there, and the shipped fields not named are kept
    assert "invoice-reminders" not in schedules
    assert schedules["minutely"].catch_up == timedelta(minutes=30)
    assert schedules["minutely"].missed is Missed.SKIP
    report = schedules["nightly-report-ops"]
    assert (report.hour, report.timezone.key, report.params) == (
        "3",
        "America/New_York",
        {"team": "ops"},
    )
    assert report.overlap is Overlap.BUFFER_ONE


def test_a_bad_schedules_file_fails_clearly(tmp_path: Path) -> None:
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps([{"name": "x", "job": "j", "timezone": "Mars/Olympus"}]))
    with pytest.raises(ScheduleError, match="'x'"):
        load_schedules(path)
    path.write_text("{not json")
    with pytest.raises(ScheduleError, match="line 1, column 2: not JSON"):
        load_schedules(path)
    path.write_text('{"schedules": [\n  {"name": "y", "agent": "a"},\n  {"agent": "b"}]}')
    with pytest.raises(ScheduleError, match="line 3, column 3: an entry has no name"):
        load_schedules(path)
    with pytest.raises(ScheduleError, match="cannot be read: No such file"):
        load_schedules(tmp_path / "missing.json")
