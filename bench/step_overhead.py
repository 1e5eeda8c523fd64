"""Per-step overhead: one run of N steps (scripted model, zero latency, one local read-only
tool call a step) through a real worker (threads x1), against the floor: a chain of N hops of
plain Celery doing the same durable work by hand (bench/plain_celery.py `plain.durable_hop`,
threads x1: run the stand-in model, commit its reply with a fenced UPDATE, commit the tool
result and the step number with a second, send the next hop), on the same broker and
database, in the same run, `--repeat` times in turn.
"""

from __future__ import annotations

import os
import pstats
import statistics
import time
from collections.abc import Callable
from functools import partial

import baseline
import cpu_use
import output
import plain_celery
import profiling
import psycopg
import records
import scratch

from pipeline.processes.celery_process import CeleryProcess

NAME = "step_overhead"
REDIS_DB = 10
TARGET = 2.0


def run_steps(steps: int, label: str) -> float:
    """Run one bench run of `steps` steps to the end; its mean seconds a step (from the
    commit that sends its first step until it is finished)."""
    done_before, _ = records.run_counts()
    _, started = records.create_runs(1, steps, label)
    wall = records.wait_for_runs(
        done_before + 1, timeout=60 + steps, label=f"run {label}", started=started
    )
    return wall / steps


def run_floor(db_url: str, hops: int, label: str) -> float:
    """Run one durable chain of `hops` hops to the end; its mean seconds a hop."""
    with psycopg.connect(plain_celery.libpq_url(db_url)) as conn:
        started = plain_celery.start_durable_chains(conn, [label], hops)
    wall = records.wait_for_count(
        lambda: int(records.sql("SELECT step FROM plain_runs WHERE id = :id", id=label)[0][0]),
        hops,
        timeout=60 + hops,
        label=f"chain {label}",
        started=started,
    )
    return wall / hops


def in_process(db_url: str, before: int = 10, timed: int = 20) -> tuple[float, float, pstats.Stats]:
    """The same work without Celery: (seconds a step, seconds a one-row commit, a profile)."""
    import plain_celery
    import psycopg

    from pipeline.engine.step import execute_step

    (run_id,), _ = records.create_runs(
        1, before + timed + profiling.PROFILED_STEPS + 5, "in-process"
    )
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
    return step, commit, profiling.profile_steps(run_id)


def measured(processes: list[CeleryProcess], work: Callable[[], float]) -> tuple[float, float]:
    """What `work` returns, and the CPU seconds these workers used meanwhile."""
    before = cpu_use.cpu_seconds(processes)
    result = work()
    return result, cpu_use.cpu_seconds(processes) - before


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="steps of the run and hops of the chain (default 200)",
    )
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured steps/hops first")
    parser.add_argument("--repeat", type=int, default=3, help="floor, nightshift: times (3)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    hops: list[float] = []
    hop_cpu: list[float] = []
    steps: list[float] = []
    step_cpu: list[float] = []
    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        output.log("starting the plain Celery worker (threads x1)")
        plain = baseline.plain_worker(bench, concurrency=1, pool="threads")
        output.log("starting one nightshift worker (threads x1)")
        worker = bench.worker("w1", pool="threads", concurrency=1)
        run_floor(bench.db_url, args.warmup, "warmup")
        run_steps(args.warmup, "warmup")
        for round_ in range(args.repeat):
            label = f"measured{round_}"
            hop, cpu = measured([plain], partial(run_floor, bench.db_url, args.steps, label))
            hops.append(hop)
            hop_cpu.append(cpu / args.steps)
            step, cpu = measured([worker], partial(run_steps, args.steps, label))
            steps.append(step)
            step_cpu.append(cpu / args.steps)
        bench.stop_all()
        output.log("timing and profiling steps in this process (no Celery)")
        step_alone, commit_alone, profile = in_process(bench.db_url)
    load_end = os.getloadavg()

    rows = [
        [
            f"round {i + 1}",
            output.ms(hops[i]),
            output.ms(steps[i]),
            output.times(steps[i] / hops[i]),
            output.ms(hop_cpu[i]),
            output.ms(step_cpu[i]),
            output.times(step_cpu[i] / hop_cpu[i]),
        ]
        for i in range(args.repeat)
    ]
    ratio = statistics.median(s / h for s, h in zip(steps, hops, strict=True))
    cpu_ratio = statistics.median(s / h for s, h in zip(step_cpu, hop_cpu, strict=True))
    output.print_table(
        f"step_overhead: one run of {args.steps} steps (one worker, threads x1) vs a chain of"
        f" {args.steps} durable hops by hand (plain Celery, threads x1); means a step",
        ["", "floor hop", "nightshift step", "ratio", "floor CPU a hop",
         "nightshift CPU a step", "ratio"],
        rows,
    )  # fmt: skip
    output.print_notes(
        bench.machine(),
        f"load average (1, 5, 15 min) at the start {' '.join(f'{v:.2f}' for v in load_start)},"
        f" at the end {' '.join(f'{v:.2f}' for v in load_end)}",
        "a step = claim + load + model + its journal write + tool call + checkpoint + hand-off",
        "a floor hop = stand-in model + fenced UPDATE of the reply, commit + fenced UPDATE of"
        " the tool result and step, commit + sending the next hop",
        f"median step ratio {output.times(ratio)}: {output.verdict(ratio, TARGET)};"
        f" median CPU ratio {output.times(cpu_ratio)}",
    )
    output.print_table(
        "in this process, no Celery or broker (mean of 20, no profiler)",
        ["", "time"],
        [
            ["engine step (execute_step, around step 10)", output.ms(step_alone)],
            ["one-row commit (the plain hop's database work)", output.ms(commit_alone)],
            ["ratio", output.times(step_alone / commit_alone)],
        ],
    )
    output.print_table(
        f"where an early step's time goes (in-process, mean of {profiling.PROFILED_STEPS} steps "
        "under cProfile, which inflates Python time)",
        ["phase", "per step"],
        profiling.phase_rows([profile]),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
