"""An outage of PostgreSQL is two log lines, whatever number of attempts fail in between; a
failed statement is not an outage."""

from __future__ import annotations

import logging

import kombu.exceptions
import psycopg
import psycopg.errors
import pytest
import redis.exceptions
from sqlalchemy.exc import OperationalError

from pipeline.cli.failures import describe
from pipeline.errors import DatabaseUnavailable
from pipeline.reachability import Dependency, is_broker_outage, is_database_outage


def wrapped(orig: Exception) -> OperationalError:
    return OperationalError("SELECT 1", {}, orig)


def test_a_lost_server_is_an_outage_and_a_failed_statement_is_not() -> None:
    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert is_database_outage(wrapped(refused))
    assert is_database_outage(wrapped(psycopg.errors.AdminShutdown("terminating connection")))
    assert is_database_outage(psycopg.InterfaceError("the connection is closed"))
    assert not is_database_outage(wrapped(psycopg.errors.QueryCanceled("statement timeout")))
    assert not is_database_outage(wrapped(psycopg.errors.LockNotAvailable("lock timeout")))
    assert not is_database_outage(ValueError("not a database error"))


def test_a_claim_without_a_free_connection_is_not_an_outage() -> None:
    unreachable = DatabaseUnavailable("no claim")
    unreachable.__cause__ = wrapped(psycopg.OperationalError("Connection refused"))
    busy = DatabaseUnavailable("no claim, no free connection")
    busy.__cause__ = TimeoutError("QueuePool limit reached")
    assert is_database_outage(unreachable) and not is_database_outage(busy)


def test_many_failed_attempts_are_one_line_and_the_return_one_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    database = Dependency("database", is_database_outage)
    refused = wrapped(psycopg.OperationalError("connection failed: Connection refused"))

    def fails() -> None:
        raise refused

    with caplog.at_level(logging.INFO, logger="nightshift.reachability"):
        assert [database.attempt(fails) for _ in range(50)] == [None] * 50
        database.failed(refused)  # another thread's report of the same outage
        assert database.down
        assert database.attempt(lambda: 7) == 7
        assert database.attempt(lambda: 8) == 8
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database unreachable since ") and "; retrying (" in lines[0]
    assert "Connection refused" in lines[0]
    assert lines[1].startswith("database reachable again after ")
    assert not database.down


def test_other_failures_are_raised_as_they_were() -> None:
    database = Dependency("database", is_database_outage)

    def fails() -> None:
        raise wrapped(psycopg.errors.QueryCanceled("statement timeout"))

    with pytest.raises(OperationalError):
        database.attempt(fails)
    assert not database.down


def test_a_client_that_loses_the_embedded_database_is_told_to_start_it_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("NIGHTSHIFT_DATABASE_URL", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_DATA_DIR", str(tmp_path))
    line = describe(wrapped(psycopg.errors.AdminShutdown("terminating connection")))
    assert line is not None
    assert line.startswith(f"cannot reach the embedded PostgreSQL in {tmp_path}: ")
    assert line.endswith("(`nightshift services up` starts it again)")


def test_a_lost_broker_connection_is_a_broker_outage() -> None:
    assert is_broker_outage(kombu.exceptions.OperationalError("Error 111 connecting"))
    assert is_broker_outage(redis.exceptions.ConnectionError("Connection refused"))
    assert not is_broker_outage(redis.exceptions.ResponseError("WRONGTYPE"))
    assert not is_broker_outage(wrapped(psycopg.OperationalError("Connection refused")))
