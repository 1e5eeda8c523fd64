"""a failed attempt of a step is recorded by one function, nightshift_failed_attempt, that
the claim, the tick and a step's give-up call from their named statements (models/sql/), instead
of SET clauses built in Python three times

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-04 09:00:00.000000

The function is in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # The older code builds the same SET clauses itself and calls no function.
    op.execute(
        "DROP FUNCTION IF EXISTS"
        " nightshift_failed_attempt(runs, text, boolean, timestamptz, float8, text, boolean)"
    )
