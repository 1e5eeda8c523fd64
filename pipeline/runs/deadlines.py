"""Deadlines as callers write them, read the same way by the API, the CLI, `.delay()`, event
sources and schedules: a number of seconds or a duration from now (`90`, `90s`, `15m`, `2h`,
`1d`), or an ISO-8601 time with its timezone (`2026-12-01T06:00:00+01:00`).

A relative deadline stays relative until the run row is written, where PostgreSQL adds it to
its own clock (`now() + interval`): the run's deadline never depends on the caller's clock.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from pipeline.errors import InvalidInput

Deadline = datetime | timedelta
"""An instant (timezone-aware), or how long from the moment the run is created."""

MAX_DEADLINE = timedelta(days=366)
_SOONEST = timedelta(microseconds=1)
"""A positive deadline smaller than timedelta can hold still lies ahead (by this much)."""
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_FORMS = "seconds, a duration like 90s, 15m, 2h or 1d, or an ISO-8601 time with a timezone"


def parse_deadline(value: object, what: str = "deadline") -> Deadline | None:
    """`value` as a deadline; None stays None. Raises InvalidInput naming `what`."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(f"{what} must be {_FORMS} (got {value!r})")
    if isinstance(value, timedelta):
        return _relative(value, what)
    if isinstance(value, int | float):
        return _relative(_seconds(value, what), what)
    if isinstance(value, datetime):
        return _absolute(value, what)
    if isinstance(value, str):
        text = value.strip()
        duration = _DURATION.fullmatch(text.lower())
        if duration:
            amount, unit = duration.groups()
            return _relative(_seconds(float(amount) * _UNITS[unit], what), what)
        try:
            instant = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(f"{what} must be {_FORMS} (got {value[:40]!r})") from None
        return _absolute(instant, what)
    raise InvalidInput(f"{what} must be {_FORMS} (got {type(value).__name__})")


def _seconds(amount: float, what: str) -> timedelta:
    """A number of seconds as a timedelta, refusing what timedelta cannot hold (1e300)."""
    if amount != amount or amount > MAX_DEADLINE.total_seconds():  # NaN, or too far
        raise InvalidInput(f"{what} is more than {MAX_DEADLINE.days} days away")
    if amount <= 0:
        raise InvalidInput(f"{what} must be in the future (got {amount:g} s)")
    return max(timedelta(seconds=amount), _SOONEST)


def _relative(after: timedelta, what: str) -> timedelta:
    if after <= timedelta(0):
        raise InvalidInput(f"{what} must be in the future (got {after.total_seconds():g} s)")
    if after > MAX_DEADLINE:
        raise InvalidInput(f"{what} is more than {MAX_DEADLINE.days} days away")
    return after


def _absolute(instant: datetime, what: str) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise InvalidInput(f"{what} {instant.isoformat()} has no timezone (add Z or +01:00)")
    now = datetime.now(UTC)
    if instant <= now:
        raise InvalidInput(f"{what} {instant.isoformat()} is in the past")
    if instant - now > MAX_DEADLINE:
        raise InvalidInput(f"{what} is more than {MAX_DEADLINE.days} days away")
    return instant


def duration_pattern() -> str:
    """The durations a schema can promise parse_deadline takes, as a regular expression (the
    API's OpenAPI document declares it): positive, and with so few whole digits for their unit
    that they stay within MAX_DEADLINE (up to 9999999 s, 99999 m, 999 h or 99 d). It leaves
    out some that parse_deadline takes too: up to 366 days of any unit, and spaces."""
    forms = []
    for unit, seconds in _UNITS.items():
        if not unit:
            continue  # a bare number counts seconds: `s` is optional below
        digits = int(math.log10(MAX_DEADLINE.total_seconds() / seconds))
        # A whole number, or a fraction with a digit other than 0 in its first six places
        # (a float can hold it; one with hundreds of zeros would read as 0).
        positive = f"(?:0*[1-9][0-9]{{0,{digits - 1}}}(?:\\.[0-9]+)?|0+\\.0{{0,5}}[1-9][0-9]*)"
        optional = "?" if seconds == _UNITS[""] else ""
        forms.append(f"{positive}[{unit}{unit.upper()}]{optional}")
    return f"^(?:{'|'.join(forms)})$"
