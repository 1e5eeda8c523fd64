"""a claim's event says which attempt of its step it is (step_attempt), so that people are
shown attempts only when an attempt failed

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02 07:30:00.000000

`attempt` counts every claim of the run, one per step when nothing fails: `nightshift watch`
printed `(attempt 3)` on a run that never crashed. The function is in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = '0025'
down_revision: str | None = '0024'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # The new text only adds a key to the claimed event's data, which the code of 0024 never
    # reads: it serves the older schema as it is, so nothing is restored.
    pass
