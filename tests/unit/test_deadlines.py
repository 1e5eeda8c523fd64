"""Deadlines as people and programs write them: seconds, durations or ISO times."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.errors import InvalidInput
from pipeline.runs.deadlines import duration_pattern, parse_deadline


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
        (1e-300, timedelta(microseconds=1)),  # positive, however small: ahead by the least
        ("0.0000001s", timedelta(microseconds=1)),
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
        ("\u0662s", "must be seconds, a duration"),  # ARABIC-INDIC DIGIT TWO
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


@pytest.mark.parametrize(
    "written",
    ["1", "90", "90s", "15M", "2h", "99d", "1.5h", "0.5", "000001s", "0.000001s", "9999999.9s",
     "99999m", "999h"],
)  # fmt: skip
def test_every_duration_the_api_schema_declares_is_taken(written: str) -> None:
    assert re.search(duration_pattern(), written)
    assert parse_deadline(written) is not None


@pytest.mark.parametrize(
    "written", ["0", "0s", "00.000h", "0.0000001s", "10000000s", "100000m", "1000h", "100d", "1e5",
                " 5s", "5 s", "-1"],
)  # fmt: skip
def test_the_declared_durations_leave_out_zero_and_the_far_ones(written: str) -> None:
    assert not re.search(duration_pattern(), written)
