"""Waiting on a slow model: many bench runs at once whose model takes 0.5 s to answer (the
local Messages API server, through the real anthropic SDK), on thread-pool workers.

Wall time is compared with the ideal with unlimited concurrency (steps x latency: every run's
steps back to back, all runs at once), with the ideal for the slots the workers have, with
running the same model calls one after another, and with the plain Celery baseline measured
first in the same run: the same number of chains of the same length, each hop one SDK call to
the same server, one committed row and the send of the next hop (bench/plain_celery.py), on as
many plain workers with as many slots. That baseline is the floor of Celery + the SDK here.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

import baseline
import cpu_use
import output
import records
import scratch

NAME = "model_wait"
REDIS_DB = 12
TARGET = 1.3


def peak_in_flight(entries: list[dict[str, Any]], latency: float) -> int:
    """The most model requests the server held at once (each is held `latency` seconds)."""
    arrivals = sorted(datetime.fromisoformat(e["at"]).timestamp() for e in entries)
    peak, first = 0, 0
    for i, at in enumerate(arrivals):
        while arrivals[first] <= at - latency:
            first += 1
        peak = max(peak, i - first + 1)
    return peak


def plain_floor(
    bench: scratch.Scratch, args: Any, model_url: str
) -> tuple[float, cpu_use.CpuMeter]:
    """The plain baseline's wall time for `runs` chains of `steps` model hops, and its CPU."""
    slots = args.processes * args.threads
    output.log(f"starting {args.processes} plain worker(s), {args.pool} x{args.threads} each")
    plain = [
        baseline.plain_worker(
            bench, f"plain{i + 1}", concurrency=args.threads, pool=args.pool, model_url=model_url
        )
        for i in range(args.processes)
    ]
    before = baseline.hop_count()
    for i in range(slots):  # warm-up: every slot's first hop opens its connections
        baseline.start_chain(f"warmup-model-{i}", 1, model=True)
    records.wait_for_count(
        lambda: baseline.hop_count() - before, slots, timeout=120, label="plain warm-up"
    )
    before = baseline.hop_count()
    with cpu_use.CpuMeter(plain) as cpu:
        started = time.monotonic()
        for i in range(args.runs):
            baseline.start_chain(f"model-{i}", args.steps, model=True)
        wall = records.wait_for_count(
            lambda: baseline.hop_count() - before,
            args.runs * args.steps,
            timeout=120 + args.runs * args.steps * args.latency,
            label="plain chains",
            started=started,
        )
    for process in plain:
        process.stop()
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--runs", type=int, default=1000, help="runs (default 1000)")
    parser.add_argument("--steps", type=int, default=5, help="steps a run (default 5)")
    parser.add_argument("--latency", type=float, default=0.5, help="model seconds (0.5)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=100, help="slots a worker (100)")
    parser.add_argument("--pool", default="threads", help="worker pool: threads or gevent")
    args = parser.parse_args(argv)
    slots = args.processes * args.threads
    calls = args.runs * args.steps

    with scratch.model_server(args.latency) as server:
        with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs, model_url=server.url) as b:
            plain_wall, plain_cpu = plain_floor(b, args, server.url)
            output.log(f"starting {args.processes} worker(s), threads x{args.threads} each")
            for i in range(args.processes):
                b.worker(f"w{i + 1}", pool=args.pool, concurrency=args.threads)
            # Warm-up: every thread's first step opens its connections (database, model).
            records.create_runs(slots, 1, "warmup")
            records.wait_for_runs(slots, timeout=120, label="warm-up runs")
            log_before = len(server.log.entries())
            with cpu_use.CpuMeter(b.processes) as cpu:
                _, started = records.create_runs(args.runs, args.steps, "measured")
                wall = records.wait_for_runs(
                    slots + args.runs,
                    timeout=120 + calls * args.latency,
                    label="runs",
                    started=started,
                )
        measured = server.log.entries()[log_before:]
    requests = len(measured)
    peak = peak_in_flight(measured, args.latency)

    unlimited = args.steps * args.latency
    slot_bound = math.ceil(args.runs / slots) * args.steps * args.latency
    serial = calls * args.latency
    output.print_table(
        f"model_wait: {args.runs} runs x {args.steps} steps, model latency "
        f"{args.latency:g} s, {args.processes} worker process(es) x {args.threads} threads "
        f"({slots} slots)",
        ["", "wall", "measured / this"],
        [
            ["measured", output.secs(wall), ""],
            [
                "plain Celery + SDK floor (same chains, same slots, this run)",
                output.secs(plain_wall),
                output.times(wall / plain_wall),
            ],
            [
                "ideal, unlimited concurrency (steps x latency)",
                output.secs(unlimited),
                output.times(wall / unlimited),
            ],
            [
                f"ideal with {slots} slots (ceil(runs/slots) x steps x latency)",
                output.secs(slot_bound),
                output.times(wall / slot_bound),
            ],
            [
                "serial (runs x steps x latency)",
                output.secs(serial),
                f"{serial / wall:.0f}x faster than serial",
            ],
        ],
    )
    output.print_notes(
        b.machine(),
        f"model requests: {requests} for {calls} steps; at most {peak} in flight at once",
        f"machine CPU during the run: {cpu.describe()}; {calls / wall:.0f} steps/s; "
        f"{cpu.per_task(calls)} of machine CPU a step",
        f"worker CPU (user + system, pool children included): {cpu.worker_per_task(calls)} a step"
        f" vs {plain_cpu.worker_per_task(calls, 'plain workers')} a plain model hop",
        f"plain floor: {calls / plain_wall:.0f} hops/s, machine {plain_cpu.describe()}, "
        f"{plain_cpu.per_task(calls)} of machine CPU a hop",
        f"CPU by process, in cores: {cpu.breakdown()}",
        f"vs unlimited-concurrency ideal: {output.verdict(wall / unlimited, TARGET)}",
        f"vs ideal for {slots} slots: {output.verdict(wall / slot_bound, TARGET)}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
