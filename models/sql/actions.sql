-- The action protocol's rows (docs/internals.md, "Tool calls and the action states"): a key
-- saved before the first send, each change of its state by the run that owns it, and the
-- audit trail of what people and the runtime decided. pipeline/statements.py runs them in the
-- caller's transaction: a step's, after the fence's guard (runs.sql fence_guard).
-- A state moves only from the states models/status.py ACTION_TRANSITIONS allows (`sources`),
-- and only for its own run: zero rows is a conflict. A webhook (kind `webhook`: a completion
-- webhook or an alert's, sent by pipeline/delivery/ once what it announces committed) is the
-- same row through the same statements; no step holds it, so its sender's claim is the row's
-- own `fence` (webhooks.sql claim_webhook), which the state changes check when given (a tool's
-- action passes NULL: its run's fence guards the transaction).
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: record_action
-- The key, saved before anything is sent. No row: the key is taken already (take_over_action
-- may take it over). An alert's webhook too (pipeline/runs/notifications.py owe_alert_txn);
-- the completion webhooks are recorded by the status triggers (schema.sql).
INSERT INTO actions (id, idempotency_key, kind, run_id, batch_id, tool_use_id, tool, service,
                     args, args_hash, state, attempts, requires_approval, approvers)
VALUES (%(id)s, %(key)s, %(kind)s, %(run_id)s, %(batch_id)s, %(tool_use_id)s, %(tool)s,
        %(service)s, %(args)s, %(args_hash)s, %(state)s, 0, %(requires_approval)s,
        %(approvers)s)
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
-- error, a resolution or arguments given are kept (a webhook's first attempt fixes the bytes
-- every attempt sends); NULL keeps what the row has. `fence`: a webhook's sender's claim (NULL
-- for a tool's action); a webhook about no run has run_id NULL.
UPDATE actions
   SET state = %(state)s,
       attempts = attempts + CASE WHEN %(attempted)s THEN 1 ELSE 0 END,
       first_attempt_at = CASE WHEN %(attempted)s THEN coalesce(first_attempt_at, now())
                               ELSE first_attempt_at END,
       last_attempt_at = CASE WHEN %(attempted)s THEN now() ELSE last_attempt_at END,
       args = coalesce(CAST(%(args)s AS jsonb), args),
       error = coalesce(%(error)s, error),
       resolution = coalesce(%(resolution)s, resolution),
       updated_at = now()
 WHERE idempotency_key = %(key)s AND run_id IS NOT DISTINCT FROM CAST(%(run_id)s AS uuid)
   AND (CAST(%(fence)s AS bigint) IS NULL OR fence = CAST(%(fence)s AS bigint))
   AND state = ANY(CAST(%(sources)s AS text[]))
;

-- name: confirm_action
-- This run's action happened once: its reply saved with the state. A resolution given
-- (resent, lookup) says how an unknown outcome was settled. `fence` as in action_state; a
-- webhook's claim ends with it.
UPDATE actions
   SET state = 'confirmed',
       result = %(result)s,
       resolution = coalesce(%(resolution)s, resolution),
       lease_expires_at = NULL,
       updated_at = now()
 WHERE idempotency_key = %(key)s AND run_id IS NOT DISTINCT FROM CAST(%(run_id)s AS uuid)
   AND (CAST(%(fence)s AS bigint) IS NULL OR fence = CAST(%(fence)s AS bigint))
   AND state = ANY(CAST(%(sources)s AS text[]))
;

-- name: settle_actions_of_ended
-- In the transaction that ends runs (pipeline/runs/obligations.py): the unfinished actions of
-- those of `run_ids` that have ended. A pending approval is withdrawn; an action that may have
-- gone out (attempted with no saved reply, or intended again after an unknown outcome and a
-- resend decided) becomes outcome_unknown, for a person or the next run to settle; the rest is
-- released. Each change goes to the audit trail, by nightshift. Not a webhook: what announces
-- a run's end is owed after it.
WITH settled AS (
    UPDATE actions
       SET state = CASE WHEN state = 'pending_approval' THEN 'withdrawn'
                        WHEN state = 'attempted' OR (state = 'intended' AND attempts > 0)
                            THEN 'outcome_unknown'
                        ELSE 'released' END,
           resolution = %(reason)s,
           updated_at = now()
     WHERE run_id = ANY(CAST(%(run_ids)s AS uuid[])) AND kind = 'tool'
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

-- name: decide_action
-- A person's decision on an action (pipeline/runs/decisions.py), a compare-and-set: only the
-- first decision on an action still in `required` changes it, to `new`. An approval or a
-- rejection needs the person among the approvers (anyone when the tool names none) and a run
-- that may still send it: not ended, not past its deadline (the tick is about to end it). That
-- something happened or did not is a fact a person checked, not an approval (`fact`): no such
-- condition; did_not_happen releases the key of a run that ended (nobody would send it; the
-- next run meaning it may). `seen_run_id`, `seen_args_hash`: what the person was shown, if
-- said; the decision applies only if the action still is that. No row: decided already, or
-- refused (decisions.py says why). A webhook is no person's to decide: its sender settles it.
UPDATE actions
   SET state = CASE WHEN %(decision)s = 'did_not_happen'
                         AND EXISTS (SELECT 1 FROM runs
                                      WHERE runs.id = actions.run_id
                                        AND runs.status IN ('succeeded', 'failed', 'cancelled'))
                    THEN 'released' ELSE %(new)s END,
       decision = %(decision)s,
       decided_by = %(by)s,
       decided_at = now(),
       note = %(note)s,
       result = coalesce(CAST(%(result)s AS jsonb), result),
       resolution = coalesce(CAST(%(resolution)s AS text), resolution),
       updated_at = now()
 WHERE idempotency_key = %(key)s AND state = %(required)s AND kind = 'tool'
   AND (%(fact)s
        OR ((jsonb_array_length(approvers) = 0
             OR approvers @> jsonb_build_array(CAST(%(by)s AS text)))
            AND EXISTS (SELECT 1 FROM runs
                         WHERE runs.id = actions.run_id
                           AND runs.status NOT IN ('succeeded', 'failed', 'cancelled')
                           AND (runs.deadline IS NULL OR runs.deadline > now()))))
   AND (CAST(%(seen_run_id)s AS uuid) IS NULL OR run_id = CAST(%(seen_run_id)s AS uuid))
   AND (CAST(%(seen_args_hash)s AS text) IS NULL
        OR args_hash = CAST(%(seen_args_hash)s AS text))
RETURNING run_id, state, args_hash
;

-- name: release_failed_action
-- A person stops the replay of a failed action's stored failure: the key is released, and
-- the next run that means the action does it afresh. No row: no failed action has the key.
UPDATE actions SET state = 'released', resolution = 'retried', updated_at = now()
 WHERE idempotency_key = %(key)s AND state = 'failed' AND kind = 'tool'
RETURNING run_id, error, args_hash
;

-- name: audit_action
-- One entry of an action's audit trail (what a person or the runtime decided), in the
-- transaction that made the change.
INSERT INTO action_audit (action_key, run_id, event, "by", via, note, args_hash)
VALUES (%(key)s, %(run_id)s, %(event)s, %(by)s, %(via)s, %(note)s, %(args_hash)s)
;

-- name: take_over_from_origin
-- A fork (pipeline/runs/fork.py) carries on what the runs it was forked from (`origins`: its
-- origin, that one's, ...) left open: such a run's action whose outcome is unknown moves to the
-- fork as it stands (its arguments as sent, its attempts and when, which the resend's
-- retention window counts from), for the fork to reconcile as its own. An origin has ended (a
-- run is forked once finished), so nothing else would move it but a person, whose decision
-- needs the same state: one of the two wins. No row: the key is none of theirs, or not open.
-- The move goes to the audit trail, under the run it was taken from.
WITH moved AS (
    UPDATE actions
       SET run_id = %(run_id)s, tool_use_id = %(tool_use_id)s, updated_at = now()
      FROM actions AS was
     WHERE actions.id = was.id AND actions.idempotency_key = %(key)s
       AND actions.state = 'outcome_unknown' AND actions.kind = 'tool'
       AND actions.run_id = ANY(CAST(%(origins)s AS uuid[]))
    RETURNING actions.idempotency_key, was.run_id AS origin_id, actions.args_hash
), audited AS (
    INSERT INTO action_audit (action_key, run_id, event, "by", via, note, args_hash)
    SELECT idempotency_key, origin_id, 'forked', %(by)s, %(via)s,
           'now run ' || CAST(%(run_id)s AS text) || '''s to reconcile', args_hash
      FROM moved
)
SELECT idempotency_key FROM moved
;
