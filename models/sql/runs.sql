-- A run's changes outside the statements every step runs (step.sql): its creation, the fence's
-- guard, the lease given up or set, a park, a finish, the time bound's give-up and what a step
-- records on the way. pipeline/statements.py runs them in the caller's transaction.
--
-- A write a step makes runs after `fence_guard` in the same transaction (leases.fenced), or
-- carries the fence itself; the statements below name the fence where they can, so that each
-- says by itself which attempt may write it.
-- Parameters are psycopg's (%(name)s); each statement ends with a semicolon on its own.

-- name: create_runs
-- Every run is created by this one statement, however many at once (pipeline/runs/start.py):
-- a night's ten thousand children are one INSERT of arrays, one a column (a row of parameters
-- each cost seconds), whose rows share their agent, batch and versions. A key that already
-- names a run inserts nothing (RETURNING says which were created). The deadline is a time
-- (`deadline_at`), or seconds from PostgreSQL's now() (`deadline_in`). A batch's child has no
-- outcome to publish in the result backend (`nothing_to_publish`, pipeline/runs/
-- published_outcomes.py): no Celery client holds its id, and a night of 100,000 children would
-- keep 55 MB there for a day and cost each child a second UPDATE. `trace_contexts`: one JSON
-- array, each run's trace context (pipeline/tracing.py run_contexts), or NULL for none.
INSERT INTO runs (id, input, idempotency_key, agent, status, parent_id, batch_id, deadline,
                  notify_url, max_steps, step, tool_calls, input_tokens, output_tokens,
                  state, fence, attempt, cancel_requested, code_version, prompt_version,
                  agent_version, running_version, outcome_published, trace_context)
SELECT new.id, given.input, new.key, %(agent)s, 'running', CAST(%(parent_id)s AS uuid),
       CAST(%(batch_id)s AS text),
       coalesce(CAST(%(deadline_at)s AS timestamptz),
                now() + make_interval(secs => CAST(%(deadline_in)s AS float8))),
       CAST(%(notify_url)s AS text), %(max_steps)s, 0, 0, 0, 0, '{}', 0, 0, false,
       %(code_version)s, %(prompt_version)s, %(agent_version)s, %(agent_version)s,
       CAST(%(nothing_to_publish)s AS boolean),
       CAST(%(trace_contexts)s AS jsonb) -> CAST(new.n - 1 AS int)
  FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(keys)s AS text[]))
       WITH ORDINALITY AS new(id, key, n)
  -- The inputs are one JSON array: a text[] of them had the driver escape every quote in
  -- Python (1.6 s of CPU for a 100,000-child synthesis's input)
  JOIN jsonb_array_elements(CAST(%(inputs)s AS jsonb)) WITH ORDINALITY AS given(input, n)
    ON given.n = new.n
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id
;

-- name: fence_guard
-- The first statement of every fenced transaction: locks the run's row and checks the fence
-- (no row: the lease is lost, and the transaction rolls back).
UPDATE runs SET updated_at = now() WHERE id = %(run_id)s AND fence = %(fence)s
;

-- name: release_lease
-- The step gives the run up untouched, for another worker (an agent this worker does not
-- know, a quarantine that stayed busy): its message is sent again.
UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
 WHERE id = %(run_id)s AND fence = %(fence)s
;

-- name: release_to_replay
-- The attempt ends well without moving the run to its next step (what it would wait for was
-- decided already): the lease given up, and the failures in a row are over (a step that waits
-- on several approvals runs as several attempts of one step, and a lapse before each must not
-- add up to a poison run's count; the entries stay, for `show`).
UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL, failed_attempts = 0,
                updated_at = now()
 WHERE id = %(run_id)s AND fence = %(fence)s
;

-- name: park
-- The run waits (`waiting` or `needs_attention`, on `waiting_on`, until `wake_at` if set),
-- holding no lease; its failures in a row are over, as in release_to_replay. A cancel that
-- arrived during the step wins over waiting. No row: the run is no longer running.
UPDATE runs
   SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE %(status)s END,
       stop_reason = CASE WHEN cancel_requested THEN 'cancelled' ELSE %(reason)s END,
       error = CASE WHEN cancel_requested THEN NULL ELSE %(error)s END,
       finished_at = CASE WHEN cancel_requested THEN now() END,
       waiting_on = %(waiting_on)s,
       wake_at = CASE WHEN cancel_requested THEN NULL
                      ELSE CAST(%(wake_at)s AS timestamptz) END,
       lease_owner = NULL,
       lease_expires_at = NULL,
       failed_attempts = 0,
       updated_at = now()
 WHERE id = %(run_id)s AND fence = %(fence)s AND status = 'running'
RETURNING status
;

-- name: finish
-- The run's end (or a status it may still leave: needs_attention), where it may still make
-- that change (`sources`: models/status.py RUN_TRANSITIONS), with the step's counters added
-- and the lease given up. No row: the status changed under the step.
UPDATE runs
   SET status = %(status)s,
       stop_reason = %(reason)s,
       result = %(result)s,
       error = %(error)s,
       step = step + %(steps_done)s,
       finished_at = CASE WHEN %(terminal)s THEN now() END,
       input_tokens = input_tokens + %(input_tokens)s,
       output_tokens = output_tokens + %(output_tokens)s,
       cache_creation_input_tokens = cache_creation_input_tokens
                                     + %(cache_creation_input_tokens)s,
       cache_read_input_tokens = cache_read_input_tokens + %(cache_read_input_tokens)s,
       cost_usd = cost_usd + %(cost_usd)s,
       lease_owner = NULL,
       lease_expires_at = NULL,
       updated_at = now()
 WHERE id = %(run_id)s AND fence = %(fence)s AND status = ANY(CAST(%(sources)s AS text[]))
;

-- name: enter_quarantine
-- A suspect step runs alone among its process's suspects: its fence is recorded, so that a
-- loss of this attempt counts as the run's own (nightshift_failed_attempt). Fenced by itself,
-- the first statement of its transaction.
UPDATE runs SET quarantine_fence = fence
 WHERE id = %(run_id)s AND fence = %(fence)s
RETURNING id
;

-- name: give_up_step
-- The run is taken from the step `owner` runs (pipeline/engine/time_limit.py): it overran its
-- time bound (`kind` time_limit), or failed on a database error (database_error, with the
-- `error` and whether it `counted`). The fence moves on (the abandoned work can write nothing
-- more), the lease is cleared and the step is sent again: a failed attempt of the step.
UPDATE runs
   SET fence = fence + 1,
       lease_owner = NULL,
       lease_expires_at = NULL,
       updated_at = now(),
       (failed_attempts, failures, failed_step) = (
           SELECT * FROM nightshift_failed_attempt(runs, %(kind)s, true, NULL, NULL,
                                                   %(error)s, %(counted)s))
 WHERE id = %(run_id)s AND lease_owner = %(owner)s AND status = 'running'
RETURNING agent, step, batch_id
;

-- name: lock_timeout
-- How long this transaction waits for a lock before it fails (a send in flight holds the run
-- row until its reply).
SELECT set_config('lock_timeout', %(milliseconds)s, true)
;

-- name: idle_in_transaction_timeout
-- How long this transaction may sit between two statements before PostgreSQL ends its session
-- (the connection's own setting is one lease: a frozen worker must not keep rows locked).
SELECT set_config('idle_in_transaction_session_timeout', %(milliseconds)s, true)
;

-- name: set_lease
-- The lease ends `seconds` from now: a send's window before it (committed, so that a takeover
-- waits for the send even if this session ends), one lease again after it.
UPDATE runs SET lease_expires_at = now() + make_interval(secs => %(seconds)s)
 WHERE id = %(run_id)s AND fence = %(fence)s
;

-- name: hold_run_during_send
-- The run's row stays locked for the send (by the fenced transaction's guard), and PostgreSQL
-- ends this session should it stay idle in it past the send's window: a frozen process then
-- keeps no row locked past its lease. For this transaction only.
SELECT set_config('idle_in_transaction_session_timeout', %(milliseconds)s, true)
;

-- name: record_running_version
-- The agent version the run's step runs under, on its row; a change of version (`previous`
-- not NULL) also goes to the run's feed, every version in between.
WITH recorded AS (
    UPDATE runs SET running_version = %(version)s, updated_at = now()
     WHERE id = %(run_id)s AND fence = %(fence)s
    RETURNING id
)
INSERT INTO run_events (run_id, kind, data)
SELECT id, 'version', jsonb_build_object('from', CAST(%(previous)s AS text),
                                         'to', CAST(%(version)s AS text))
  FROM recorded
 WHERE CAST(%(previous)s AS text) IS NOT NULL
;

-- name: next_artifact_id
-- An artifact's id, taken before the fenced transaction that stores it (whose fence check must
-- be its first statement; an id a crash leaves unused is only a gap).
SELECT nextval(pg_get_serial_sequence('artifacts', 'id')) AS id
;

-- name: store_artifact
-- An artifact and its name in the run's state.artifacts, merged in without rewriting the rest
-- of the state: in the fenced transaction of its tool call's journal entry.
WITH stored AS (
    INSERT INTO artifacts (id, run_id, name, sha256, size, media_type, content)
    VALUES (%(id)s, %(run_id)s, %(name)s, %(sha256)s, %(size)s, %(media_type)s, %(content)s)
    RETURNING run_id
)
UPDATE runs
   SET state = jsonb_set(state, '{artifacts}',
                         coalesce(state->'artifacts', '{}'::jsonb) || %(ref)s)
  FROM stored
 WHERE runs.id = stored.run_id
;

-- name: take_orphans
-- The tick's takeovers (pipeline/runs/tick.py): runs that are running and either hold an
-- expired lease or none, with nothing happening for a while (a step hands off by clearing its
-- lease; a message normally claims within the `grace`). A run with no lease is taken only if
-- it was handed off a grace before the oldest step message still queued (`queued_since`, that
-- message's own hand-off, epoch seconds: pipeline/app.py): the queue is first in, first out,
-- so a message sent before that one was taken already; one sent after may still wait behind a
-- night's backlog, and sending it again would only add a duplicate to the backlog. "Before" by
-- a grace: updated_at is its transaction's start, and the message goes after the commit, so
-- under load two hand-offs reach the queue in the other order. Each one opens a `resumptions`
-- row (at most one open per run), recording when the run stopped moving; the claim that picks
-- it up closes it (schema.sql nightshift_claim). An expired lease is a failed attempt of the
-- run's step (nightshift_failed_attempt); a run that only lost its message keeps its count.
WITH picked AS (
    SELECT id, lease_expires_at, updated_at FROM runs
     WHERE status = 'running'
       AND (lease_expires_at < now()
            OR (lease_expires_at IS NULL
                AND updated_at < now() - make_interval(secs => %(grace)s)
                AND updated_at < to_timestamp(%(queued_since)s)
                                 - make_interval(secs => %(grace)s)))
     ORDER BY updated_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
), lost AS (
    INSERT INTO resumptions (run_id, cause, lost_at)
    SELECT id,
           CASE WHEN lease_expires_at IS NULL THEN 'no_message' ELSE 'lease_expired' END,
           coalesce(lease_expires_at, updated_at)
      FROM picked
    ON CONFLICT (run_id) WHERE resumed_at IS NULL DO NOTHING
)
UPDATE runs
   SET lease_expires_at = NULL,
       lease_owner = NULL,
       updated_at = now(),
       (failed_attempts, failures, failed_step) = (
           SELECT * FROM nightshift_failed_attempt(runs, 'crashed_worker',
                                                   picked.lease_expires_at IS NOT NULL,
                                                   picked.lease_expires_at, %(lease)s,
                                                   NULL, true))
  FROM picked
 WHERE runs.id = picked.id
RETURNING runs.id, runs.agent, runs.step, runs.batch_id,
          picked.lease_expires_at IS NOT NULL AS lapsed
;

-- name: wake
-- The one way a parked run becomes runnable again (pipeline/runs/waits.py): a due timer, an
-- approval, a person's resolution, a settled action, a model that answers again. Only the runs
-- of `run_ids` still parked change; each one's step is sent after the commit. A parked run's
-- reason (a key conflict) no longer holds once it runs.
UPDATE runs
   SET status = 'running',
       waiting_on = NULL,
       wake_at = NULL,
       lease_owner = NULL,
       lease_expires_at = NULL,
       stop_reason = NULL,
       error = NULL,
       updated_at = now()
 WHERE id = ANY(CAST(%(run_ids)s AS uuid[])) AND status IN ('waiting', 'needs_attention')
RETURNING id, agent, step, batch_id
;

-- name: allow_version
-- A person lets the run go on under the agent version it waits on (pipeline/runs/versions.py,
-- in the transaction that wakes it).
UPDATE runs SET allowed_version = %(version)s, updated_at = now() WHERE id = %(run_id)s
;

-- name: request_cancel
-- A person asks the run to stop (pipeline/runs/cancel.py, the row locked before): a running
-- run stops at its next check; a parked one holds no worker that would notice, so it ends
-- here. Asked twice, the first request stands.
UPDATE runs
   SET cancel_requested = true,
       cancel_requested_by = %(by)s,
       cancel_requested_at = now(),
       status = CASE WHEN status IN ('waiting', 'needs_attention') THEN 'cancelled'
                     ELSE status END,
       stop_reason = CASE WHEN status IN ('waiting', 'needs_attention') THEN %(reason)s
                          ELSE stop_reason END,
       finished_at = CASE WHEN status IN ('waiting', 'needs_attention') THEN now()
                          ELSE finished_at END,
       wake_at = CASE WHEN status IN ('waiting', 'needs_attention') THEN NULL ELSE wake_at END,
       updated_at = now()
 WHERE id = %(run_id)s AND NOT cancel_requested
;

-- name: end_parked
-- Parked runs that nothing else would end fail here (pipeline/runs/expiry.py: a deadline that
-- passed while they waited, a wait past the maximum, a model outage past its horizon), each
-- with its own `errors` entry (arrays, one entry a run). Only those still parked change.
UPDATE runs
   SET status = 'failed', stop_reason = %(reason)s, error = ended.error, finished_at = now(),
       wake_at = NULL, updated_at = now()
  FROM unnest(CAST(%(run_ids)s AS uuid[]), CAST(%(errors)s AS text[])) AS ended(id, error)
 WHERE runs.id = ended.id AND runs.status IN ('waiting', 'needs_attention')
RETURNING runs.id, runs.batch_id
;

-- name: outcomes_published
-- The finished runs whose outcome the tick stored in Celery's result backend
-- (pipeline/runs/published_outcomes.py): not stored again.
UPDATE runs SET outcome_published = true, updated_at = now()
 WHERE id = ANY(CAST(%(run_ids)s AS uuid[]))
;

-- name: fork_from_step
-- A fork (pipeline/runs/fork.py) takes its origin's journal before `step`, in the transaction
-- that created it and before its first step is sent: its steps before `step` are replayed from
-- these entries as a takeover replays a run's own (the conversation rebuilt, no model call or
-- tool run again; the agent state those steps left comes from these entries too,
-- engine/state_replay.py), and its first step is `step`. Only while the fork is untouched
-- (never claimed, at step 0). The entries are copied in the origin's order. Returns how many.
WITH fork AS (
    UPDATE runs SET step = %(step)s, updated_at = now()
     WHERE id = %(fork_id)s AND fence = 0 AND step = 0
    RETURNING id
), copied AS (
    INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
    SELECT fork.id, j.key, j.step, j.step_name, j.payload, j.compacted
      FROM fork, journal j
     WHERE j.run_id = %(origin_id)s AND j.step < %(step)s
     ORDER BY j.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM fork) AS forked, (SELECT count(*) FROM copied) AS entries
;
