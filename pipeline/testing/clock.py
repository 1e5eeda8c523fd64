"""A test's clock: moved forward by moving every stored time of the run's own database back
(models/sql/testing.sql), so PostgreSQL's now() and Python's wall clock both agree that the
time has passed, and nothing in the engine has a clock to swap."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from sqlalchemy.engine import make_url

import pipeline.statements as statements


def move_forward(database_url: str, by: timedelta) -> None:
    """Make the database's recorded times `by` older, in one transaction."""
    if by <= timedelta(0):
        raise ValueError(f"the clock moves forward only (by {by})")
    url = make_url(database_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
        statements.on_connection(conn, "clock_moved_by", by=f"{by.total_seconds()} seconds")
        statements.on_connection(conn, "move_clock_back")
