-- Model provider outages (models.ModelOutage, pipeline/runs/outages.py): opened by a run that
-- gave up on the model, ended by the probe's reply, forgotten when nobody waits on them.
-- pipeline/statements.py runs them in the caller's transaction.
-- Parameters are psycopg's (%(name)s, so a literal percent sign is %%); each statement ends
-- with a semicolon on its own.

-- name: outage_gave_up
-- Opened by a run that gave up on the model, or pushed back by the probe's failure. Another
-- run's failure (still in flight when the outage opened) never brings the probe forward, but
-- its reply's retry-after (`after`) can push it back. A reopened outage (recovered, then
-- failing again) keeps its start and its backoff: the first probe `first` seconds after the
-- start, doubling up to `cap`, jittered.
INSERT INTO model_outages AS o (model, since, last_error, probe_at, probes)
VALUES (%(model)s, now(), %(error)s,
        now() + make_interval(secs => greatest(%(after)s, %(first)s * (0.5 + random() / 2))), 0)
ON CONFLICT (model) DO UPDATE SET
    last_error = excluded.last_error,
    recovered_at = NULL,
    probes = o.probes + CASE WHEN o.probe_run_id = %(run_id)s THEN 1 ELSE 0 END,
    probe_at = CASE
        WHEN o.probe_run_id = %(run_id)s OR o.recovered_at IS NOT NULL
        THEN now() + make_interval(secs => greatest(
            %(after)s, least(%(cap)s, %(first)s * power(2, o.probes + 1)) * (0.5 + random() / 2)))
        ELSE greatest(o.probe_at, now() + make_interval(secs => %(after)s))
    END,
    probe_started_at = CASE WHEN o.probe_run_id = %(run_id)s THEN NULL
                            ELSE o.probe_started_at END,
    probe_until = CASE WHEN o.probe_run_id = %(run_id)s THEN NULL ELSE o.probe_until END,
    probe_run_id = CASE WHEN o.probe_run_id = %(run_id)s THEN NULL ELSE o.probe_run_id END
RETURNING o.model, o.since, o.probe_run_id, o.recovered_at, o.last_error
;

-- name: outages_recovered
-- The provider answers again once the probe's reply (or a cut-off one) is journaled.
UPDATE model_outages o
   SET recovered_at = now(), probe_run_id = NULL, probe_until = NULL
 WHERE o.recovered_at IS NULL AND o.probe_run_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM journal j
                WHERE j.run_id = o.probe_run_id
                  AND j.created_at >= o.probe_started_at
                  AND (j.key LIKE 'model:%%' OR j.key LIKE 'cut:%%'))
;

-- name: outage_probe_sent
-- The run woken as the outage's one probe, and how long it has before another may be sent.
UPDATE model_outages
   SET probe_run_id = %(run_id)s, probe_started_at = now(),
       probe_until = now() + make_interval(secs => %(seconds)s)
 WHERE model = %(model)s
;

-- name: forget_outage
-- An outage with no run waiting on it is over.
DELETE FROM model_outages WHERE model = %(model)s
;

-- name: forget_recovered_outages
-- A recovered outage is forgotten once no run waits on it any more (`prefix`: a model wait's,
-- pipeline/keys.py MODEL_WAIT_PREFIX).
DELETE FROM model_outages o
 WHERE o.recovered_at IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM runs
                    WHERE status = 'waiting' AND waiting_on = %(prefix)s || o.model)
;
