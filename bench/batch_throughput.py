"""Throughput on one worker host: many bench runs at once (scripted model, zero latency, one
local tool call a step), in steps per second, against chains of the same shape on a plain
Celery app (bench/plain_celery.py: one chain per run, one hop per step, each hop one committed
row), in the same run on the same broker and database.
"""

from __future__ import annotations

import time

import common

NAME = "batch_throughput"
REDIS_DB = 11


def baseline(chains: int, hops: int, label: str, timeout: float) -> float:
    """Seconds for `chains` chains of `hops` hops, all started at once."""
    total = common.hop_count() + chains * hops
    started = time.monotonic()
    for i in range(chains):
        common.start_chain(f"{label}-{i}", hops)
    return common.wait_for_count(
        common.hop_count, total, timeout=timeout, label=f"hops {label}", started=started
    )


def nightshift(runs: int, steps: int, label: str, timeout: float) -> float:
    """Seconds for `runs` runs of `steps` steps, created in one transaction whose commit sends
    every first step; the clock starts at that commit (the first send), as for the chains."""
    done_before, _ = common.run_counts()
    _, started = common.create_runs(runs, steps, label)
    return common.wait_for_runs(
        done_before + runs, timeout=timeout, label=f"runs {label}", started=started
    )


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--runs", type=int, default=200, help="runs (and chains); default 200")
    parser.add_argument("--steps", type=int, default=5, help="steps a run (hops a chain); 5")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=8, help="threads a worker (default 8)")
    args = parser.parse_args(argv)
    total = args.runs * args.steps
    timeout = 120 + total  # a generous second a step

    slots = args.processes * args.threads
    with common.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        common.log(f"starting the plain Celery worker (prefork x{slots})")
        bench.plain_worker(concurrency=slots)
        common.log(f"starting {args.processes} worker(s), x{args.threads} each")
        for i in range(args.processes):
            bench.worker(f"w{i + 1}", concurrency=args.threads)
        warm = max(slots, 10)
        baseline(warm, 2, "warmup", timeout)
        nightshift(warm, 2, "warmup", timeout)
        with common.CpuMeter(bench.processes) as hop_cpu:
            hop_seconds = baseline(args.runs, args.steps, "measured", timeout)
        with common.CpuMeter(bench.processes) as step_cpu:
            step_seconds = nightshift(args.runs, args.steps, "measured", timeout)

    hop_rate, step_rate = total / hop_seconds, total / step_seconds
    common.print_table(
        f"batch_throughput: {args.runs} x {args.steps} on {args.processes} worker process(es)"
        f" x {args.threads} slots vs a plain Celery app on prefork x {slots}",
        ["", "tasks", "wall", "per second", "machine CPU"],
        [
            [
                "plain Celery hops",
                total,
                common.secs(hop_seconds),
                f"{hop_rate:.0f} hops/s",
                hop_cpu.describe(),
            ],
            [
                "nightshift steps",
                total,
                common.secs(step_seconds),
                f"{step_rate:.0f} steps/s",
                step_cpu.describe(),
            ],
            ["ratio (time)", "", common.times(step_seconds / hop_seconds), "", ""],
        ],
    )
    common.print_notes(
        bench.machine(),
        "wall = from the first send until the last hop is committed / the last run is finished",
        "the database, the broker, the workers and this process share the machine's cores",
        f"machine CPU a hop: {hop_cpu.per_task(total)}; a step: {step_cpu.per_task(total)}",
        f"worker CPU (user + system, pool children included) a hop: "
        f"{hop_cpu.worker_per_task(total, 'plain workers')}; a step: "
        f"{step_cpu.worker_per_task(total)}",
        f"CPU in cores, hops: {hop_cpu.breakdown()}",
        f"CPU in cores, steps: {step_cpu.breakdown()}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
