"""alert deliveries: an alert's webhook POST is a notifications row like a completion webhook's
(alert_id set, no run_events row), written in the alert's own fenced transaction

Revision ID: 0023
Revises: 0027
Create Date: 2026-12-02 07:40:00.000000

Numbered 0023 as assigned; it follows 0027, the head when it landed.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0023'
down_revision: str | None = '0027'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('notifications', sa.Column('alert_id', sa.BigInteger(), nullable=True))
    op.alter_column('notifications', 'event_id', existing_type=sa.BigInteger(), nullable=True)
    op.create_index('ix_notifications_alert_id', 'notifications', ['alert_id'], unique=True, postgresql_where=sa.text('alert_id IS NOT NULL'))


def downgrade() -> None:
    op.execute("DELETE FROM notifications WHERE alert_id IS NOT NULL")
    op.drop_index('ix_notifications_alert_id', table_name='notifications', postgresql_where=sa.text('alert_id IS NOT NULL'))
    op.alter_column('notifications', 'event_id', existing_type=sa.BigInteger(), nullable=False)
    op.drop_column('notifications', 'alert_id')
