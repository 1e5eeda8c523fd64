"""Deadlines as people and programs write them: seconds, durations or ISO times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipeline.errors import InvalidInput
from pipeline.runs.deadlines import parse_deadline


@pytest.mark.parametrize(
    ("written", "after"),
    [
        (30, timedelta(seconds=30)),
        (2.5, timedelta(seconds=2.5)),
        ("45", timedelta(seconds=45)),
        (" 90s ", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2H", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        (timedelta(minutes=5), timedelta(minutes=5)),
    ],
)
def test_relative_deadlines_stay_relative(written: object, after: timedelta) -> None:
    assert parse_deadline(written) == after


def test_an_iso_time_with_a_timezone_is_an_instant() -> None:
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    assert parse_deadline(soon.isoformat()) == soon
    assert parse_deadline(soon.strftime("%Y-%m-%dT%H:%M:%SZ")) == soon
    assert parse_deadline(soon) == soon
    assert parse_deadline(None) is None


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("soon", "must be seconds, a duration"),
        ("5 parsecs", "must be seconds, a duration"),
        (0, "must be in the future"),
        ("-3m", "must be seconds, a duration"),
        ("2020-01-01T00:00:00+00:00", "is in the past"),
        ("2099-01-01T00:00:00", "has no timezone"),
        ("367d", "more than 366 days"),
        (False, "must be seconds"),
        ([5], "must be seconds"),
    ],
)
def test_bad_deadlines_are_refused_naming_what(written: object, why: str) -> None:
    with pytest.raises(InvalidInput, match=why) as refused:
        parse_deadline(written, "--deadline")
    assert str(refused.value).startswith("--deadline")
