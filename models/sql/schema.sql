-- The current definition of every function and trigger nightshift's schema has.
--
-- This file is the truth; the migrations that apply it (0024 and each later one that changes
-- it) are its history. Change a definition here, and add a migration that re-applies the file
-- (models.sql.apply_schema) and whose downgrade restores the previous text. Every statement
-- is idempotent, so applying the file twice changes nothing.
-- tests/integration/test_schema.py checks that a database migrated to head has exactly these.
--
-- Why triggers: run_events (the progress feed) and completion webhooks (actions of kind
-- `webhook`, models/action.py) are written in the transaction of the change they describe, so
-- no writer can forget one and no crash can commit a change without its event. Each trigger
-- has a WHEN clause, so the statements that change nothing a watcher sees (lease renewals, the
-- fence guard's updated_at) never enter PL/pgSQL. The channel nightshift_run_settled carries only a run id; it is sent when a run
-- becomes terminal or parked, a few times per run, never per step (a NOTIFY serialises the
-- commits that send it).

-- A run's changes: created, claimed (a new fence: which attempt of its step), and each status
-- change. A status change that a person or a caller waits for also notifies
-- nightshift_run_settled and, with a notify_url on the run or its batch, records a webhook
-- action (intended, sent by pipeline/delivery/):
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
                INSERT INTO actions (id, idempotency_key, kind, run_id, batch_id, tool, service, args,
                                     state, attempts, requires_approval, approvers)
                VALUES (gen_random_uuid(),
                        'run:' || NEW.id || CASE WHEN finished THEN ':finished' ELSE ':waiting:' || event_id END,
                        'webhook', NEW.id, NEW.batch_id,
                        CASE WHEN finished THEN 'run.finished' ELSE 'run.waiting' END, 'webhook',
                        jsonb_build_object('url', NEW.notify_url, 'event_id', event_id),
                        'intended', 0, false, '[]')
                ON CONFLICT (idempotency_key) DO NOTHING;
            END IF;
            IF NOT finished THEN
                SELECT b.id, b.notify_url INTO waiting_batch FROM batches b
                 WHERE b.notify_url IS NOT NULL
                   AND (b.id = NEW.batch_id OR (NEW.batch_id IS NULL AND b.synthesis_run_id = NEW.id));
                IF FOUND THEN
                    INSERT INTO actions (id, idempotency_key, kind, run_id, batch_id, tool, service,
                                         args, state, attempts, requires_approval, approvers)
                    VALUES (gen_random_uuid(),
                            'batch:' || CASE WHEN length(waiting_batch.id) <= 160 THEN waiting_batch.id
                                             ELSE md5(waiting_batch.id) END || ':waiting:' || event_id,
                            'webhook', NEW.id, waiting_batch.id, 'batch.waiting', 'webhook',
                            jsonb_build_object('url', waiting_batch.notify_url, 'event_id', event_id),
                            'intended', 0, false, '[]')
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

-- A tool's side effect recorded, and each change of its state. A webhook is not the run's
-- progress (it is sent after the run, or its batch, moved on): no event. (Tested here, not in
-- the triggers' WHEN: the migrations before 0039 apply this file to a table with no `kind`.)
CREATE OR REPLACE FUNCTION nightshift_action_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind <> 'tool' THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_events (run_id, kind, data) VALUES (NEW.run_id, 'action',
        jsonb_build_object('key', NEW.idempotency_key, 'tool', NEW.tool, 'state', NEW.state,
                           'previous', CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
                           'attempts', NEW.attempts, 'decision', NEW.decision,
                           'decided_by', NEW.decided_by, 'resolution', NEW.resolution));
    RETURN NULL;
END $$;

-- A batch created, and each change of its status; with a notify_url, its end records the
-- webhook action `batch:<id>:finished`.
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
        INSERT INTO actions (id, idempotency_key, kind, batch_id, tool, service, args, state,
                             attempts, requires_approval, approvers)
        VALUES (gen_random_uuid(),
                'batch:' || CASE WHEN length(NEW.id) <= 160 THEN NEW.id ELSE md5(NEW.id) END
                    || ':finished',
                'webhook', NEW.id, 'batch.finished', 'webhook',
                jsonb_build_object('url', NEW.notify_url, 'event_id', event_id),
                'intended', 0, false, '[]')
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

-- What a step's stop checks read before a model or tool call (pipeline/engine/limits.py), as
-- one JSON object: cancellation, the deadline, the run's spend, its batch's (summed only when
-- the batch has a cap) and its night's (summed only when `night_capped`: a nightly cap is set;
-- a night runs noon to noon in `night_timezone`), and, under a nightly cap, whether the run is
-- the synthesis of a batch the night stopped (`night_stopped`), found by its key's batch id
-- (`<batch>:synthesis`). One definition for the three statements that read it (step.sql's
-- claim, journal_reply and limits). JSON, not a row type: its callers take it whole.
CREATE OR REPLACE FUNCTION nightshift_limits(
    limited_run uuid, night_capped boolean, night_timezone text, night_warning text,
    night_stopped text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT to_jsonb(l) FROM (
SELECT r.cancel_requested,
       r.cancel_requested_by,
       coalesce(r.deadline <= now(), false) AS past_deadline,
       r.tool_calls,
       r.input_tokens + r.cache_creation_input_tokens + r.cache_read_input_tokens
           + r.output_tokens AS tokens,
       r.cost_usd,
       r.batch_id,
       b.status AS batch_status,
       b.stop_reason AS batch_stop_reason,
       b.token_cap AS batch_token_cap,
       b.cost_cap_usd AS batch_cost_cap,
       b.tool_call_cap AS batch_tool_call_cap,
       batch.tokens AS batch_tokens,
       batch.cost_usd AS batch_cost_usd,
       batch.tool_calls AS batch_tool_calls,
       night.name AS night,
       night.tokens AS night_tokens,
       night.cost_usd AS night_cost_usd,
       night.warned AS night_warned,
       -- right(), not LIKE: this file reaches the driver as it is, and a percent sign there
       -- would read as a placeholder.
       night_capped AND right(r.idempotency_key, length(':synthesis')) = ':synthesis' AND EXISTS (
           SELECT 1 FROM batches s
            WHERE s.id = left(r.idempotency_key, -length(':synthesis'))
              AND s.synthesis_run_id = r.id AND s.stop_reason = night_stopped
       ) AS sums_up_stopped_night
  FROM runs r
  LEFT JOIN batches b ON b.id = r.batch_id
  LEFT JOIN LATERAL (
        SELECT coalesce(sum(c.input_tokens + c.cache_creation_input_tokens
                            + c.cache_read_input_tokens + c.output_tokens), 0) AS tokens,
               coalesce(sum(c.cost_usd), 0) AS cost_usd,
               coalesce(sum(c.tool_calls), 0) AS tool_calls
          FROM runs c
         WHERE c.batch_id = b.id
           AND (b.token_cap IS NOT NULL OR b.cost_cap_usd IS NOT NULL
                OR b.tool_call_cap IS NOT NULL)
  ) batch ON true
  LEFT JOIN LATERAL (
        SELECT to_char(w.night, 'YYYY-MM-DD') AS name,
               coalesce(sum(n.input_tokens + n.cache_creation_input_tokens
                            + n.cache_read_input_tokens + n.output_tokens), 0) AS tokens,
               coalesce(sum(n.cost_usd), 0) AS cost_usd,
               EXISTS (SELECT 1 FROM alerts
                        WHERE kind = night_warning AND subject = 'night:' || w.night) AS warned
          FROM (SELECT CAST((r.created_at AT TIME ZONE night_timezone)
                            - interval '12 hours' AS date) AS night) w
          LEFT JOIN runs n
            ON n.created_at >= (w.night + time '12:00') AT TIME ZONE night_timezone
           AND n.created_at < (w.night + 1 + time '12:00') AT TIME ZONE night_timezone
         WHERE night_capped
         GROUP BY w.night
  ) night ON true
 WHERE r.id = limited_run
) l
$$;

-- A step's claim and everything it loads, in one call (step.sql's `claim`): one statement
-- for the step's first round trip, where five cost the worker a statement's driver work each.
-- Take the run if it is runnable and nobody holds a live lease, or its holder is `dead_holder`
-- (a process the worker knows is gone; NULL: none). Taking it from a holder is a failed
-- attempt of its step, recorded in the same UPDATE (nightshift_failed_attempt, reading the row
-- as it was); a lapsed lease also records when the run stopped moving (`resumptions`), unless
-- the tick found it first (then the lease was already given up). FOR UPDATE returns the row as
-- it is once its lock is ours, so a tick that committed meanwhile is seen.
-- `took`: {fence, taken_from, lapsed_seconds, resumed_cause, resumed_seconds} (NULL: not
-- claimed: a duplicate delivery, or another worker holds it; `run` then says who, in
-- lease_owner); `run`: the run as a step needs it (`synthesis_of`: the batch whose synthesis
-- the fan-out started as this run; `trace_context`: its step span's parent); `limits`: nightshift_limits; `entries`: the journal
-- entries after `after_entry` (the last one the worker has read), in order.
-- PL/pgSQL, not one SQL statement: each statement below takes its own snapshot, so the
-- resumption row a tick committed while the claim waited for the run's lock is seen and
-- closed (only the holder of a live lease closes it), and what is loaded is the run as claimed.
CREATE OR REPLACE FUNCTION nightshift_claim(
    claimed_run uuid, claimer text, lease_seconds float8, dead_holder text, after_entry bigint,
    night_capped boolean, night_timezone text, night_warning text, night_stopped text,
    OUT took jsonb, OUT run jsonb, OUT limits jsonb, OUT entries jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    closed jsonb;
BEGIN
    WITH prior AS (
        SELECT id, fence, lease_expires_at, lease_owner FROM runs
         WHERE id = claimed_run
           AND status = 'running'
           AND (lease_expires_at IS NULL OR lease_expires_at < now()
                OR lease_owner = dead_holder)
           FOR UPDATE
    ), lapsed AS (
        INSERT INTO resumptions (run_id, cause, lost_at, resumed_at, fence)
        SELECT id, 'lease_expired', lease_expires_at, now(), fence + 1
          FROM prior
         WHERE lease_expires_at < now()
    )
    UPDATE runs
       SET fence = runs.fence + 1,
           lease_owner = claimer,
           lease_expires_at = now() + make_interval(secs => lease_seconds),
           attempt = runs.attempt + 1,
           updated_at = now(),
           (failed_attempts, failures, failed_step) = (
               SELECT * FROM nightshift_failed_attempt(runs, 'crashed_worker',
                                                       prior.lease_owner IS NOT NULL,
                                                       prior.lease_expires_at, lease_seconds,
                                                       NULL, true))
      FROM prior
     WHERE runs.id = prior.id
    RETURNING jsonb_build_object(
        'fence', runs.fence, 'taken_from', prior.lease_owner,
        'lapsed_seconds', extract(epoch FROM now() - prior.lease_expires_at))
      INTO took;
    IF took IS NOT NULL THEN
        WITH closing AS (
            UPDATE resumptions SET resumed_at = now(), fence = runs.fence
              FROM runs
             WHERE resumptions.run_id = claimed_run AND resumptions.resumed_at IS NULL
               AND runs.id = claimed_run AND runs.lease_owner = claimer
               AND runs.lease_expires_at > now()
            RETURNING resumptions.cause,
                      extract(epoch FROM resumptions.resumed_at - resumptions.lost_at) AS seconds
        )
        SELECT jsonb_build_object('resumed_cause', cause, 'resumed_seconds', seconds)
          INTO closed FROM closing LIMIT 1;
        took := took || coalesce(closed, '{}');
    END IF;
    SELECT to_jsonb(loaded) INTO run FROM (
        SELECT agent, input, step, max_steps, state, batch_id, failed_step, failed_attempts,
               failures, agent_version, running_version, allowed_version, lease_owner,
               trace_context,
               (SELECT b.id FROM batches b
                 WHERE b.synthesis_run_id = runs.id LIMIT 1) AS synthesis_of
          FROM runs
         WHERE id = claimed_run
    ) loaded;
    IF took IS NULL THEN
        RETURN;
    END IF;
    limits := nightshift_limits(claimed_run, night_capped, night_timezone, night_warning,
                                night_stopped);
    SELECT coalesce(jsonb_agg(jsonb_build_object('id', id, 'key', key, 'step', step,
                                                 'step_name', step_name, 'payload', payload)
                              ORDER BY id), '[]')
      INTO entries
      FROM journal
     WHERE run_id = claimed_run AND id > after_entry;
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
