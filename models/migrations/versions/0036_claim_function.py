"""a step's claim and everything it loads is one statement, nightshift_claim, and the limits
its stop checks read one function, nightshift_limits, that the claim, the model reply's
journal write and the limits read share (issue 35: a statement's driver work was most of a
step's worker CPU; five statements pipelined in the claim, two in the model reply)

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-04 17:30:00.000000

The functions are in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # The older code runs the claim's and the limits' statements itself and calls neither.
    op.execute(
        "DROP FUNCTION IF EXISTS nightshift_claim(uuid, text, float8, text, bigint, boolean,"
        " text, text, text)"
    )
    op.execute("DROP FUNCTION IF EXISTS nightshift_limits(uuid, boolean, text, text, text)")
