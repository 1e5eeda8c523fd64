"""status page sessions kept server-side: sign-out and revocation end them at once

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 22:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('status_page_sessions',
    sa.Column('id_hash', sa.String(length=64), nullable=False),
    sa.Column('who', sa.String(length=200), nullable=False),
    sa.Column('via', sa.String(length=200), nullable=False),
    sa.Column('token_id', sa.Uuid(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id_hash', name=op.f('pk_status_page_sessions'))
    )
    op.create_index('ix_status_page_sessions_expires_at', 'status_page_sessions', ['expires_at'], unique=False)
    op.create_index('ix_status_page_sessions_token_id', 'status_page_sessions', ['token_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_status_page_sessions_token_id', table_name='status_page_sessions')
    op.drop_index('ix_status_page_sessions_expires_at', table_name='status_page_sessions')
    op.drop_table('status_page_sessions')
