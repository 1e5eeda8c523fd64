"""webhook deliveries: the replay cache every API process shares

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('webhook_deliveries',
    sa.Column('signature', sa.String(length=64), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('signature', name=op.f('pk_webhook_deliveries'))
    )
    op.create_index('ix_webhook_deliveries_received_at', 'webhook_deliveries', ['received_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_webhook_deliveries_received_at', table_name='webhook_deliveries')
    op.drop_table('webhook_deliveries')
