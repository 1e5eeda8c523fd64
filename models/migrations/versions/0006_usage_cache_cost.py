"""prompt-cache usage and recorded cost per run; a tool-call cap per batch

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('cache_creation_input_tokens', sa.BigInteger(), server_default='0', nullable=False))
    op.add_column('runs', sa.Column('cache_read_input_tokens', sa.BigInteger(), server_default='0', nullable=False))
    op.add_column('runs', sa.Column('cost_usd', sa.Numeric(precision=18, scale=8, asdecimal=False), server_default='0', nullable=False))
    op.add_column('batches', sa.Column('tool_call_cap', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column('batches', 'tool_call_cap')
    op.drop_column('runs', 'cost_usd')
    op.drop_column('runs', 'cache_read_input_tokens')
    op.drop_column('runs', 'cache_creation_input_tokens')
