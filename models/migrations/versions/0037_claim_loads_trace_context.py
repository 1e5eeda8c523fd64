"""nightshift_claim loads the run's trace_context with the rest of the run, for the step's span
(OpenTelemetry, pipeline/tracing.py)

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-04 17:55:00.000000

The functions are in models/sql/schema.sql.
"""

from collections.abc import Sequence

from alembic import op

from models.sql import apply_schema

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    apply_schema(op.get_bind())


def downgrade() -> None:
    # Nothing the older code would mind: it reads the run's columns it knows by name, and an
    # extra key in the claim's `run` is one it never asks for.
    pass
