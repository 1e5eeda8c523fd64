"""run_events: the progress feed, written by triggers in the transaction of each change; and a
notification on channel nightshift_run_settled when a run finishes or starts waiting

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:00:00.000000

Each trigger has a WHEN clause, so the statements that change nothing a watcher sees (lease
renewals, the fence guard's `updated_at`) never enter PL/pgSQL. The channel carries only the
run id; it is sent when a run becomes terminal or parked, a few times per run, never per step
(a NOTIFY serialises the commits that send it).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SETTLED_CHANNEL = 'nightshift_run_settled'

_FUNCTIONS = f"""
CREATE FUNCTION nightshift_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_ARGV[0] = 'created' THEN
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'created',
            jsonb_build_object('agent', NEW.agent, 'status', NEW.status, 'batch_id', NEW.batch_id,
                               'deadline', NEW.deadline));
    ELSIF TG_ARGV[0] = 'claimed' THEN
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'claimed',
            jsonb_build_object('step', NEW.step, 'attempt', NEW.attempt,
                               'worker', NEW.lease_owner, 'fence', NEW.fence));
    ELSE
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status, 'step', NEW.step,
                               'waiting_on', NEW.waiting_on, 'wake_at', NEW.wake_at,
                               'stop_reason', NEW.stop_reason, 'error', left(NEW.error, 500)));
        IF NEW.status IN ('waiting', 'needs_attention', 'succeeded', 'failed', 'cancelled') THEN
            PERFORM pg_notify('{SETTLED_CHANNEL}', NEW.id::text);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION nightshift_journal_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_events (run_id, kind, journal_id, data) VALUES (NEW.run_id, 'journal', NEW.id,
        jsonb_build_object('key', NEW.key, 'step', NEW.step));
    RETURN NULL;
END $$;

CREATE FUNCTION nightshift_action_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_events (run_id, kind, data) VALUES (NEW.run_id, 'action',
        jsonb_build_object('key', NEW.idempotency_key, 'tool', NEW.tool, 'state', NEW.state,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
                           'attempts', NEW.attempts, 'decision', NEW.decision,
                           'decided_by', NEW.decided_by, 'resolution', NEW.resolution));
    RETURN NULL;
END $$;

CREATE FUNCTION nightshift_batch_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_events (batch_id, kind, data) VALUES (NEW.id, 'batch',
        jsonb_build_object('status', NEW.status,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                           'stop_reason', NEW.stop_reason));
    RETURN NULL;
END $$;
"""

_TRIGGERS = """
CREATE TRIGGER run_created_event AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION nightshift_run_event('created');
CREATE TRIGGER run_claimed_event AFTER UPDATE OF fence ON runs
    FOR EACH ROW WHEN (OLD.fence IS DISTINCT FROM NEW.fence)
    EXECUTE FUNCTION nightshift_run_event('claimed');
CREATE TRIGGER run_status_event AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION nightshift_run_event('status');
CREATE TRIGGER journal_event AFTER INSERT ON journal
    FOR EACH ROW EXECUTE FUNCTION nightshift_journal_event();
CREATE TRIGGER action_created_event AFTER INSERT ON actions
    FOR EACH ROW EXECUTE FUNCTION nightshift_action_event();
CREATE TRIGGER action_state_event AFTER UPDATE OF state ON actions
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION nightshift_action_event();
CREATE TRIGGER batch_created_event AFTER INSERT ON batches
    FOR EACH ROW EXECUTE FUNCTION nightshift_batch_event();
CREATE TRIGGER batch_status_event AFTER UPDATE OF status ON batches
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION nightshift_batch_event();
"""

_DROP = """
DROP TRIGGER batch_status_event ON batches;
DROP TRIGGER batch_created_event ON batches;
DROP TRIGGER action_state_event ON actions;
DROP TRIGGER action_created_event ON actions;
DROP TRIGGER journal_event ON journal;
DROP TRIGGER run_status_event ON runs;
DROP TRIGGER run_claimed_event ON runs;
DROP TRIGGER run_created_event ON runs;
DROP FUNCTION nightshift_batch_event();
DROP FUNCTION nightshift_action_event();
DROP FUNCTION nightshift_journal_event();
DROP FUNCTION nightshift_run_event();
"""


def upgrade() -> None:
    op.create_table('run_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('xid', sa.BigInteger(), server_default=sa.text('(pg_current_xact_id())::text::bigint'), nullable=False),
    sa.Column('run_id', sa.Uuid(), nullable=True),
    sa.Column('batch_id', sa.String(length=200), nullable=True),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('journal_id', sa.BigInteger(), nullable=True),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_run_events'))
    )
    op.create_index('ix_run_events_run_position', 'run_events', ['run_id', 'xid', 'id'], unique=False)
    op.create_index('ix_run_events_batch_position', 'run_events', ['batch_id', 'xid', 'id'], unique=False, postgresql_where=sa.text('batch_id IS NOT NULL'))
    op.execute(_FUNCTIONS)
    op.execute(_TRIGGERS)


def downgrade() -> None:
    op.execute(_DROP)
    op.drop_index('ix_run_events_batch_position', table_name='run_events', postgresql_where=sa.text('batch_id IS NOT NULL'))
    op.drop_index('ix_run_events_run_position', table_name='run_events')
    op.drop_table('run_events')
