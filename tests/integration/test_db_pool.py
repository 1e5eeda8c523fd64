"""A process keeps at most NIGHTSHIFT_DB_POOL_SIZE connections whatever its thread count:
threads wait for a kept connection instead of opening (and closing) more on every burst."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from pipeline.db import get_engine, transaction
from pipeline.settings import get_settings

THREADS = 60
BURSTS = 3


def _sessions_opened() -> int:
    with transaction() as session:
        return int(
            session.scalar(
                text("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            )
        )


def _backends() -> int:
    with transaction() as session:
        return int(
            session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        )


def test_threads_beyond_the_pool_wait_for_kept_connections(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_DB_POOL_SIZE", "4")
    get_settings.cache_clear()
    engine = get_engine()
    assert (engine.pool.size(), engine.pool.overflow()) == (4, -4)  # type: ignore[attr-defined]
    opened_before = _sessions_opened()
    most = [0]
    start = threading.Barrier(THREADS)

    def step() -> None:
        start.wait()  # all at once: a burst far wider than the pool
        with transaction() as session:
            session.execute(text("SELECT pg_sleep(0.02)"))
            most[0] = max(most[0], engine.pool.checkedout())  # type: ignore[attr-defined]

    for _ in range(BURSTS):
        threads = [threading.Thread(target=step) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
    assert most[0] == 4  # every kept connection was used, never one more
    # The pool's 4 connections (opened by the first burst, kept since) and this test's own.
    assert _sessions_opened() - opened_before <= 4
    assert _backends() <= 4
