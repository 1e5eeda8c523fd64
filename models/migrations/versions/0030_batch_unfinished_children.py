"""whether a batch has a child left, from an index of the unfinished children only: every
child that finished counted all its batch's children under the batch's lock, and a
10,000-child night spent most of its time queued on that lock

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-03 14:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_runs_batch_unfinished ON runs (batch_id)"
        " WHERE status NOT IN ('succeeded', 'failed', 'cancelled')"
    )


def downgrade() -> None:
    op.drop_index("ix_runs_batch_unfinished", table_name="runs")
