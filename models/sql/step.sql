-- The statements every step runs, by name: the claim and what it loads, the journal writes,
-- the checkpoint and the lease renewal (pipeline/engine/step_sql.py sends them through
-- pipeline/statements.py's `pipelined`: each transaction's statements sent together and
-- answered at its commit, one round trip). A step's other writes are in runs.sql, actions.sql
-- and batches.sql. docs/internals.md follows one step through them.
--
-- Every write here carries the fence: it changes a run's row only `WHERE id = %(run_id)s AND
-- fence = %(fence)s`, and whatever else it writes reads that UPDATE's RETURNING, so a step
-- whose fence is gone writes nothing at all, even when its transaction commits.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: claim
-- Take the run if it is runnable and nobody holds a live lease, or its holder is `dead` (a
-- process this worker knows is gone; NULL: none). No row: a duplicate delivery, or another
-- worker holds it. Taking it from a holder is a failed attempt of its step, recorded in the
-- same UPDATE (schema.sql's nightshift_failed_attempt, reading the row as it was: what counts
-- is in pipeline/runs/failed_attempts.py); a lapsed lease also records when the run stopped
-- moving (`resumptions`), unless the tick found it first (then the lease was already given
-- up). FOR UPDATE returns the row as it is once its lock is ours, so a tick that committed
-- meanwhile is seen.
WITH prior AS (
    SELECT id, fence, lease_expires_at, lease_owner FROM runs
     WHERE id = %(run_id)s
       AND status = 'running'
       AND (lease_expires_at IS NULL OR lease_expires_at < now() OR lease_owner = %(dead)s)
       FOR UPDATE
), lapsed AS (
    INSERT INTO resumptions (run_id, cause, lost_at, resumed_at, fence)
    SELECT id, 'lease_expired', lease_expires_at, now(), fence + 1
      FROM prior
     WHERE lease_expires_at < now()
)
UPDATE runs
   SET fence = runs.fence + 1,
       lease_owner = %(owner)s,
       lease_expires_at = now() + make_interval(secs => %(lease)s),
       attempt = runs.attempt + 1,
       updated_at = now(),
       (failed_attempts, failures, failed_step) = (
           SELECT * FROM nightshift_failed_attempt(runs, 'crashed_worker',
                                                   prior.lease_owner IS NOT NULL,
                                                   prior.lease_expires_at, %(lease)s,
                                                   NULL, true))
  FROM prior
 WHERE runs.id = prior.id
RETURNING runs.fence,
          prior.lease_owner AS taken_from,
          extract(epoch FROM now() - prior.lease_expires_at) AS lapsed_seconds
;

-- name: close_resumption
-- After the claim, in a statement of its own (it sees a row the tick committed while the claim
-- waited for the run's lock): the claim that picks up a run the tick resumed closes the row
-- the tick opened. Only the holder of a live lease closes it.
UPDATE resumptions SET resumed_at = now(), fence = runs.fence
  FROM runs
 WHERE resumptions.run_id = %(run_id)s AND resumptions.resumed_at IS NULL
   AND runs.id = %(run_id)s AND runs.lease_owner = %(owner)s AND runs.lease_expires_at > now()
RETURNING resumptions.cause,
          extract(epoch FROM resumptions.resumed_at - resumptions.lost_at) AS seconds
;

-- name: load_run
-- The run as a step needs it; after a claim that failed, who holds it. `synthesis_of`: the
-- batch whose synthesis the fan-out started as this run (tools' ToolContext.batch_id).
SELECT agent, input, step, max_steps, state, batch_id, failed_step, failed_attempts, failures,
       agent_version, running_version, allowed_version, lease_owner,
       (SELECT b.id FROM batches b WHERE b.synthesis_run_id = runs.id LIMIT 1) AS synthesis_of
  FROM runs
 WHERE id = %(run_id)s
;

-- name: limits
-- What the stop checks read before a model or tool call: cancellation, the deadline, the run's
-- spend, its batch's (summed only when the batch has a cap) and its night's (summed only when
-- `night_capped`: a nightly cap is set; a night runs noon to noon in `night_timezone`), and,
-- under a nightly cap, whether the run is the synthesis of a batch the night stopped
-- (`night_stopped`), found by its key's batch id (`<batch>:synthesis`).
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
       %(night_capped)s AND r.idempotency_key LIKE '%%:synthesis' AND EXISTS (
           SELECT 1 FROM batches s
            WHERE s.id = left(r.idempotency_key, -length(':synthesis'))
              AND s.synthesis_run_id = r.id AND s.stop_reason = %(night_stopped)s
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
                        WHERE kind = %(night_warning)s AND subject = 'night:' || w.night) AS warned
          FROM (SELECT CAST((r.created_at AT TIME ZONE %(night_timezone)s)
                            - interval '12 hours' AS date) AS night) w
          LEFT JOIN runs n
            ON n.created_at >= (w.night + time '12:00') AT TIME ZONE %(night_timezone)s
           AND n.created_at < (w.night + 1 + time '12:00') AT TIME ZONE %(night_timezone)s
         WHERE %(night_capped)s
         GROUP BY w.night
  ) night ON true
 WHERE r.id = %(run_id)s
;

-- name: journal_since
-- The run's journal entries after the last one this process has read.
SELECT id, key, step, step_name, payload
  FROM journal
 WHERE run_id = %(run_id)s AND id > %(last_id)s
 ORDER BY id
;

-- name: journal_fenced
-- One journal entry, if the fence is current (no row: the lease is lost, nothing written).
WITH fenced AS (
    UPDATE runs SET updated_at = now()
     WHERE id = %(run_id)s AND fence = %(fence)s
    RETURNING id
)
INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
SELECT id, %(key)s, %(step)s, %(step_name)s, %(payload)s, false FROM fenced
RETURNING id
;

-- name: journal_append
-- One journal entry, in the caller's fenced transaction (after fence_guard, runs.sql): a timer's
-- wake time, a `once` result, a reply cut off at max_tokens, a note, a result kept as an
-- artifact.
INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
VALUES (%(run_id)s, %(key)s, %(step)s, %(step_name)s, %(payload)s, false)
;

-- name: checkpoint
-- The step's end, in one statement: step + 1, its counters, the lease given up, the agent
-- state the step changed (`state`, NULL: unchanged; it replaces every entry of runs.state but
-- the runtime's `artifacts`), and its deferred journal entries (its last tool result), written
-- only if the UPDATE found the fence current. Returns the new step and the hand-off's time (the updated_at it wrote, as epoch
-- seconds: the next step's message carries it); no row: the lease is lost, nothing written.
WITH checkpointed AS (
    UPDATE runs
       SET step = step + 1,
           tool_calls = tool_calls + %(tool_calls)s,
           input_tokens = input_tokens + %(input_tokens)s,
           output_tokens = output_tokens + %(output_tokens)s,
           cache_creation_input_tokens = cache_creation_input_tokens
                                         + %(cache_creation_input_tokens)s,
           cache_read_input_tokens = cache_read_input_tokens + %(cache_read_input_tokens)s,
           cost_usd = cost_usd + %(cost_usd)s,
           state = coalesce(CAST(%(state)s AS jsonb)
                            || CASE WHEN state -> 'artifacts' IS NULL THEN '{}'::jsonb
                                    ELSE jsonb_build_object('artifacts', state -> 'artifacts')
                               END,
                            state),
           lease_owner = NULL,
           lease_expires_at = NULL,
           updated_at = now()
     WHERE id = %(run_id)s AND fence = %(fence)s
    RETURNING id, step
), entries AS (
    INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
    SELECT checkpointed.id, e.key, e.step, e.step_name, e.payload, false
      FROM checkpointed,
           unnest(CAST(%(keys)s AS text[]), CAST(%(steps)s AS integer[]),
                  CAST(%(step_names)s AS text[]), CAST(%(payloads)s AS jsonb[]))
               AS e(key, step, step_name, payload)
)
SELECT step, CAST(extract(epoch FROM now()) AS float8) AS handed_off FROM checkpointed
;

-- name: renew_leases
-- Every lease a process holds, in one statement (unnest: one row per lease). A row another
-- transaction has locked is skipped, not waited for: during an action's send the run's row
-- stays locked (engine/actions.py), and waiting for it would hold up the renewal of every other
-- lease in the process. `ours` (read without locking) tells such a busy lease, still this
-- holder's, from one that is gone. A renewal never shortens a lease: one extended to cover a
-- send keeps its end.
WITH held AS (
    SELECT * FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(fences)s AS bigint[]),
                         CAST(%(owners)s AS text[]), CAST(%(leases)s AS float8[]))
               AS held(id, fence, owner, lease)
), ours AS (
    SELECT runs.id, runs.fence FROM runs JOIN held
        ON runs.id = held.id AND runs.fence = held.fence AND runs.lease_owner = held.owner
     WHERE runs.status = 'running'
), free AS MATERIALIZED (
    SELECT runs.id, held.lease FROM runs JOIN held
        ON runs.id = held.id AND runs.fence = held.fence AND runs.lease_owner = held.owner
     WHERE runs.status = 'running'
       FOR NO KEY UPDATE OF runs SKIP LOCKED
), renewed AS (
    UPDATE runs SET lease_expires_at = GREATEST(runs.lease_expires_at,
                                                now() + make_interval(secs => free.lease))
      FROM free
     WHERE runs.id = free.id
    RETURNING runs.id, runs.fence
)
SELECT id, fence, true AS renewed FROM renewed
UNION ALL
SELECT id, fence, false FROM ours
 WHERE NOT EXISTS (SELECT 1 FROM renewed WHERE renewed.id = ours.id)
;
