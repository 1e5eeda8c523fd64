"""a lease that lapsed because PostgreSQL failed over is excused like one a restart explains:
nightshift_failed_attempt asks nightshift_server_since (the server's start, or about its
promotion) instead of pg_postmaster_start_time, which a promotion does not move

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-04 15:40:00.000000

The functions are in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # Nothing to undo that the older code would mind: it calls nightshift_failed_attempt with
    # the same arguments, and the functions stay until the database moves forward again.
    pass
