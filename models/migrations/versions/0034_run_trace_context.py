"""runs.trace_context: the run span's trace context (W3C traceparent and tracestate), so that
every step, on any worker and after a takeover or a tick's re-send, continues the trace its
caller started (OpenTelemetry, pipeline/tracing.py)

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-04 17:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, and runs started before it have none.
    op.add_column("runs", sa.Column("trace_context", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "trace_context")
