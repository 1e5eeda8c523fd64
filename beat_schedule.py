"""What beat fires, in an ops team's words. Beat is the clock; Postgres decides what really runs.

SCHEDULES are the shipped jobs; operators add to or override them with the JSON file named by
NIGHTSHIFT_SCHEDULES_FILE (format: pipeline/runs/schedule_list.py). Beat itself sends only the
runtime's messages: the tick, and the schedule check, which works out from the schedule list
and the recorded fires in Postgres which slots are due. Beat's own state file decides nothing.
Policies and DST rules: docs/schedules.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab

from pipeline.settings import Settings
from pipeline.slots import Missed, Overlap, Schedule

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")

SCHEDULES: tuple[Schedule, ...] = (
    # The ops team's nightly report, at 02:00 their time. Run late rather than not at all
    # (until 08:00); if last night's report is still going, tonight's waits for it.
    Schedule(
        name="nightly-report-ops",
        agent="nightly_report",
        minute="0",
        hour="2",
        timezone=BERLIN,
        params={"team": "ops"},
        missed=Missed.ONCE,
        catch_up=timedelta(hours=6),
        overlap=Overlap.BUFFER_ONE,
    ),
    # Competitor prices at 02:00 New York time, before the US market opens. Yesterday's sweep
    # still running is stale by now: cancel it and start fresh.
    Schedule(
        name="competitor-monitor",
        agent="competitor_monitor",
        minute="0",
        hour="2",
        timezone=NEW_YORK,
        missed=Missed.ONCE,
        catch_up=timedelta(hours=4),
        overlap=Overlap.CANCEL_OTHER,
    ),
    # Invoice reminders every Monday at 09:00 Berlin time. A reminder on Monday afternoon is
    # fine, on Tuesday it is not; never two rounds at once.
    Schedule(
        name="invoice-reminders",
        agent="invoice_reminders",
        day_of_week="mon",
        minute="0",
        hour="9",
        timezone=BERLIN,
        missed=Missed.ONCE,
        catch_up=timedelta(hours=8),
        overlap=Overlap.SKIP,
    ),
)


def beat_entries(settings: Settings) -> dict[str, dict[str, Any]]:
    """Beat's entries; its intervals come from the settings (read when Celery configures
    itself, not at import)."""
    tick = settings.tick_seconds
    # How often the schedule check runs: a slot starts at most this long after its time.
    check = settings.schedule_check_seconds
    return {
        # The runtime's own heartbeat: resume runs that lost their worker, wake due timers.
        "nightshift-tick": {
            "task": "pipeline.tick",
            "schedule": timedelta(seconds=tick),
            "options": {"expires": tick * 2},
        },
        # Retention at 04:30 UTC: redact finished runs older than NIGHTSHIFT_RETENTION_DAYS,
        # delete compact records older than NIGHTSHIFT_RETENTION_DELETE_DAYS.
        "nightshift-cleanup": {
            "task": "pipeline.cleanup",
            "schedule": crontab(minute="30", hour="4"),
            "options": {"expires": 3600},
        },
        # Every schedule in SCHEDULES (and the schedules file): fire due slots once each, apply
        # the missed and overlap policies, start buffered slots whose predecessor finished.
        "nightshift-schedules": {
            "task": "pipeline.fire_schedules",
            "schedule": timedelta(seconds=check),
            "options": {"expires": check * 2},
        },
    }
