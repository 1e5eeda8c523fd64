"""run_bounded runs each call in its caller's long-lived step runner, and replaces the runner
once a call overran."""

from __future__ import annotations

import contextvars
import threading

import pytest

from pipeline.engine.time_limit import run_bounded
from pipeline.errors import Stuck

CALLER = contextvars.ContextVar("caller", default="none")


def test_calls_from_one_thread_share_one_runner_beside_it() -> None:
    first = run_bounded(threading.current_thread, 5)
    second = run_bounded(threading.current_thread, 5)
    assert first is second
    assert first is not threading.current_thread()
    assert first.name == f"{threading.current_thread().name}-step"


def test_the_callers_context_results_and_exceptions_cross_over() -> None:
    CALLER.set("test")
    assert run_bounded(CALLER.get, 5) == "test"

    def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        run_bounded(fails, 5)
    assert run_bounded(lambda: 42, 5) == 42


def test_each_calling_thread_has_its_own_runner() -> None:
    here = run_bounded(threading.current_thread, 5)
    elsewhere: list[threading.Thread] = []
    caller = threading.Thread(
        target=lambda: elsewhere.append(run_bounded(threading.current_thread, 5))
    )
    caller.start()
    caller.join()
    assert elsewhere and elsewhere[0] is not here


def test_a_call_that_overruns_is_stuck_and_the_next_call_gets_a_new_runner() -> None:
    before = run_bounded(threading.current_thread, 5)
    release = threading.Event()
    with pytest.raises(Stuck):
        run_bounded(release.wait, 0.1)
    after = run_bounded(threading.current_thread, 5)
    assert after is not before and after.is_alive()
    # the abandoned runner ends once its work does
    release.set()
    before.join(timeout=5)
    assert not before.is_alive()
    assert run_bounded(threading.current_thread, 5) is after
