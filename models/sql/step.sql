-- The statements every step runs, by name: the claim and what it loads, the journal writes,
-- the checkpoint and the lease renewal (pipeline/engine/step_sql.py sends them through
-- pipeline/statements.py's `pipelined`: each transaction one statement, one round trip). A
-- step's other writes are in runs.sql, actions.sql and batches.sql. docs/internals.md follows
-- one step through them.
--
-- Every write here carries the fence: it changes a run's row only `WHERE id = %(run_id)s AND
-- fence = %(fence)s`, and whatever else it writes reads that UPDATE's RETURNING, so a step
-- whose fence is gone writes nothing at all, even when its transaction commits.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: claim
-- The claim and everything the step loads, one statement (schema.sql's nightshift_claim):
-- `took` (NULL: not claimed; `run` then says who holds it), `run`, `limits` and the journal
-- `entries` after `last_id`.
SELECT took, run, limits, entries
  FROM nightshift_claim(%(run_id)s, %(owner)s, %(lease)s, %(dead)s, %(last_id)s,
                        %(night_capped)s, %(night_timezone)s, %(night_warning)s,
                        %(night_stopped)s)
;

-- name: limits
-- What the stop checks read before a model or tool call (schema.sql's nightshift_limits).
SELECT nightshift_limits(%(run_id)s, %(night_capped)s, %(night_timezone)s, %(night_warning)s,
                         %(night_stopped)s) AS limits
;

-- name: journal_reply
-- The model's reply journaled if the fence is current, and the limits read with it for the
-- check before the first tool call: one statement. No row: the lease is lost, nothing written.
WITH fenced AS (
    UPDATE runs SET updated_at = now()
     WHERE id = %(run_id)s AND fence = %(fence)s
    RETURNING id
), entry AS (
    INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
    SELECT id, %(key)s, %(step)s, %(step_name)s, %(payload)s, false FROM fenced
    RETURNING run_id
)
SELECT nightshift_limits(entry.run_id, %(night_capped)s, %(night_timezone)s,
                         %(night_warning)s, %(night_stopped)s) AS limits
  FROM entry
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
-- the runtime's `artifacts`), and its deferred journal entries (its last tool result; one JSON
-- array of {key, step, step_name, payload}, in order: one parameter for the driver to send,
-- where four arrays cost four), written only if the UPDATE found the fence current. Returns
-- the new step and the hand-off's time (the updated_at it wrote, as epoch seconds: the next
-- step's message carries it); no row: the lease is lost, nothing written.
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
    SELECT checkpointed.id, e ->> 'key', CAST(e ->> 'step' AS integer), e ->> 'step_name',
           e -> 'payload', false
      FROM checkpointed, jsonb_array_elements(CAST(%(entries)s AS jsonb)) AS e
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
