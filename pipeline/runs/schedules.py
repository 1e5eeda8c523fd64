"""Firing schedule slots: Postgres decides, once per (schedule, slot), what each slot does.

Beat sends `pipeline.fire_schedules` every half minute. Each check works out every schedule's
due slots from the recorded fires (schedule_fires), applies the missed and overlap policies and
records each decision with its reason, in one transaction per schedule that also starts the
job. A second beat, a redelivered message or a manual fire finds the slot recorded and starts
nothing. The behaviour in words: docs/schedules.md; the schedule list: pipeline/slots.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import Batch, BatchStatus, FireDecision, Run, RunStatus, ScheduleFire
from pipeline.agent_definition import BatchPlan, Slot
from pipeline.db import transaction
from pipeline.errors import NightshiftError, ScheduleError
from pipeline.keys import slot_key
from pipeline.registry import get_agent
from pipeline.runs.cancel import cancel_batch_txn, cancel_run_txn
from pipeline.runs.fanout import create_batch_txn
from pipeline.runs.schedule_list import active_schedules, find_schedule
from pipeline.runs.start import create_run_txn
from pipeline.slots import Missed, Overlap, Schedule, wall_to_instant

log = logging.getLogger("nightshift.schedules")

REPLACED = "replaced_by_newer_slot"
"""The stop reason of a run or batch that cancel_other replaced."""

ON_TIME = timedelta(minutes=5)
"""A schedule's newest slot, checked within this long of its time, fires as on time; any other
unrecorded slot is missed (the missed policy decides)."""


# -- jobs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartedJob:
    """What a slot's job started, inside the slot's transaction."""

    run_id: uuid.UUID | None = None
    batch_id: str | None = None


def start_job_txn(session: Session, schedule: Schedule, slot: datetime) -> StartedJob:
    """Ask the schedule's agent what the slot starts (one run, or a batch), and create it."""
    agent = get_agent(schedule.agent)
    context = Slot(
        schedule=schedule.name,
        instant=slot,
        local=schedule.local(slot),
        params=schedule.params,
        key=slot_key(schedule.name, slot),
    )
    plan = agent.job(context)
    # Counted from the slot, not from now: a caught-up slot has less time left, not more.
    deadline = slot + schedule.deadline if schedule.deadline is not None else None
    notify_url = schedule.notify_url
    if isinstance(plan, BatchPlan):
        create_batch_txn(session, plan, deadline=deadline, notify_url=notify_url)
        return StartedJob(batch_id=plan.batch_id)
    started = create_run_txn(
        session, agent.name, plan.input, context.key, deadline=deadline, notify_url=notify_url
    )
    return StartedJob(run_id=started.run_id)


# -- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    schedule: str
    slot: datetime
    decision: FireDecision
    reason: str
    run_id: uuid.UUID | None = None
    batch_id: str | None = None
    duplicates: int = 0
    duplicate: bool = False
    """This request found the slot already recorded: it started nothing."""

    @classmethod
    def of(cls, row: ScheduleFire, duplicate: bool = False) -> Decision:
        return cls(
            row.schedule, row.slot, row.decision, row.reason, row.run_id, row.batch_id,
            row.duplicates, duplicate,
        )  # fmt: skip


@dataclass(frozen=True)
class CheckReport:
    decisions: list[Decision]
    errors: dict[str, str]
    """Schedule name -> why its check failed (nothing was recorded for it)."""


def check_schedules(*, now: datetime, schedules: Iterable[Schedule] | None = None) -> CheckReport:
    """One check of every schedule; a schedule that fails is logged and retried next time."""
    decisions: list[Decision] = []
    errors: dict[str, str] = {}
    for schedule in active_schedules().schedules if schedules is None else schedules:
        try:
            decisions += check_schedule(schedule, now=now)
        except NightshiftError as exc:
            log.error("schedule %s: %s", schedule.name, exc)
            errors[schedule.name] = str(exc)
    return CheckReport(decisions, errors)


def check_schedule(schedule: Schedule, *, now: datetime) -> list[Decision]:
    with transaction() as session:
        firing = _Firing(session, schedule, now)
        firing.check()
    return firing.after_commit()


def fire(
    name: str,
    *,
    now: datetime,
    slot: datetime | None = None,
    schedules: Iterable[Schedule] | None = None,
) -> Decision:
    """Fire one slot by hand (default: the latest one), under the schedule's overlap policy."""
    schedule = find_schedule(name, schedules)
    slot = _manual_slot(schedule, now, slot)
    with transaction() as session:
        firing = _Firing(session, schedule, now)
        firing.fire(slot, FireDecision.FIRED, "fired by hand")
    return next(d for d in firing.after_commit() if d.slot == slot)


def _manual_slot(schedule: Schedule, now: datetime, slot: datetime | None) -> datetime:
    if slot is None:
        latest = schedule.latest_slot(now)
        if latest is None:
            raise ScheduleError(f"schedule {schedule.name!r} has no slot before {now}")
        return latest
    if slot.tzinfo is None:  # a wall-clock time in the schedule's own timezone
        slot = wall_to_instant(slot, schedule.timezone)
    if slot > now:
        raise ScheduleError(f"slot {slot.isoformat()} is in the future; the check will fire it")
    if not schedule.is_slot(slot):
        before = schedule.latest_slot(slot)
        raise ScheduleError(
            f"{schedule.local(slot).isoformat()} is not a slot of {schedule.name!r} "
            f"({schedule.describe()}, {schedule.timezone.key}); the one before it is "
            f"{schedule.local(before).isoformat() if before else 'none'}"
        )
    return slot


@dataclass(frozen=True)
class _Busy:
    """The previous started slot, whose run (or batch) is not finished."""

    slot: datetime
    run_id: uuid.UUID | None
    batch_id: str | None
    status: str


class _Firing:
    """One schedule's decisions in one transaction, holding the schedule's lock."""

    def __init__(self, session: Session, schedule: Schedule, now: datetime) -> None:
        self.session, self.schedule, self.now = session, schedule, now
        self.decisions: list[Decision] = []
        # Concurrent checks of one schedule (two beats, a manual fire) take turns, so each
        # sees the other's decisions; the unique (schedule, slot) stays the last word.
        key = f"nightshift.schedule:{schedule.name}"
        session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": key})

    def after_commit(self) -> list[Decision]:
        for d in self.decisions:
            if d.duplicate:  # the row says what the first request decided; this one did nothing
                log.info(
                    "schedule %s slot %s: already %s, nothing started (asked again %d time(s))",
                    d.schedule, d.slot, d.decision, d.duplicates,
                )  # fmt: skip
            else:
                log.info("schedule %s slot %s: %s (%s)", d.schedule, d.slot, d.decision, d.reason)
        return self.decisions

    def check(self) -> None:
        self.start_buffered()
        schedule, now = self.schedule, self.now
        horizon = now - max(schedule.catch_up, ON_TIME)
        slots = schedule.slots(horizon, now)
        recorded = set(
            self.session.scalars(
                select(ScheduleFire.slot).where(
                    ScheduleFire.schedule == schedule.name, ScheduleFire.slot > horizon
                )
            )
        )
        due = [slot for slot in slots if slot not in recorded]
        if not due:
            return
        get_agent(schedule.agent)  # fail loudly before recording anything
        newest = slots[-1]
        on_time = newest if newest in due and now - newest <= ON_TIME else None
        # A schedule's history starts at its first recorded slot: slots before it were not
        # missed, the schedule did not exist yet (or nothing was checking it).
        first = self._first_recorded()
        missed = [
            s for s in due
            if s != on_time and now - s <= schedule.catch_up and first is not None and s > first
        ]  # fmt: skip
        if missed:
            self.apply_missed(missed, on_time)
        if on_time is not None:
            self.fire(on_time, FireDecision.FIRED, "on time")

    def apply_missed(self, missed: list[datetime], on_time: datetime | None) -> None:
        policy = self.schedule.missed

        def late(slot: datetime) -> str:
            return f"missed: first checked {_duration(self.now - slot)} after its time"

        if policy is Missed.ALL:
            for slot in missed:
                self.fire(slot, FireDecision.CAUGHT_UP, f"{late(slot)}; missed=all runs it")
        elif policy is Missed.ONCE and on_time is None:
            *older, latest = missed
            for slot in older:
                why = f"missed=once runs only the latest missed slot, {self._when(latest)}"
                self.record(slot, FireDecision.SKIPPED_MISSED, f"{late(slot)}; {why}")
            self.fire(latest, FireDecision.CAUGHT_UP, f"{late(latest)}; missed=once runs it")
        else:
            why = "missed=skip" if policy is Missed.SKIP else "missed=once, and a newer slot"
            why += f" ({self._when(on_time)}) is on time" if on_time else ""
            for slot in missed:
                self.record(slot, FireDecision.SKIPPED_MISSED, f"{late(slot)}; {why}")

    def fire(self, slot: datetime, decision: FireDecision, reason: str) -> None:
        """Start the slot's job, unless the overlap policy says otherwise."""
        busy = self._busy_before(slot)
        overlap = self.schedule.overlap
        if busy is None:
            self.start(slot, decision, reason)
        elif overlap is Overlap.ALLOW:
            self.start(slot, decision, f"{reason}; {self._words(busy)} (overlap=allow)")
        elif overlap is Overlap.SKIP:
            reason = f"{reason}, but {self._words(busy)}; overlap=skip"
            self.record(slot, FireDecision.SKIPPED_OVERLAP, reason)
        elif overlap is Overlap.BUFFER_ONE:
            self.buffer(slot, f"{reason}, but {self._words(busy)}; overlap=buffer_one")
        else:
            reason = f"{reason}; cancelled the previous slot: {self._words(busy)}"
            self.start(slot, FireDecision.CANCELLED_OTHER, reason, cancel=busy)

    def start(
        self, slot: datetime, decision: FireDecision, reason: str, cancel: _Busy | None = None
    ) -> None:
        fire_id = self._insert(slot, decision, reason)
        if fire_id is None:
            return
        if cancel is not None:
            self._cancel(cancel, slot)
        self._start_job(fire_id, slot, decision, reason)

    def record(self, slot: datetime, decision: FireDecision, reason: str) -> bool:
        """Record a decision that starts nothing; False if the slot was already recorded."""
        if self._insert(slot, decision, reason) is None:
            return False
        self.decisions.append(Decision(self.schedule.name, slot, decision, reason))
        return True

    def buffer(self, slot: datetime, reason: str) -> None:
        """At most one buffered slot per schedule: the newest."""
        fires = select(ScheduleFire.slot).where(
            ScheduleFire.schedule == self.schedule.name,
            ScheduleFire.decision == FireDecision.BUFFERED,
        )
        newer = self.session.scalar(fires.where(ScheduleFire.slot > slot).limit(1))
        if newer is not None:
            why = f"{reason}, and the newer slot {self._when(newer)} is already buffered"
            self.record(slot, FireDecision.SKIPPED_OVERLAP, why)
            return
        if not self.record(slot, FireDecision.BUFFERED, f"{reason} starts it when that ends"):
            return
        replaced = self.session.execute(
            update(ScheduleFire)
            .where(
                ScheduleFire.schedule == self.schedule.name,
                ScheduleFire.decision == FireDecision.BUFFERED,
                ScheduleFire.slot < slot,
            )
            .values(
                decision=FireDecision.SKIPPED_OVERLAP,
                reason=ScheduleFire.reason + f"; replaced by the newer slot {self._when(slot)}",
            )
            .returning(ScheduleFire.slot, ScheduleFire.reason)
        )
        for row in replaced:
            skipped = FireDecision.SKIPPED_OVERLAP
            self.decisions.append(Decision(self.schedule.name, row.slot, skipped, row.reason))

    def start_buffered(self) -> None:
        """Start the buffered slot once the run it waited for has finished."""
        buffered = self.session.execute(
            select(ScheduleFire.id, ScheduleFire.slot, ScheduleFire.reason)
            .where(
                ScheduleFire.schedule == self.schedule.name,
                ScheduleFire.decision == FireDecision.BUFFERED,
            )
            .order_by(ScheduleFire.slot)
        ).all()
        for row in buffered:
            if self._busy_before(row.slot) is None:
                reason = f"{row.reason}; started {self._when(self.now)}, when it had ended"
                self._start_job(row.id, row.slot, FireDecision.FIRED, reason)

    # -- helpers --

    def _start_job(self, fire_id: int, slot: datetime, decision: FireDecision, reason: str) -> None:
        started = start_job_txn(self.session, self.schedule, slot)
        self.session.execute(
            update(ScheduleFire)
            .where(ScheduleFire.id == fire_id)
            .values(
                decision=decision, reason=reason, run_id=started.run_id, batch_id=started.batch_id
            )
        )
        name = self.schedule.name
        self.decisions.append(
            Decision(name, slot, decision, reason, started.run_id, started.batch_id)
        )

    def _insert(self, slot: datetime, decision: FireDecision, reason: str) -> int | None:
        """The slot's row, or None (and a duplicate counted) if the slot was recorded."""
        statement = (
            insert(ScheduleFire)
            .values(schedule=self.schedule.name, slot=slot, decision=decision, reason=reason)
            .on_conflict_do_nothing(index_elements=["schedule", "slot"])
            .returning(ScheduleFire.id)
        )
        fire_id: int | None = self.session.execute(statement).scalar_one_or_none()
        if fire_id is None:
            row = self.session.execute(
                update(ScheduleFire)
                .where(ScheduleFire.schedule == self.schedule.name, ScheduleFire.slot == slot)
                .values(duplicates=ScheduleFire.duplicates + 1)
                .returning(ScheduleFire)
            ).scalar_one()
            self.decisions.append(Decision.of(row, duplicate=True))
        return fire_id

    def _first_recorded(self) -> datetime | None:
        first = select(func.min(ScheduleFire.slot))
        return self.session.scalar(first.where(ScheduleFire.schedule == self.schedule.name))

    def _busy_before(self, slot: datetime) -> _Busy | None:
        previous = self.session.execute(
            select(ScheduleFire.slot, ScheduleFire.run_id, ScheduleFire.batch_id)
            .where(
                ScheduleFire.schedule == self.schedule.name,
                ScheduleFire.slot < slot,
                or_(ScheduleFire.run_id.is_not(None), ScheduleFire.batch_id.is_not(None)),
            )
            .order_by(ScheduleFire.slot.desc())
            .limit(1)
        ).one_or_none()
        if previous is None:
            return None
        status: RunStatus | BatchStatus | None
        if previous.batch_id is not None:
            status = self.session.scalar(select(Batch.status).where(Batch.id == previous.batch_id))
        else:
            status = self.session.scalar(select(Run.status).where(Run.id == previous.run_id))
        if status is None or status.is_terminal():
            return None
        return _Busy(previous.slot, previous.run_id, previous.batch_id, str(status))

    def _cancel(self, busy: _Busy, slot: datetime) -> None:
        by = f"schedule {self.schedule.name}, slot {self._when(slot)}"
        if busy.batch_id is not None:
            # The whole batch: cancelling only its children left it running, and the tick's
            # join then started the old night's synthesis, which proposed a second set of prices.
            cancel_batch_txn(self.session, busy.batch_id, by, REPLACED)
        elif busy.run_id is not None:
            cancel_run_txn(self.session, busy.run_id, by, REPLACED)

    def _words(self, busy: _Busy) -> str:
        what = f"batch {busy.batch_id}" if busy.batch_id else f"run {busy.run_id}"
        return f"{what} of slot {self._when(busy.slot)} is still {busy.status}"

    def _when(self, instant: datetime | None) -> str:
        if instant is None:
            return "-"
        return self.schedule.local(instant).strftime("%Y-%m-%d %H:%M %Z")


def _duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"
