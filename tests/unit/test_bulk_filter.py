"""A bulk operation's filter as people write it (CLI flags, the API's JSON): each mistake is
refused in one line that names it, and what is kept is what the operation records."""

from __future__ import annotations

import pytest

from models import RunStatus
from pipeline.errors import InvalidInput
from pipeline.keys import WaitKind
from pipeline.runs.bulk_filter import BulkFilter


def test_the_fields_given_are_read_and_recorded_as_given() -> None:
    wanted = BulkFilter.parse({
        "agent": "patch", "status": "waiting", "waiting_on": "approval", "batch": None,
        "started_after": "2026-12-04T02:00:00+01:00", "stop_reason": "",
    })  # fmt: skip
    assert (wanted.agent, wanted.status, wanted.waiting_on) == (
        "patch", RunStatus.WAITING, WaitKind.APPROVAL,
    )  # fmt: skip
    assert wanted.batch is None and wanted.stop_reason is None
    assert wanted.as_json() == {
        "agent": "patch", "status": "waiting", "waiting_on": "approval",
        "started_after": "2026-12-04T02:00:00+01:00",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({}, "a bulk operation needs a filter: at least one of agent, batch,"),
        ({"agent": None, "batch": ""}, "a bulk operation needs a filter"),
        ({"agnet": "patch"}, "filter has no field 'agnet' (it has agent, batch,"),
        ({"status": "done"}, "filter status 'done' is not a run status (running, waiting,"),
        ({"started_before": "yesterday"}, "filter started_before 'yesterday' is not an ISO-8601"),
        ({"started_after": "2026-12-04T02:00:00"}, "needs a timezone (e.g. +00:00 or Z)"),
        ({"waiting_on": "approval:patch:x"}, "'approval:patch:x' is no kind of wait (approval,"),
        ({"agent": 7}, "filter field 'agent' must be a string of up to 200 chars"),
    ],
)
def test_a_wrong_filter_is_refused_saying_what_is_wrong(given: dict, said: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        BulkFilter.parse(given)
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)
