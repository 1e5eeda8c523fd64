"""A fork's key names its origin and step, and nothing else parses as one."""

from __future__ import annotations

import uuid

from models import RunStatus
from pipeline.keys import ForkOf, fork_key, forked_from, runtime_run_key
from pipeline.runs.fork import last_step


def test_a_forks_key_names_its_origin_and_step() -> None:
    origin = uuid.uuid4()
    assert fork_key(origin, 3) == f"fork-of:{origin}:3"
    assert forked_from(fork_key(origin, 3)) == ForkOf(origin, 3)


def test_other_keys_are_no_forks() -> None:
    origin = uuid.uuid4()
    for key in (None, f"retry-of:{origin}", "fork-of:not-a-run:3", f"fork-of:{origin}:x",
                f"fork-of:{origin}"):  # fmt: skip
        assert forked_from(key) is None, key


def test_a_caller_cannot_choose_a_forks_key() -> None:
    refused = runtime_run_key(fork_key(uuid.uuid4(), 0))
    assert refused is not None and "forks' own" in refused


def test_a_run_is_forked_up_to_the_step_it_ended_in() -> None:
    # a succeeded run's step counts its final step too; a failed one's is the step it was in
    assert last_step(RunStatus.SUCCEEDED, 5) == 4
    assert last_step(RunStatus.FAILED, 2) == 2
    assert last_step(RunStatus.CANCELLED, 0) == 0
