"""Flow control shared by every worker (pipeline/engine/gate.py, flow_ledger.py): the ledgers
in the real Redis, and an agent's max_concurrent_runs held across two worker processes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from pipeline.db import transaction
from pipeline.engine.flow_ledger import BURST_SECONDS, Pace, Turns
from pipeline.keys import rate_wait, turn_wait
from pipeline.processes.celery_process import wait_for
from pipeline.rate_limits import RateLimit
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from pipeline.views.turns import waiting_for_turns
from tests.flow_agents import LIMIT
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row


def scope() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def test_turns_go_first_in_first_out(db_url: str) -> None:
    turns = Turns(scope(), limit=2)

    def ask(run: str) -> int | None:
        waits = turns.ask(run, 60, 10, 300)
        return None if waits is None else waits[0]

    # given two runs in a step, the next two wait in the order they came
    assert (ask("a"), ask("b")) == (None, None)
    assert (ask("c"), ask("d")) == (0, 1)
    assert ask("a") is None  # asking again while holding renews the hold
    # when one leaves, the first waiter's turn comes, and nobody else takes it meanwhile
    assert turns.leave("a") == ["c"]
    assert ask("e") == 2
    assert ask("d") == 1
    assert ask("c") is None
    # then the next leave is d's turn, not e's, however often e asks
    assert turns.leave("b") == ["d"]
    assert ask("e") == 1
    assert ask("d") is None
    assert turns.leave("c") == ["e"]
    assert turns.leave("nobody") == ["e"]  # a run holding no turn gives nothing back


def test_a_step_taken_over_keeps_its_own_turn_until_it_ends(db_url: str) -> None:
    turns = Turns(scope(), limit=2)
    # given a run's step holding a turn (fence 1) whose lease is taken over (fence 2)
    assert turns.ask("a", 60, 10, 300, "a:1") is None
    assert turns.ask("a", 60, 10, 300, "a:2") is None
    # then both steps count: nobody else is in until one of them ends
    assert turns.ask("b", 60, 10, 300, "b:1") == (0, 10.0)
    # and when the zombie ends, its successor keeps its turn
    assert turns.leave("a:1") == ["b"]
    assert turns.ask("c", 60, 10, 300, "c:1") == (1, 10.0)


def test_turns_of_a_dead_worker_lapse_and_silent_waiters_are_forgotten(db_url: str) -> None:
    turns = Turns(scope(), limit=1)
    assert turns.ask("dead", 0.5, 10, 300) is None  # its worker dies in the step
    assert turns.ask("gone", 60, 0.01, 0.01) == (0, 0.01)  # waits, then never asks again
    assert turns.ask("late", 60, 10, 300) == (1, 20.0)  # further back: looked at less often
    # when the dead holder's hold lapsed and "gone" did not ask within thrice its recheck
    time.sleep(0.7)
    # then the turn is late's
    assert turns.ask("late", 60, 10, 300) is None


def test_the_pace_reserves_a_time_for_each_call_past_the_limit(db_url: str) -> None:
    pace = Pace(scope(), RateLimit(requests_per_minute=60))
    # given 60 requests a minute: a burst's worth go at once (BURST_SECONDS of them)
    went = [pace.ask(f"r{i}", 100, 10) for i in range(int(BURST_SECONDS))]
    assert went == [0.0] * int(BURST_SECONDS)
    # then each next one is given its own time, a second apart
    first, second = pace.ask("late1", 100, 10), pace.ask("late2", 100, 10)
    assert 0.8 < first < 1.05 and 1.8 < second < 2.05
    # and asking again before that time keeps the reservation (it is not charged twice)
    assert pace.ask("late1", 100, 10) == pytest.approx(first, abs=0.1)
    assert pace.ask("late3", 100, 10) == pytest.approx(3.0, abs=0.1)
    time.sleep(first)
    assert pace.ask("late1", 100, 10) == 0.0


def test_one_large_call_goes_once_the_calls_before_it_are_paid(db_url: str) -> None:
    pace = Pace(scope(), RateLimit(input_tokens_per_minute=6000))  # 100 tokens a second
    # given an idle ledger, a call of 30 s worth (a synthesis's long prompt) goes at once
    assert pace.ask("big", 3000, 0) == 0.0
    # then the next waits for it to be paid, less a burst
    assert pace.ask("small", 100, 0) == pytest.approx(30 + 1 - BURST_SECONDS, abs=0.1)
    # and another large one goes once everything before it is paid, not its own 30 s later
    assert pace.ask("big2", 3000, 0) == pytest.approx(31.0, abs=0.1)


def test_the_pace_settles_a_calls_real_usage(db_url: str) -> None:
    pace = Pace(scope(), RateLimit(input_tokens_per_minute=6000))  # 100 tokens a second
    assert pace.ask("a", 600, 0) == 0.0  # the burst: 6 s worth
    assert pace.ask("b", 100, 0) == pytest.approx(1.0, abs=0.1)
    # when a's call used 300 tokens fewer than it was charged, c's wait is 3 s shorter
    pace.settle(-300, 0)
    assert pace.ask("c", 400, 0) == pytest.approx(2.0, abs=0.1)


def finished(runs: list[uuid.UUID]) -> list[Any] | None:
    rows = [run_row(run) for run in runs]
    return rows if all(row.status in ("succeeded", "failed") for row in rows) else None


def steps_at_once(log: Path) -> int:
    """The most tool calls in flight at one instant."""
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    edges = sorted([(s["started"], 1) for s in spans] + [(s["ended"], -1) for s in spans])
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


def test_max_concurrent_runs_holds_across_two_workers(
    db_url: str,
    tmp_path: Path,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given an agent allowing 5 of its runs in a step, and two workers of 8 slots each
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    register_agents("tests.flow_agents:TURNS")
    processes("worker-a", concurrency=8)
    processes("worker-b", concurrency=8)
    processes("beat", beat=True)
    log = tmp_path / "steps.jsonl"
    # when 24 runs start at once
    runs = [start_run("flow_turns", {"log": str(log)}).run_id for _ in range(24)]

    rows = wait_for(
        lambda: finished(runs), timeout=120, what="24 runs of flow_turns to finish", interval=0.5
    )
    # then every run succeeded, yet never more than 5 were in a step at once across both
    assert [row.status for row in rows] == ["succeeded"] * 24
    assert len(log.read_text().splitlines()) == 48
    most = steps_at_once(log)
    assert 2 <= most <= LIMIT, most


def test_a_night_paces_itself_under_the_providers_rate_limit(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a provider allowing 120 requests a minute, enforced over 10 s (20 at once at most),
    # and the workers told that limit
    sandbox.messages.rate_limits.set(burst_seconds=10, requests_per_minute=120)
    model = get_settings().model_name
    monkeypatch.setenv("NIGHTSHIFT_MODEL_RATE_LIMITS",
                       json.dumps({model: {"requests_per_minute": 120}}))  # fmt: skip
    processes("worker-a", concurrency=8)
    processes("worker-b", concurrency=8)
    processes("beat", beat=True)
    # when 20 runs of two model calls each start at once (40 calls: twice what it takes at once)
    started = time.monotonic()
    runs = [start_run("bench", {"steps": 2}).run_id for _ in range(20)]
    rows = wait_for(lambda: finished(runs), timeout=120, what="20 runs to finish", interval=0.5)
    took = time.monotonic() - started
    # then every run succeeded, paced: 12 calls at once (6 s worth), the other 28 at 2 a second,
    # and the provider refused (almost) none
    assert [row.status for row in rows] == ["succeeded"] * 20
    stats = sandbox.messages.stats()
    assert stats["rate_limited"] <= 1, stats
    assert stats["requests"] - stats["rate_limited"] == 40
    assert took >= 0.8 * (40 - 12) / 2, took


def test_nightshift_runs_says_how_many_wait_for_their_turn(db_url: str) -> None:
    # given runs parked for their turn (as the gate parks them), and one waiting on a timer
    runs = [start_run("bench", {"steps": 1}).run_id for _ in range(4)]
    waits = [str(turn_wait("bench")), str(turn_wait("bench")), str(rate_wait("claude-x")),
             "timer:toolu_1"]  # fmt: skip
    with transaction() as session:
        for run, wait in zip(runs, waits, strict=True):
            session.execute(
                text("UPDATE runs SET status = 'waiting', waiting_on = :wait WHERE id = :id"),
                {"wait": wait, "id": run},
            )
    # then the note lines say how many wait on what, the most first, timers left out
    assert waiting_for_turns() == [
        "2 run(s) wait for their turn: bench's max_concurrent_runs are in a step",
        "1 run(s) wait for their turn under claude-x's rate limits",
    ]
