"""Per-step overhead: one run of N steps (scripted model, zero latency, one local read-only
tool call a step) through a real worker, against a chain of N hops of a plain Celery app
(bench/plain_celery.py) that each commit one row and send the next hop, on the same broker and
database, in the same run.
"""

from __future__ import annotations

import pstats
import statistics
import time
from collections.abc import Callable

import common

NAME = "step_overhead"
REDIS_DB = 10
TARGET = 1.5


def run_steps(steps: int, label: str) -> list[float]:
    """Run one bench run of `steps` steps to the end; its step intervals (step 1 onwards)."""
    done_before, _ = common.run_counts()
    (run_id,), _ = common.create_runs(1, steps, label)
    common.wait_for_runs(done_before + 1, timeout=60 + steps, label=f"run {label}")
    return list(common.step_intervals(run_id).values())


def in_process(db_url: str, before: int = 10, timed: int = 20) -> tuple[float, float, pstats.Stats]:
    """The same work without Celery: (seconds a step, seconds a one-row commit, a profile)."""
    import plain_celery
    import psycopg

    from pipeline.engine.step import execute_step

    (run_id,), _ = common.create_runs(1, before + timed + common.PROFILED_STEPS + 5, "in-process")
    for _ in range(before):
        execute_step(run_id, "bench:in-process")
    started = time.perf_counter()
    for _ in range(timed):
        execute_step(run_id, "bench:in-process")
    step = (time.perf_counter() - started) / timed
    with psycopg.connect(plain_celery.libpq_url(db_url)) as conn:
        started = time.perf_counter()
        for i in range(timed):
            conn.execute("INSERT INTO plain_hops (chain, hop) VALUES (%s, %s)", ("in-process", i))
            conn.commit()
        commit = (time.perf_counter() - started) / timed
    return step, commit, common.profile_steps(run_id)


def measured(
    processes: list[common.CeleryProcess], work: Callable[[], list[float]]
) -> tuple[list[float], float]:
    """The intervals `work` returns, and the CPU seconds these workers used meanwhile."""
    before = common.cpu_seconds(processes)
    intervals = work()
    return intervals, common.cpu_seconds(processes) - before


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="steps of the run and hops of the chain (default 200)",
    )
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured steps/hops first")
    parser.add_argument("--pool", default="threads", help="worker pool (default threads)")
    parser.add_argument("--concurrency", type=int, default=1, help="worker slots (default 1)")
    args = parser.parse_args(argv)

    with common.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        common.log("starting the plain Celery worker (prefork x1)")
        plain = bench.plain_worker(concurrency=1)
        common.log(f"starting one nightshift worker ({args.pool} x{args.concurrency})")
        worker = bench.worker("w1", pool=args.pool, concurrency=args.concurrency)
        run_steps(args.warmup, "warmup")
        hops, hop_cpu = measured(
            [plain], lambda: common.run_chain("measured", args.steps, timeout=60 + args.steps)
        )
        steps, step_cpu = measured([worker], lambda: run_steps(args.steps, "measured"))
        bench.stop_all()
        common.log("timing and profiling steps in this process (no Celery)")
        step_alone, commit_alone, profile = in_process(bench.db_url)

    rows = []
    for label, values in (("plain Celery hop", hops), ("nightshift step", steps)):
        rows.append(
            [
                label,
                len(values),
                common.ms(statistics.median(values)),
                common.ms(common.percentile(values, 99)),
                common.ms(statistics.mean(values)),
            ]
        )
    median_ratio = statistics.median(steps) / statistics.median(hops)
    p99_ratio = common.percentile(steps, 99) / common.percentile(hops, 99)
    mean_ratio = statistics.mean(steps) / statistics.mean(hops)
    rows.append(
        ["ratio", "", common.times(median_ratio), common.times(p99_ratio), common.times(mean_ratio)]
    )
    common.print_table(
        f"step_overhead: one run of {args.steps} steps (one worker, {args.pool} "
        f"x{args.concurrency}) vs a plain Celery chain of {args.steps} hops (prefork x1)",
        ["", "n", "median", "p99", "mean"],
        rows,
    )
    common.print_notes(
        bench.machine(),
        "a step = tool call + journal writes + checkpoint + hand-off + claim + load + model",
        "a hop = one committed INSERT + sending the next hop (plain Celery app: prefork,"
        " acks_late, prefetch 1, JSON, no result backend, no events)",
        f"worker CPU (user + system, pool children included): {common.ms(step_cpu / args.steps)}"
        f" a step, {common.ms(hop_cpu / args.steps)} a hop",
        f"median ratio {common.times(median_ratio)}: {common.verdict(median_ratio, TARGET)}",
    )
    common.print_table(
        "in this process, no Celery or broker (mean of 20, no profiler)",
        ["", "time"],
        [
            ["engine step (execute_step, around step 10)", common.ms(step_alone)],
            ["one-row commit (the plain hop's database work)", common.ms(commit_alone)],
            ["ratio", common.times(step_alone / commit_alone)],
        ],
    )
    common.print_table(
        f"where an early step's time goes (in-process, mean of {common.PROFILED_STEPS} steps "
        "under cProfile, which inflates Python time)",
        ["phase", "per step"],
        common.phase_rows([profile]),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
