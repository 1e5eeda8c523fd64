-- The current definition of every function and trigger nightshift's schema has.
--
-- This file is the truth; the migrations that apply it (0024 and each later one that changes
-- it) are its history. Change a definition here, and add a migration that re-applies the file
-- (models.sql.apply_schema) and whose downgrade restores the previous text. Every statement
-- is idempotent, so applying the file twice changes nothing.
-- tests/integration/test_schema.py checks that a database migrated to head has exactly these.
--
-- Why triggers: run_events (the progress feed) and notifications (completion webhooks) are
-- written in the transaction of the change they describe, so no writer can forget one and no
-- crash can commit a change without its event. Each trigger has a WHEN clause, so the statements
-- that change nothing a watcher sees (lease renewals, the fence guard's updated_at) never enter
-- PL/pgSQL. The channel nightshift_run_settled carries only a run id; it is sent when a run
-- becomes terminal or parked, a few times per run, never per step (a NOTIFY serialises the
-- commits that send it).

-- A run's changes: created, claimed (a new fence: which attempt of its step), and each status
-- change. A status change that a person or a caller waits for also notifies
-- nightshift_run_settled and, with a notify_url on the run or its batch, queues a notification:
-- `run:<id>:finished` when the run ends, and `run:<id>:waiting:<event id>` /
-- `batch:<id>:waiting:<event id>` when it starts waiting for a person (an approval, or an
-- unknown outcome: needs_attention). A batch id too long for a key is hashed.
CREATE OR REPLACE FUNCTION nightshift_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_id bigint;
    finished boolean;
    waiting_batch record;
BEGIN
    IF TG_ARGV[0] = 'created' THEN
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'created',
            jsonb_build_object('agent', NEW.agent, 'status', NEW.status, 'batch_id', NEW.batch_id,
                               'deadline', NEW.deadline));
    ELSIF TG_ARGV[0] = 'claimed' THEN
        -- attempt counts the run's claims (one per step when nothing fails); step_attempt is
        -- this claim's attempt of its step: 1 + the failed attempts of the step on the row
        -- (the tick and the time bound record them before the next claim; a claim that takes
        -- the run from a holder records that failure in this UPDATE).
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'claimed',
            jsonb_build_object('step', NEW.step, 'attempt', NEW.attempt,
                               'worker', NEW.lease_owner, 'fence', NEW.fence,
                               'step_attempt', 1
                                   + CASE WHEN NEW.failed_step = NEW.step
                                          THEN jsonb_array_length(NEW.failures) ELSE 0 END));
    ELSE
        INSERT INTO run_events (run_id, kind, data) VALUES (NEW.id, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status, 'step', NEW.step,
                               'waiting_on', NEW.waiting_on, 'wake_at', NEW.wake_at,
                               'stop_reason', NEW.stop_reason, 'error', left(NEW.error, 500)))
        RETURNING id INTO event_id;
        IF NEW.status IN ('waiting', 'needs_attention', 'succeeded', 'failed', 'cancelled') THEN
            PERFORM pg_notify('nightshift_run_settled', NEW.id::text);
        END IF;
        IF NEW.status IN ('succeeded', 'failed', 'cancelled', 'needs_attention')
           OR (NEW.status = 'waiting' AND split_part(NEW.waiting_on, ':', 1) = 'approval') THEN
            finished := NEW.status IN ('succeeded', 'failed', 'cancelled');
            IF NEW.notify_url IS NOT NULL THEN
                INSERT INTO notifications (idempotency_key, event, run_id, batch_id, event_id, url, state)
                VALUES ('run:' || NEW.id || CASE WHEN finished THEN ':finished' ELSE ':waiting:' || event_id END,
                        CASE WHEN finished THEN 'run.finished' ELSE 'run.waiting' END,
                        NEW.id, NEW.batch_id, event_id, NEW.notify_url, 'intended')
                ON CONFLICT (idempotency_key) DO NOTHING;
            END IF;
            IF NOT finished THEN
                SELECT b.id, b.notify_url INTO waiting_batch FROM batches b
                 WHERE b.notify_url IS NOT NULL
                   AND (b.id = NEW.batch_id OR (NEW.batch_id IS NULL AND b.synthesis_run_id = NEW.id));
                IF FOUND THEN
                    INSERT INTO notifications (idempotency_key, event, run_id, batch_id, event_id, url, state)
                    VALUES ('batch:' || CASE WHEN length(waiting_batch.id) <= 160 THEN waiting_batch.id
                                             ELSE md5(waiting_batch.id) END || ':waiting:' || event_id,
                            'batch.waiting', NEW.id, waiting_batch.id, event_id,
                            waiting_batch.notify_url, 'intended')
                    ON CONFLICT (idempotency_key) DO NOTHING;
                END IF;
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- A journal entry written.
CREATE OR REPLACE FUNCTION nightshift_journal_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_events (run_id, kind, journal_id, data) VALUES (NEW.run_id, 'journal', NEW.id,
        jsonb_build_object('key', NEW.key, 'step', NEW.step));
    RETURN NULL;
END $$;

-- A side effect recorded, and each change of its state.
CREATE OR REPLACE FUNCTION nightshift_action_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_events (run_id, kind, data) VALUES (NEW.run_id, 'action',
        jsonb_build_object('key', NEW.idempotency_key, 'tool', NEW.tool, 'state', NEW.state,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
                           'attempts', NEW.attempts, 'decision', NEW.decision,
                           'decided_by', NEW.decided_by, 'resolution', NEW.resolution));
    RETURN NULL;
END $$;

-- A batch created, and each change of its status; with a notify_url, its end queues the
-- notification `batch:<id>:finished`.
CREATE OR REPLACE FUNCTION nightshift_batch_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event_id bigint;
BEGIN
    INSERT INTO run_events (batch_id, kind, data) VALUES (NEW.id, 'batch',
        jsonb_build_object('status', NEW.status,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
                           'stop_reason', NEW.stop_reason))
    RETURNING id INTO event_id;
    IF TG_OP = 'UPDATE' AND NEW.notify_url IS NOT NULL
       AND NEW.status IN ('succeeded', 'failed', 'stopped') THEN
        INSERT INTO notifications (idempotency_key, event, batch_id, event_id, url, state)
        VALUES ('batch:' || CASE WHEN length(NEW.id) <= 160 THEN NEW.id ELSE md5(NEW.id) END
                    || ':finished',
                'batch.finished', NEW.id, event_id, NEW.notify_url, 'intended')
        ON CONFLICT (idempotency_key) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

-- A failed attempt of a run's step (pipeline/runs/failed_attempts.py says what counts): the
-- row's new failed_attempts, failures and failed_step, from the row as it was, for the UPDATE
-- that takes the run from that attempt: the claim that takes over, the tick, the give-up of a
-- step past its time bound or after a database error (`SET (failed_attempts, failures,
-- failed_step) = (SELECT * FROM nightshift_failed_attempt(runs, ...))`). The attempt's holder
-- and fence are the row's. `kind` is a FailureKind. `failed`: whether this row's attempt failed
-- at all (the tick also hands on runs that merely lost their message: those keep their
-- values). `lapsed_at` and `lease_seconds`: when the attempt's lease expired and a lease's
-- length, when it may have failed by its lease lapsing (NULL otherwise): a lapse that
-- PostgreSQL's restart or failover explains (it expired before the server had been up, or the
-- primary, for two leases: nightshift_server_since) is
-- recorded with database_restarted and not counted. `error` and `counted`: a database error's
-- line and whether it counts (database_error only: an outage is the server's failure, not the
-- run's; it never makes the run a suspect, its process did not die).
-- Since when this server has been the primary: its start, or, on a promoted standby, about
-- its promotion (the last commit it replayed as a standby: during a night the old primary
-- commits until it dies, so that is moments before the promotion). A promotion does not move
-- pg_postmaster_start_time(), and a failover's lapses are the server's, like a restart's.
-- GREATEST skips the NULL of a server that never replayed anything.
CREATE OR REPLACE FUNCTION nightshift_server_since() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT greatest(pg_postmaster_start_time(), pg_last_xact_replay_timestamp())
$$;

CREATE OR REPLACE FUNCTION nightshift_failed_attempt(
    run runs, kind text, failed boolean, lapsed_at timestamptz, lease_seconds float8,
    error text, counted boolean,
    OUT failed_attempts integer, OUT failures jsonb, OUT failed_step integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    restarted boolean := coalesce(lapsed_at < now() AND lapsed_at < nightshift_server_since()
                                  + make_interval(secs => 2 * lease_seconds), false);
    -- The first failure of a step counts whatever its cause: the run becomes a suspect.
    first_failure boolean := run.failed_step IS DISTINCT FROM run.step
                             OR run.failed_attempts = 0;
    same_step boolean := run.failed_step IS NOT DISTINCT FROM run.step;
    -- After the first, only what the run cannot share: its own time bound, or a loss while it
    -- held its process's quarantine (its fence recorded there).
    own boolean := coalesce(kind = 'time_limit' OR run.quarantine_fence = run.fence, false);
    entry jsonb;
BEGIN
    failed_attempts := run.failed_attempts;
    failures := run.failures;
    failed_step := run.failed_step;
    IF NOT failed THEN
        RETURN;
    END IF;
    IF kind = 'database_error' THEN
        entry := jsonb_build_object('kind', kind, 'worker', run.lease_owner, 'counted', counted,
                                    'error', error, 'database_restarted', false, 'at', now());
        failed_attempts := CASE WHEN NOT same_step THEN CASE WHEN counted THEN 1 ELSE 0 END
                                WHEN counted THEN run.failed_attempts + 1
                                ELSE run.failed_attempts END;
    ELSE
        entry := jsonb_build_object('kind', kind, 'worker', run.lease_owner,
                                    'counted', NOT restarted AND (first_failure OR own),
                                    'database_restarted', restarted, 'at', now());
        failed_attempts := CASE WHEN restarted AND same_step THEN run.failed_attempts
                                WHEN restarted THEN 0
                                WHEN first_failure THEN 1
                                WHEN own THEN run.failed_attempts + 1
                                ELSE run.failed_attempts END;
    END IF;
    failures := CASE WHEN same_step THEN run.failures || jsonb_build_array(entry)
                     ELSE jsonb_build_array(entry) END;
    failed_step := run.step;
END $$;

DROP TRIGGER IF EXISTS run_created_event ON runs;
CREATE TRIGGER run_created_event AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION nightshift_run_event('created');

DROP TRIGGER IF EXISTS run_claimed_event ON runs;
-- A claim is a new fence with a holder: the time bound's give-up also moves the fence (to
-- refuse the overrunning step's writes) but leaves the run to the next claim.
CREATE TRIGGER run_claimed_event AFTER UPDATE OF fence ON runs
    FOR EACH ROW WHEN (OLD.fence IS DISTINCT FROM NEW.fence AND NEW.lease_owner IS NOT NULL)
    EXECUTE FUNCTION nightshift_run_event('claimed');

DROP TRIGGER IF EXISTS run_status_event ON runs;
CREATE TRIGGER run_status_event AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION nightshift_run_event('status');

DROP TRIGGER IF EXISTS journal_event ON journal;
CREATE TRIGGER journal_event AFTER INSERT ON journal
    FOR EACH ROW EXECUTE FUNCTION nightshift_journal_event();

DROP TRIGGER IF EXISTS action_created_event ON actions;
CREATE TRIGGER action_created_event AFTER INSERT ON actions
    FOR EACH ROW EXECUTE FUNCTION nightshift_action_event();

DROP TRIGGER IF EXISTS action_state_event ON actions;
CREATE TRIGGER action_state_event AFTER UPDATE OF state ON actions
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION nightshift_action_event();

DROP TRIGGER IF EXISTS batch_created_event ON batches;
CREATE TRIGGER batch_created_event AFTER INSERT ON batches
    FOR EACH ROW EXECUTE FUNCTION nightshift_batch_event();

DROP TRIGGER IF EXISTS batch_status_event ON batches;
CREATE TRIGGER batch_status_event AFTER UPDATE OF status ON batches
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION nightshift_batch_event();
