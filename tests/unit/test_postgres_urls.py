"""Every PostgreSQL URL form libpq and SQLAlchemy document is read the same way by the pool
(SQLAlchemy) and by the connections outside it (libpq), or refused in one line naming the form
to use. (tests/integration/test_database_urls.py runs each form end to end.)"""

from __future__ import annotations

import psycopg
import pytest

from pipeline.errors import SettingsError
from pipeline.settings import Settings
from pipeline.settings.postgres_urls import conninfo, postgres_url, where

TWO_HOSTS = {"host": "a,b", "port": "5432,5433", "dbname": "db", "user": "u"}


def libpq(url: str) -> dict[str, str]:
    return psycopg.conninfo.conninfo_to_dict(conninfo(url))  # type: ignore[return-value]


@pytest.mark.parametrize(
    "raw",
    [
        "postgresql://u@a:5432,b:5433/db",  # libpq's multi-host URI
        "postgresql://u@/db?host=a,b&port=5432,5433",  # libpq's lists in the query
        "postgresql+psycopg://u@/db?host=a:5432&host=b:5433",  # SQLAlchemy's form
        "host=a,b port=5432,5433 dbname=db user=u",  # libpq's key=value string
    ],
)
def test_each_multi_host_form_reaches_both_hosts_in_order(raw: str) -> None:
    url = postgres_url("NIGHTSHIFT_DATABASE_URL", raw)
    assert url.startswith("postgresql+psycopg://")
    assert libpq(url) == TWO_HOSTS
    assert where(url) == "a:5432,b:5433/db"


def test_options_and_passwords_survive_the_rewrite() -> None:
    raw = (
        "host=a,b port=5432,5433 dbname=db user=u password='p@ss w:rd' "
        "target_session_attrs=read-write"
    )
    url = postgres_url("NIGHTSHIFT_DATABASE_URL", raw)
    assert libpq(url) == TWO_HOSTS | {"password": "p@ss w:rd", "target_session_attrs": "read-write"}
    uri = "postgresql://u:p%40ss@a:5432,b:5433/db?target_session_attrs=read-write&sslmode=prefer"
    assert libpq(postgres_url("V", uri)) == TWO_HOSTS | {
        "password": "p@ss",
        "target_session_attrs": "read-write",
        "sslmode": "prefer",
    }


def test_a_one_host_url_is_kept_as_written() -> None:
    url = postgres_url("V", "postgresql://u:pw@db:5432/x?sslmode=require")
    assert url == "postgresql+psycopg://u:pw@db:5432/x?sslmode=require"
    assert libpq(url) == {
        "host": "db",
        "port": "5432",
        "dbname": "x",
        "user": "u",
        "password": "pw",
        "sslmode": "require",
    }
    assert libpq(postgres_url("V", "host=db port=5432 dbname=x user=u"))["host"] == "db"


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("postgresql://u@/db?host=a:1&host=b:2&port=5", "host=h1,h2,h3&port=p1,p2,p3"),
        ("postgresql://u@/db?host=a,b,c&port=1,2", "several hosts: postgresql://"),
        ("host=a,b,c port=1,2 dbname=db", "3 hosts and 2 ports"),
        ("mysql://u@db/x", "must look like postgresql://user@host:5432/dbname"),
        ("postgresql:///x", "names no host"),
        ("host=a colour=blue", 'invalid connection option "colour"'),
        ("host=a port=five", "port 'five' is not a number"),
    ],
)
def test_a_form_that_cannot_work_is_refused_in_one_line(raw: str, says: str) -> None:
    with pytest.raises(SettingsError, match="NIGHTSHIFT_DATABASE_URL") as refused:
        Settings.from_env({"NIGHTSHIFT_DATABASE_URL": raw})
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_refusal_never_shows_the_password() -> None:
    for raw in (
        "postgresql://u:s3cret-pw@a:1,b:zz/db",
        "host=a password=s3cret-pw dbname",
        "postgresql://u:s3cret-pw@db:port/x",
    ):
        with pytest.raises(SettingsError) as refused:
            postgres_url("NIGHTSHIFT_DATABASE_URL", raw)
        assert "s3cret" not in str(refused.value)


def test_the_direct_url_is_read_like_the_database_url() -> None:
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_DATABASE_URL": "postgresql://u@pooler:6432/db",
            "NIGHTSHIFT_DATABASE_DIRECT_URL": "postgresql://u@a:5432,b:5433/db",
        }
    )
    assert settings.database_direct_url is not None
    assert libpq(settings.database_direct_url) == TWO_HOSTS
