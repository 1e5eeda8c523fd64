-- Statements only pipeline.testing runs, each on a database a test owns (one run's own copy of
-- the migrated template): never on a deployment's. Parameters are psycopg's (%(name)s).

-- name: clock_moved_by
-- How far the next move_clock_back moves the clock, for this transaction only.
SELECT set_config('nightshift.clock_moved_by', %(by)s, true);

-- name: move_clock_back
-- A test's clock moving forward (pipeline.testing's AgentRun.advance): every stored time of
-- the database made older by clock_moved_by. Every check of time compares a stored time with
-- now(), in PostgreSQL or in Python (timers, leases, deadlines, key retention, waits), so this
-- is the same as both clocks moving forward, with no clock in the code to move. UPDATE OF a
-- time fires none of the triggers (they are on status, fence and inserts). The one time the
-- engine keeps in JSON moves too: a timer's journaled wake time (`timer:<tool_use_id>`,
-- engine/timers.py), which its replay compares with now(). No parameters.
DO $$
DECLARE
    moved record;
BEGIN
    FOR moved IN
        SELECT c.table_name,
               string_agg(quote_ident(c.column_name) || ' = ' || quote_ident(c.column_name)
                          || ' - current_setting(''nightshift.clock_moved_by'')::interval',
                          ', ') AS sets
          FROM information_schema.columns c
          JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
           AND c.data_type IN ('timestamp with time zone', 'timestamp without time zone')
           AND c.is_generated = 'NEVER'
         GROUP BY c.table_name
    LOOP
        EXECUTE 'UPDATE ' || quote_ident(moved.table_name) || ' SET ' || moved.sets;
    END LOOP;
    UPDATE journal
       SET payload = jsonb_set(payload, '{wake_at}', to_jsonb(
               (payload ->> 'wake_at')::timestamptz
               - current_setting('nightshift.clock_moved_by')::interval))
     WHERE starts_with(key, 'timer:') AND payload ? 'wake_at';
END
$$;

-- name: empty_run_database
-- A run's database as its template left it, for the next run: every table emptied (the
-- template's are empty) and its ids counted from 1 again; the migrations' record stays.
-- No parameters.
DO $$
BEGIN
    EXECUTE (
        SELECT 'TRUNCATE ' || string_agg(quote_ident(tablename), ', ')
               || ' RESTART IDENTITY CASCADE'
          FROM pg_tables
         WHERE schemaname = current_schema() AND tablename <> 'alembic_version'
    );
END
$$;
