"""Throughput on one worker host: many bench runs at once (the scripted model, in process,
taking `--latency` seconds a step; one local tool call a step), against the floor: plain
Celery doing the same durable work by hand (bench/plain_celery.py `plain.durable_hop`: one
task a step on the threads pool, acks_late, prefetch 1, JSON, no result backend; each hop runs
the same stand-in model, commits its reply with a fenced UPDATE, commits the tool result and
the step number with a second fenced UPDATE, then sends the next hop; a psycopg pool of 20 a
process). Same slots, same broker and database, in the same run, `--repeat` times in turn.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import baseline
import cpu_use
import output
import plain_celery
import psycopg
import records
import scratch

NAME = "batch_throughput"
REDIS_DB = 11
WALL_TARGET = 1.25
CPU_TARGET = 1.5


@dataclass
class Measured:
    wall: float
    cpu_a_step: float
    """Worker CPU seconds (user + system, pool children included) a step."""


def floor(db_url: str, chains: int, hops: int, label: str, timeout: float) -> float:
    """Seconds for `chains` durable chains of `hops` hops, all started at once."""
    names = [f"{label}-{i}" for i in range(chains)]
    with psycopg.connect(plain_celery.libpq_url(db_url)) as conn:
        started = plain_celery.start_durable_chains(conn, names, hops)
    return records.wait_for_count(
        lambda: int(
            records.sql(
                "SELECT coalesce(sum(step), 0) FROM plain_runs WHERE id LIKE :like",
                like=f"{label}-%",
            )[0][0]
        ),
        chains * hops,
        timeout=timeout,
        label=f"hops {label}",
        started=started,
    )


def nightshift(runs: int, steps: int, latency: float, label: str, timeout: float) -> float:
    """Seconds for `runs` runs of `steps` steps, created in one transaction whose commit sends
    every first step; the clock starts at that commit (the first send), as for the chains."""
    done_before, _ = records.run_counts()
    _, started = records.create_runs(runs, steps, label, model_seconds=latency)
    return records.wait_for_runs(
        done_before + runs, timeout=timeout, label=f"runs {label}", started=started
    )


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--runs", type=int, default=1000, help="runs (and chains); 1000")
    parser.add_argument("--steps", type=int, default=5, help="steps a run (hops a chain); 5")
    parser.add_argument("--latency", type=float, default=0.5, help="model seconds (0.5)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=100, help="threads a worker (100)")
    parser.add_argument("--repeat", type=int, default=1, help="floor, nightshift: times (1)")
    args = parser.parse_args(argv)
    total = args.runs * args.steps
    timeout = 120 + total * max(args.latency, 0.2)
    load_start = os.getloadavg()
    slots = args.processes * args.threads
    floors: list[Measured] = []
    ours: list[Measured] = []
    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        output.log(f"starting {args.processes} plain worker(s), threads x{args.threads} each")
        plain = [
            baseline.plain_worker(
            bench,
                f"plain{i + 1}", concurrency=args.threads, pool="threads",
                model_seconds=args.latency,
            )
            for i in range(args.processes)
        ]  # fmt: skip
        output.log(f"starting {args.processes} worker(s), threads x{args.threads} each")
        workers = [
            bench.worker(f"w{i + 1}", concurrency=args.threads) for i in range(args.processes)
        ]
        # Warm-up: every slot's first step opens its connections.
        floor(bench.db_url, slots, 1, "warmup", timeout)
        nightshift(slots, 1, args.latency, "warmup", timeout)
        for round_ in range(args.repeat):
            with cpu_use.CpuMeter(plain) as cpu:
                wall = floor(bench.db_url, args.runs, args.steps, f"measured{round_}", timeout)
            floors.append(Measured(wall, cpu.seconds.get("plain workers", 0.0) / total))
            with cpu_use.CpuMeter(workers) as cpu:
                wall = nightshift(args.runs, args.steps, args.latency, f"m{round_}", timeout)
            ours.append(Measured(wall, cpu.seconds.get("workers", 0.0) / total))
    load_end = os.getloadavg()

    rows = [
        [
            f"round {i + 1}",
            output.secs(f.wall),
            output.secs(n.wall),
            output.times(n.wall / f.wall),
            output.ms(f.cpu_a_step),
            output.ms(n.cpu_a_step),
            output.times(n.cpu_a_step / f.cpu_a_step),
        ]
        for i, (f, n) in enumerate(zip(floors, ours, strict=True))
    ]
    wall_ratio = statistics.median(n.wall / f.wall for f, n in zip(floors, ours, strict=True))
    cpu_ratio = statistics.median(
        n.cpu_a_step / f.cpu_a_step for f, n in zip(floors, ours, strict=True)
    )
    output.print_table(
        f"batch_throughput: {args.runs} runs x {args.steps} steps, model {args.latency:g} s in"
        f" process, {args.processes} worker(s) x {args.threads} threads"
        f" (slot ideal {output.secs(-(-args.runs // slots) * args.steps * args.latency)})",
        ["", "floor wall", "nightshift wall", "ratio", "floor CPU a hop",
         "nightshift CPU a step", "ratio"],
        rows,
    )  # fmt: skip
    output.print_notes(
        bench.machine(),
        f"load average (1, 5, 15 min) at the start {fmt_load(load_start)}, "
        f"at the end {fmt_load(load_end)}",
        "floor = plain Celery doing the same durable work by hand (plain.durable_hop, threads"
        " pool, same slots); CPU = the workers' user + system, pool children included",
        f"median wall ratio {output.times(wall_ratio)}: {output.verdict(wall_ratio, WALL_TARGET)}",
        f"median CPU-a-step ratio {output.times(cpu_ratio)}: "
        f"{output.verdict(cpu_ratio, CPU_TARGET)}",
    )
    return 0


def fmt_load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{value:.2f}" for value in load)


if __name__ == "__main__":
    raise SystemExit(main())
