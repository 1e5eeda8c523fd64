-- The action protocol's rows (docs/internals.md, "Tool calls and the action states"): a key
-- saved before the first send, each change of its state by the run that owns it, and the
-- audit trail of what people and the runtime decided. pipeline/statements.py runs them in the
-- caller's transaction: a step's, after the fence's guard (runs.sql fence_guard).
-- A state moves only from the states models/status.py ACTION_TRANSITIONS allows (`sources`),
-- and only for its own run: zero rows is a conflict.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: record_action
-- The key, saved before anything is sent. No row: the key is taken already (take_over_action
-- may take it over).
INSERT INTO actions (id, idempotency_key, run_id, tool_use_id, tool, service, args, args_hash,
                     state, attempts, requires_approval, approvers)
VALUES (%(id)s, %(key)s, %(run_id)s, %(tool_use_id)s, %(tool)s, %(service)s, %(args)s,
        %(args_hash)s, %(state)s, 0, %(requires_approval)s, %(approvers)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id
;

-- name: take_over_action
-- A key no run holds (released or withdrawn) taken over by the run that means the action now,
-- afresh: its own arguments, its own approval, nothing attempted. No row: another run holds it,
-- or this run recorded it before.
UPDATE actions
   SET run_id = %(run_id)s,
       tool_use_id = %(tool_use_id)s,
       tool = %(tool)s,
       service = %(service)s,
       args = %(args)s,
       args_hash = %(args_hash)s,
       state = %(state)s,
       requires_approval = %(requires_approval)s,
       approvers = %(approvers)s,
       attempts = 0,
       first_attempt_at = NULL,
       last_attempt_at = NULL,
       result = NULL,
       error = NULL,
       resolution = NULL,
       decision = NULL,
       decided_by = NULL,
       decided_at = NULL,
       note = NULL,
       updated_at = now()
 WHERE idempotency_key = %(key)s AND state IN ('released', 'withdrawn')
RETURNING id
;

-- name: action_state
-- This run's action moves to `state`; `attempted`: a send starts (counted, and when). An
-- error or a resolution given is kept; NULL keeps the one the row has.
UPDATE actions
   SET state = %(state)s,
       attempts = attempts + CASE WHEN %(attempted)s THEN 1 ELSE 0 END,
       first_attempt_at = CASE WHEN %(attempted)s THEN coalesce(first_attempt_at, now())
                               ELSE first_attempt_at END,
       last_attempt_at = CASE WHEN %(attempted)s THEN now() ELSE last_attempt_at END,
       error = coalesce(%(error)s, error),
       resolution = coalesce(%(resolution)s, resolution),
       updated_at = now()
 WHERE idempotency_key = %(key)s AND run_id = %(run_id)s
   AND state = ANY(CAST(%(sources)s AS text[]))
;

-- name: confirm_action
-- This run's action happened once: its reply saved with the state. A resolution given
-- (resent, lookup) says how an unknown outcome was settled.
UPDATE actions
   SET state = 'confirmed',
       result = %(result)s,
       resolution = coalesce(%(resolution)s, resolution),
       updated_at = now()
 WHERE idempotency_key = %(key)s AND run_id = %(run_id)s
   AND state = ANY(CAST(%(sources)s AS text[]))
;

-- name: settle_actions_of_ended
-- In the transaction that ends runs (pipeline/runs/obligations.py): the unfinished actions of
-- those of `run_ids` that have ended. A pending approval is withdrawn; an action that may have
-- gone out (attempted with no saved reply, or intended again after an unknown outcome and a
-- resend decided) becomes outcome_unknown, for a person or the next run to settle; the rest is
-- released. Each change goes to the audit trail, by nightshift.
WITH settled AS (
    UPDATE actions
       SET state = CASE WHEN state = 'pending_approval' THEN 'withdrawn'
                        WHEN state = 'attempted' OR (state = 'intended' AND attempts > 0)
                            THEN 'outcome_unknown'
                        ELSE 'released' END,
           resolution = %(reason)s,
           updated_at = now()
     WHERE run_id = ANY(CAST(%(run_ids)s AS uuid[]))
       AND state IN ('pending_approval', 'intended', 'attempted')
       AND EXISTS (SELECT 1 FROM runs
                    WHERE runs.id = actions.run_id
                      AND runs.status IN ('succeeded', 'failed', 'cancelled'))
    RETURNING idempotency_key, run_id, state, args_hash
), audited AS (
    INSERT INTO action_audit (action_key, run_id, event, "by", via, note, args_hash)
    SELECT idempotency_key, run_id,
           CASE WHEN state = 'withdrawn' THEN 'withdrawn' ELSE 'run_ended' END,
           %(by)s, %(via)s,
           CASE WHEN state = 'withdrawn' THEN NULL ELSE 'now ' || state END,
           args_hash
      FROM settled
)
SELECT idempotency_key, run_id, state FROM settled
;
