"""The first minutes off the demo path: an unreachable database or broker, a database nobody
migrated, and embedded services a command started on its own are each one line, with no
password and nothing left running."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pipeline import embedded
from pipeline.migrate import fresh_database
from tests.support import ServiceUrls, nightshift

REPORT = '{"team": "ops", "date": "2026-11-29"}'


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_an_unreachable_database_is_one_line_naming_the_host_and_never_the_password() -> None:
    url = "postgresql://nightshift:s3cret-pw@127.0.0.1:1/nightshift"
    for argv in (["runs"], ["show", "3f2a9c1e"]):
        line = one_line(nightshift(*argv, NIGHTSHIFT_DATABASE_URL=url))
        assert "cannot reach the database at 127.0.0.1:1/nightshift" in line
        assert "Connection refused" in line and "s3cret-pw" not in line
        assert line.endswith("(is PostgreSQL running there? check NIGHTSHIFT_DATABASE_URL)\n")


def test_an_unreachable_broker_is_one_line_naming_the_host_and_never_the_password(
    db_url: str,
) -> None:
    broker = "redis://:s3cret-pw@127.0.0.1:1/0"
    line = one_line(nightshift("start", "nightly_report", "--input", REPORT,
                               NIGHTSHIFT_BROKER_URL=broker))  # fmt: skip
    assert "cannot reach the broker at 127.0.0.1:1 (NIGHTSHIFT_BROKER_URL)" in line
    assert "s3cret-pw" not in line


@pytest.fixture
def empty_database(services: ServiceUrls) -> Iterator[str]:
    with fresh_database(services.database_url(f"ns_empty_{os.getpid()}")) as url:
        yield url


def test_an_unmigrated_database_says_to_migrate(empty_database: str) -> None:
    for argv in (["runs"], ["show", "3f2a9c1e"], ["start", "nightly_report", "--input", REPORT]):
        line = one_line(nightshift(*argv, NIGHTSHIFT_DATABASE_URL=empty_database))
        assert "has no nightshift tables yet: run `nightshift migrate`" in line, argv


def test_a_database_behind_this_release_says_to_migrate(db_url: str) -> None:
    # given a schema one column behind what this release reads
    with psycopg.connect(db_url.replace("+psycopg", "")) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN waiting_on")
    line = one_line(nightshift("runs", NIGHTSHIFT_DATABASE_URL=db_url))
    assert "has a schema older than this nightshift: run `nightshift migrate`" in line


@pytest.fixture
def fresh_data_dir() -> Iterator[Path]:
    # Not tmp_path: as root, postgres runs as another user that must traverse the path.
    path = Path(tempfile.mkdtemp(prefix="nightshift-implicit-")) / "data"
    yield path
    embedded.stop(path)
    shutil.rmtree(path.parent)


def test_a_short_command_stops_the_embedded_services_it_started(fresh_data_dir: Path) -> None:
    # given no URLs and a data directory nothing runs in
    result = nightshift(
        "runs",
        NIGHTSHIFT_DATABASE_URL=None,
        NIGHTSHIFT_BROKER_URL=None,
        NIGHTSHIFT_DATA_DIR=str(fresh_data_dir),
    )
    # then it says, in one line each, that the schema is missing and what it stopped again
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"nightshift: the embedded PostgreSQL in {fresh_data_dir} has no nightshift tables "
        "yet: run `nightshift services up` and `nightshift migrate`",
        "nightshift: stopped the embedded postgres and redis this command started "
        "(`nightshift services up` keeps them running)",
    ]
    assert not any(info.running for info in embedded.status(fresh_data_dir))
