"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 11:55:07.550977
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('status', sa.Enum('running', 'waiting', 'needs_attention', 'succeeded', 'failed', 'cancelled', name='run_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('input', postgresql.JSONB(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('parent_id', sa.Uuid(), nullable=True),
    sa.Column('batch_id', sa.String(length=200), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('max_steps', sa.Integer(), nullable=False),
    sa.Column('tool_calls', sa.Integer(), nullable=False),
    sa.Column('input_tokens', sa.BigInteger(), nullable=False),
    sa.Column('output_tokens', sa.BigInteger(), nullable=False),
    sa.Column('state', postgresql.JSONB(), nullable=False),
    sa.Column('fence', sa.BigInteger(), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('wake_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('waiting_on', sa.String(length=200), nullable=True),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('cancel_requested_by', sa.String(length=200), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('code_version', sa.String(length=64), nullable=False),
    sa.Column('prompt_version', sa.String(length=64), nullable=False),
    sa.Column('result', postgresql.JSONB(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('stop_reason', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['parent_id'], ['runs.id'], name=op.f('fk_runs_parent_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_runs_idempotency_key'))
    )
    op.create_index('ix_runs_batch_id', 'runs', ['batch_id'], unique=False)
    op.create_index('ix_runs_due_wake_at', 'runs', ['wake_at'], unique=False, postgresql_where=sa.text("status = 'waiting'"))
    op.create_index('ix_runs_runnable_lease', 'runs', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status = 'running'"))
    op.create_index('ix_runs_status_agent', 'runs', ['status', 'agent'], unique=False)
    op.create_table('actions',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=False),
    sa.Column('tool_use_id', sa.String(length=200), nullable=True),
    sa.Column('tool', sa.String(length=100), nullable=False),
    sa.Column('service', sa.String(length=100), nullable=False),
    sa.Column('args', postgresql.JSONB(), nullable=False),
    sa.Column('state', sa.Enum('pending_approval', 'intended', 'attempted', 'outcome_unknown', 'confirmed', 'failed', 'rejected', name='action_state', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('first_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('result', postgresql.JSONB(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('resolution', sa.String(length=64), nullable=True),
    sa.Column('requires_approval', sa.Boolean(), nullable=False),
    sa.Column('approvers', postgresql.JSONB(), nullable=True),
    sa.Column('decision', sa.String(length=16), nullable=True),
    sa.Column('decided_by', sa.String(length=200), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_actions_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_actions')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_actions_idempotency_key'))
    )
    op.create_index('ix_actions_run_id', 'actions', ['run_id'], unique=False)
    op.create_index('ix_actions_state', 'actions', ['state'], unique=False)
    op.create_table('artifacts',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('path', sa.String(length=1000), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('media_type', sa.String(length=100), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_artifacts_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_artifacts'))
    )
    op.create_index('ix_artifacts_run_id', 'artifacts', ['run_id'], unique=False)
    op.create_table('events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('source', sa.String(length=100), nullable=False),
    sa.Column('event_id', sa.String(length=200), nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=True),
    sa.Column('payload', postgresql.JSONB(), nullable=False),
    sa.Column('deliveries', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_events_run_id_runs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events')),
    sa.UniqueConstraint('source', 'event_id', name=op.f('uq_events_source_event_id'))
    )
    op.create_table('journal',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('step_name', sa.String(length=200), nullable=False),
    sa.Column('payload', postgresql.JSONB(), nullable=False),
    sa.Column('compacted', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_journal_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_journal')),
    sa.UniqueConstraint('run_id', 'key', name=op.f('uq_journal_run_id_key'))
    )
    op.create_table('schedule_fires',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('schedule', sa.String(length=100), nullable=False),
    sa.Column('slot', sa.DateTime(timezone=True), nullable=False),
    sa.Column('decision', sa.Enum('fired', 'caught_up', 'skipped_missed', 'skipped_overlap', 'buffered', 'cancelled_other', name='fire_decision', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=True),
    sa.Column('batch_id', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_schedule_fires_run_id_runs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedule_fires')),
    sa.UniqueConstraint('schedule', 'slot', name=op.f('uq_schedule_fires_schedule_slot'))
    )


def downgrade() -> None:
    op.drop_table('schedule_fires')
    op.drop_table('journal')
    op.drop_table('events')
    op.drop_index('ix_artifacts_run_id', table_name='artifacts')
    op.drop_table('artifacts')
    op.drop_index('ix_actions_state', table_name='actions')
    op.drop_index('ix_actions_run_id', table_name='actions')
    op.drop_table('actions')
    op.drop_index('ix_runs_status_agent', table_name='runs')
    op.drop_index('ix_runs_runnable_lease', table_name='runs', postgresql_where=sa.text("status = 'running'"))
    op.drop_index('ix_runs_due_wake_at', table_name='runs', postgresql_where=sa.text("status = 'waiting'"))
    op.drop_index('ix_runs_batch_id', table_name='runs')
    op.drop_table('runs')
