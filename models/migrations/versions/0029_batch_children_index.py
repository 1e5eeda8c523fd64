"""a batch's children listed by an index in their order (batch, newest first, id): the list
read every run of the database at 100,000 runs; the index replaces the one on batch_id alone

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = '0029'
down_revision: str | None = '0028'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_runs_batch_listed ON runs (batch_id, created_at DESC, id)")
    op.drop_index("ix_runs_batch_id", table_name="runs")


def downgrade() -> None:
    op.create_index("ix_runs_batch_id", "runs", ["batch_id"])
    op.drop_index("ix_runs_batch_listed", table_name="runs")
