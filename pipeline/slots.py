"""Schedules in an ops team's words, and the pure slot math behind them: the instants a
cron-like schedule fires at, computed in its own timezone and correct across DST changes.

Wall-clock rules (docs/schedules.md): a wall time that does not exist (spring forward) fires
at the first instant after the gap; a wall time that happens twice (fall back) fires once, at
its first occurrence.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pipeline.errors import ScheduleError

# Long enough to find a slot of any schedule that fires at all (29 February needs 8 years).
_SEARCH_DAYS = 8 * 366
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_WORDS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


class Missed(StrEnum):
    """What a check does with slots that passed while nothing was checking."""

    SKIP = "skip"
    """Record every missed slot as skipped_missed; wait for the next slot."""
    ONCE = "once"
    """One catch-up run for the latest missed slot; the others are recorded as skipped."""
    ALL = "all"
    """One catch-up run per missed slot within the catch-up window."""


class Overlap(StrEnum):
    """What a slot does while the previous slot's run (or batch) is still going."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    """Start when the previous one finishes; a newer buffered slot replaces an older one."""
    CANCEL_OTHER = "cancel_other"


# -- cron fields ----------------------------------------------------------------------------

_FIELDS: dict[str, tuple[int, int, tuple[str, ...], int]] = {
    # name: (lowest, highest, names, value of the first name)
    "minute": (0, 59, (), 0),
    "hour": (0, 23, (), 0),
    "day_of_week": (0, 7, _DAYS, 0),  # 0 and 7 are both Sunday, as in cron
    "day_of_month": (1, 31, (), 1),
    "month_of_year": (1, 12, _MONTHS, 1),
}


def parse_field(name: str, spec: str) -> frozenset[int]:
    """`*`, `5`, `1-5`, `*/15`, `8-18/2`, `mon-fri`, and lists of those: the values they name."""
    low, high, names, first = _FIELDS[name]

    def value(text: str) -> int:
        text = text.strip()
        if text in names:
            return names.index(text) + first
        if not text.isdigit():
            raise ScheduleError(f"{name} {spec!r}: {text!r} is not a number or a name")
        return int(text)

    values: set[int] = set()
    for part in spec.lower().split(","):
        body, slash, step_text = part.strip().partition("/")
        step = value(step_text) if slash else 1
        if body == "*":
            start, end = low, high
        elif "-" in body:
            start, end = (value(v) for v in body.split("-", 1))
        else:
            start = value(body)
            end = high if slash else start
        if step < 1 or not low <= start <= end <= high:
            raise ScheduleError(f"{name} {spec!r} is outside {low}-{high} or has a bad step")
        values.update(range(start, end + 1, step))
    if name == "day_of_week" and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    minute: frozenset[int]
    hour: frozenset[int]
    day_of_week: frozenset[int]
    """0 is Sunday."""
    day_of_month: frozenset[int]
    month_of_year: frozenset[int]

    def matches(self, day: date) -> bool:
        """Every field must match (unlike Vixie cron, which ORs day of month and of week)."""
        weekday = (day.weekday() + 1) % 7
        return (
            day.month in self.month_of_year
            and day.day in self.day_of_month
            and weekday in self.day_of_week
        )

    def times(self) -> list[time]:
        return [time(h, m) for h in sorted(self.hour) for m in sorted(self.minute)]


# -- wall clock to instants -----------------------------------------------------------------


def wall_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant a naive wall-clock time names in `zone`.

    Repeated (fall back): the first occurrence. Missing (spring forward): the first instant
    after the gap, i.e. 03:00 local when the clocks jump from 02:00 to 03:00.
    """
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant
    # In a gap fold=0 reads the wall time with the offset before the jump (an instant after
    # it) and fold=1 with the offset after the jump (an instant before it): bisect between.
    before = int(wall.replace(tzinfo=zone, fold=1).astimezone(UTC).timestamp())
    after = int(instant.timestamp())
    offset_after = instant.astimezone(zone).utcoffset()
    while after - before > 1:
        middle = (before + after) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == offset_after:
            after = middle
        else:
            before = middle
    return datetime.fromtimestamp(after, UTC)


# -- schedules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A job fired by the clock: cron fields read in `timezone`, and the job's policies."""

    name: str
    agent: str
    """The registered agent it starts; the agent's `job` decides what a slot starts."""
    minute: str = "0"
    hour: str = "*"
    day_of_week: str = "*"
    day_of_month: str = "*"
    month_of_year: str = "*"
    timezone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    params: Mapping[str, Any] = field(default_factory=dict)
    missed: Missed = Missed.ONCE
    catch_up: timedelta = timedelta(hours=6)
    """How old a missed slot may be and still be recorded (and, with once/all, run)."""
    overlap: Overlap = Overlap.SKIP
    deadline: timedelta | None = None
    """How long after its slot the slot's run (or every run of its batch) must be finished;
    past it, the run stops with reason `deadline`, waiting or not."""
    notify_url: str | None = None
    """Told (a signed POST) when the slot's run or batch ends or waits for a person."""
    cron: Cron = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ScheduleError(
                f"schedule name {self.name!r} must be 1-100 of a-z, 0-9, '-', '_' and '.'"
            )
        try:
            cron = Cron(**{name: parse_field(name, getattr(self, name)) for name in _FIELDS})
            if not isinstance(self.timezone, ZoneInfo):  # a name, from a file or a caller
                object.__setattr__(self, "timezone", ZoneInfo(str(self.timezone)))
        except (ScheduleError, ZoneInfoNotFoundError, ValueError) as exc:
            raise ScheduleError(f"schedule {self.name!r}: {exc}") from None
        object.__setattr__(self, "cron", cron)
        object.__setattr__(self, "missed", Missed(self.missed))
        object.__setattr__(self, "overlap", Overlap(self.overlap))
        if self.catch_up < timedelta(0):
            raise ScheduleError(f"schedule {self.name!r}: catch_up must not be negative")
        if self.deadline is not None and self.deadline <= timedelta(0):
            raise ScheduleError(f"schedule {self.name!r}: deadline must be positive")
        if self.missed is Missed.ALL and self.overlap is not Overlap.ALLOW:
            # Each catch-up run would skip, buffer behind or cancel the one before it.
            raise ScheduleError(
                f"schedule {self.name!r}: missed='all' starts several runs at once, so it "
                f"needs overlap='allow' (got {self.overlap.value!r})"
            )
        if not any(cron.matches(d) for d in _days(date(2000, 1, 1), _SEARCH_DAYS)):
            raise ScheduleError(f"schedule {self.name!r} never fires (no such date)")

    @classmethod
    def from_json(cls, entry: Mapping[str, Any], base: Schedule | None = None) -> Schedule:
        """An entry of the schedules file; with `base`, the fields given override it."""
        fields = dict(entry)
        fields.pop("enabled", None)
        if "job" in fields:  # the first schedules files named the agent "job"
            fields.setdefault("agent", fields.pop("job"))
        name = fields.get("name", "?")
        unknown = sorted(set(fields) - _ENTRY_FIELDS)
        if unknown:  # a misspelt field would otherwise be dropped, and the schedule fire wrongly
            raise ScheduleError(
                f"schedule {name!r}: unknown field {', '.join(map(repr, unknown))}; "
                f"the fields are {', '.join(sorted(_ENTRY_FIELDS))}"
            )
        try:
            for window in ("catch_up", "deadline"):
                if f"{window}_minutes" in fields:
                    fields[window] = timedelta(minutes=float(fields.pop(f"{window}_minutes")))
            for policy in ("missed", "overlap"):
                if policy in fields:
                    fields[policy] = (Missed if policy == "missed" else Overlap)(fields[policy])
            if base is not None:
                return dataclasses.replace(base, **fields)
            return cls(**fields)
        except (ValueError, TypeError) as exc:
            raise ScheduleError(f"schedule {name!r} in the schedules file: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        """This schedule as a schedules-file entry: `from_json` reads it back unchanged."""
        entry: dict[str, Any] = {
            "name": self.name,
            "agent": self.agent,
            **{name: getattr(self, name) for name in _FIELDS},
            "timezone": self.timezone.key,
            "params": dict(self.params),
            "missed": self.missed.value,
            "catch_up_minutes": self.catch_up.total_seconds() / 60,
            "overlap": self.overlap.value,
            "notify_url": self.notify_url,
        }
        if self.deadline is not None:
            entry["deadline_minutes"] = self.deadline.total_seconds() / 60
        return entry

    # -- slots (UTC instants) --

    def slots(self, after: datetime, until: datetime) -> list[datetime]:
        """Every slot in (after, until], oldest first."""
        zone = self.timezone
        first = after.astimezone(zone).date() - timedelta(days=1)
        days = (until.astimezone(zone).date() - first).days + 2
        found = {
            instant
            for day in _days(first, days)
            if self.cron.matches(day) and self._overlaps(day, after, until)
            for instant in self._instants(day)
            if after < instant <= until
        }
        return sorted(found)

    def _overlaps(self, day: date, after: datetime, until: datetime) -> bool:
        """Whether the day's slots (between its midnight and the next) can be in the range."""
        start = wall_to_instant(datetime.combine(day, time()), self.timezone)
        end = wall_to_instant(datetime.combine(day + timedelta(days=1), time()), self.timezone)
        return start <= until and end > after

    def latest_slot(self, at: datetime) -> datetime | None:
        """The newest slot at or before `at`."""
        start = at.astimezone(self.timezone).date() + timedelta(days=1)
        for day in _days(start, _SEARCH_DAYS, step=-1):
            if self.cron.matches(day):
                earlier = [i for i in self._instants(day) if i <= at]
                if earlier:
                    return max(earlier)
        return None

    def next_slot(self, after: datetime) -> datetime | None:
        """The oldest slot after `after`."""
        start = after.astimezone(self.timezone).date() - timedelta(days=1)
        for day in _days(start, _SEARCH_DAYS):
            if self.cron.matches(day):
                later = [i for i in self._instants(day) if i > after]
                if later:
                    return min(later)
        return None

    def is_slot(self, instant: datetime) -> bool:
        return instant in self.slots(instant - timedelta(seconds=1), instant)

    def local(self, instant: datetime) -> datetime:
        return instant.astimezone(self.timezone)

    def _instants(self, day: date) -> Iterator[datetime]:
        for moment in self.cron.times():
            yield wall_to_instant(datetime.combine(day, moment), self.timezone)

    # -- words --

    def describe(self) -> str:
        """'every day at 02:00', 'Mondays at 09:00', 'every minute', ... in local time."""
        cron = self.cron
        if len(cron.minute) == 60 and len(cron.hour) == 24:
            at = "every minute"
        elif len(cron.hour) == 24:
            at = "every hour at " + ", ".join(f":{m:02d}" for m in sorted(cron.minute))
        elif len(cron.minute) * len(cron.hour) <= 4:
            at = "at " + ", ".join(t.strftime("%H:%M") for t in cron.times())
        else:
            at = f"at minute {self.minute} of hour {self.hour}"
        days = []
        if len(cron.day_of_week) < 7:
            days.append(", ".join(_DAY_WORDS[d] + "s" for d in sorted(cron.day_of_week)))
        if len(cron.day_of_month) < 31:
            days.append(f"on day {self.day_of_month} of the month")
        if len(cron.month_of_year) < 12:
            months = sorted(cron.month_of_year)
            days.append("in " + ", ".join(_MONTHS[m - 1].title() for m in months))
        if not days and not at.startswith("every"):
            days.append("every day")
        return " ".join([*days, at])


_ENTRY_FIELDS = {f.name for f in dataclasses.fields(Schedule) if f.init} - {
    "catch_up",
    "deadline",
} | {"catch_up_minutes", "deadline_minutes"}
"""What a schedules-file entry may say (besides `enabled`, and `job`, the old name of agent)."""


def _days(start: date, count: int, step: int = 1) -> Iterator[date]:
    one = timedelta(days=step)
    for _ in range(count):
        yield start
        start += one
