"""runs.outcome_published: a finished run's outcome in Celery's result backend, by the tick

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01 23:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The runs that finished before this release count as published: nobody waits on them.
    op.add_column('runs', sa.Column(
        'outcome_published', sa.Boolean(), server_default=sa.text('true'), nullable=False))
    op.alter_column('runs', 'outcome_published', server_default=sa.text('false'))
    op.create_index(
        'ix_runs_outcome_unpublished', 'runs', ['finished_at'], unique=False,
        postgresql_where=sa.text(
            "NOT outcome_published AND status IN ('succeeded', 'failed', 'cancelled')"),
    )


def downgrade() -> None:
    op.drop_index('ix_runs_outcome_unpublished', table_name='runs',
                  postgresql_where=sa.text(
                      "NOT outcome_published AND status IN ('succeeded', 'failed', 'cancelled')"))
    op.drop_column('runs', 'outcome_published')
