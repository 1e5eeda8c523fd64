"""Does a step cost the same however long the run and however big the database?

1. One run of 1,010 steps through a real worker: per-step time around step 10 vs around
   step 1,000 (and a few points between).
2. Per-step time of a short run in an empty database vs with 1,000,000 old journal rows of
   other runs (bulk-inserted with generate_series, then ANALYZE).
3. Where a step's time goes at step 10 vs step 1,000: a copy of the long run at each step is
   driven in this process under cProfile (no Celery), by phase of the engine.
"""

from __future__ import annotations

import pstats
import statistics
import uuid

import cpu_use
import output
import profiling
import records
import scratch

NAME = "flat_cost"
REDIS_DB = 13
TARGET = 1.2
WINDOW = 5  # a point is the median of the steps within WINDOW of it
OLD_ROWS_PER_RUN = 100

_OLD_RUNS = """
WITH old AS (
    INSERT INTO runs (id, agent, status, input, step, max_steps, tool_calls, input_tokens,
                      output_tokens, state, fence, attempt, cancel_requested, code_version,
                      prompt_version, finished_at)
    SELECT gen_random_uuid(), 'bench', 'succeeded', '{"steps": 50}', 50, 5000, 49, 0, 0,
           '{}', 1, 50, false, 'old', 'old', now()
      FROM generate_series(1, :runs)
    RETURNING id
)
INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
SELECT old.id,
       CASE WHEN n % 2 = 0 THEN 'model:' || n / 2 ELSE 'tool:toolu_old_' || n END,
       n / 2,
       CASE WHEN n % 2 = 0 THEN 'ask_model' ELSE 'bench_echo' END,
       jsonb_build_object(
           'content', jsonb_build_array(
               jsonb_build_object('type', 'text', 'text', 'Step ' || n || '. ' || repeat('x', 80)),
               jsonb_build_object('type', 'tool_use', 'id', 'toolu_old_' || n,
                                  'name', 'bench_echo', 'input', jsonb_build_object('n', n))),
           'usage', jsonb_build_object('input_tokens', 100 + n, 'output_tokens', 20)),
       false
  FROM old CROSS JOIN generate_series(0, :per_run - 1) AS n
"""

_CLONE_RUN = """
INSERT INTO runs (id, agent, status, input, step, max_steps, tool_calls, input_tokens,
                  output_tokens, state, fence, attempt, cancel_requested, code_version,
                  prompt_version)
SELECT :new, agent, 'running', input, :step, max_steps, 0, 0, 0, '{}', 0, 0, false,
       code_version, prompt_version
  FROM runs WHERE id = :source
"""

_CLONE_JOURNAL = """
INSERT INTO journal (run_id, key, step, step_name, payload, compacted)
SELECT :new, key, step, step_name, payload, compacted
  FROM journal WHERE run_id = :source AND step < :step ORDER BY id
"""


def run_to_end(steps: int, label: str) -> uuid.UUID:
    done_before, _ = records.run_counts()
    (run_id,), _ = records.create_runs(1, steps, label)
    records.wait_for_runs(done_before + 1, timeout=120 + steps, label=f"run {label}")
    return run_id


def around(intervals: dict[int, float], step: int) -> float:
    values = [v for k, v in intervals.items() if abs(k - step) <= WINDOW]
    return statistics.median(values)


def add_old_rows(total: int) -> None:
    runs = max(1, total // OLD_ROWS_PER_RUN)
    chunks = min(10, runs)
    progress = output.Progress("old journal rows", runs * OLD_ROWS_PER_RUN, every=0)
    done = 0
    for chunk in range(chunks):
        size = runs // chunks + (1 if chunk < runs % chunks else 0)
        records.sql(_OLD_RUNS, runs=size, per_run=OLD_ROWS_PER_RUN)
        done += size * OLD_ROWS_PER_RUN
        progress.update(done)
    records.sql("ANALYZE")


def profile_at(source: uuid.UUID, step: int) -> pstats.Stats:
    """Profile in-process steps of a copy of `source` that starts at `step`."""
    copy = uuid.uuid4()
    records.sql(_CLONE_RUN, new=copy, step=step, source=source)
    records.sql(_CLONE_JOURNAL, new=copy, step=step, source=source)
    return profiling.profile_steps(copy)


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--late", type=int, default=1000, help="the late step (default 1000)")
    parser.add_argument("--short-steps", type=int, default=100, help="steps of the short runs")
    parser.add_argument("--old-rows", type=int, default=1_000_000, help="old journal rows")
    args = parser.parse_args(argv)
    early = 10
    long_steps = args.late + 2 * WINDOW
    if args.late <= early + 2 * WINDOW:
        parser.error(f"--late must be above {early + 2 * WINDOW}")

    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        bench.worker("w1", concurrency=1)
        run_to_end(20, "warmup")
        output.log(f"short run of {args.short_steps} steps, empty database")
        empty = list(records.step_intervals(run_to_end(args.short_steps, "empty")).values())
        output.log(f"long run of {long_steps} steps")
        cpu_before = cpu_use.cpu_seconds(bench.processes)
        long_run = run_to_end(long_steps, "long")
        long_cpu = (cpu_use.cpu_seconds(bench.processes) - cpu_before) / long_steps
        intervals = records.step_intervals(long_run)
        output.log(f"inserting {args.old_rows:,} old journal rows")
        add_old_rows(args.old_rows)
        output.log(f"short run of {args.short_steps} steps, {args.old_rows:,} old rows")
        full = list(records.step_intervals(run_to_end(args.short_steps, "full")).values())
        bench.stop_all()
        output.log("profiling in-process steps of copies of the long run")
        profiles = {step: profile_at(long_run, step) for step in (early, args.late)}

    points = sorted({early, 100, 250, 500, args.late} & set(range(early, args.late + 1)))
    late_ratio = around(intervals, args.late) / around(intervals, early)
    output.print_table(
        f"flat_cost 1: per-step time along one run of {long_steps} steps (median of the "
        f"steps within {WINDOW} of each point, one worker, threads x1)",
        ["step", "per-step time", "vs step 10"],
        [
            [
                p,
                output.ms(around(intervals, p)),
                output.times(around(intervals, p) / around(intervals, early)),
            ]
            for p in points
        ],
    )
    output.print_notes(
        bench.machine(),
        f"step {args.late} vs step {early}: {output.verdict(late_ratio, TARGET)}",
        f"worker CPU (user + system) along the long run: {output.ms(long_cpu)} a step",
    )

    size_ratio = statistics.median(full) / statistics.median(empty)
    output.print_table(
        f"flat_cost 2: per-step time of a {args.short_steps}-step run by database size",
        ["database", "median", "p99"],
        [
            ["empty", output.ms(statistics.median(empty)), output.ms(output.percentile(empty, 99))],
            [
                f"{args.old_rows:,} old journal rows",
                output.ms(statistics.median(full)),
                output.ms(output.percentile(full, 99)),
            ],
            ["ratio", output.times(size_ratio), ""],
        ],
    )
    output.print_notes(f"full vs empty: {output.verdict(size_ratio, TARGET)}")

    output.print_table(
        "flat_cost 3: where a step's time goes (in-process, no Celery; mean of "
        f"{profiling.PROFILED_STEPS} steps under cProfile, which inflates Python time)",
        ["phase", f"step {early}", f"step {args.late}", "growth"],
        profiling.phase_rows([profiles[early], profiles[args.late]], growth=True),
    )
    output.print_table(
        f"top functions by own time at step {args.late} (per step)",
        ["function", "calls", "own time"],
        profiling.top_functions(profiles[args.late], 8),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
