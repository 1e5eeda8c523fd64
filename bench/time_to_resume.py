"""Time to resume: SIGKILL in the middle of a step, then the time until a live worker claims
the run again (runs.attempt goes up), with beat's tick running.

Two ways to die: the whole worker (its process group, so the pool goes too; the other worker
must take over) and one prefork pool child (the worker survives and Celery re-sends the task,
task_retry_on_worker_lost). Each with the default lease (15 s, heartbeat 5 s, tick 2 s) and a
fast one (3 s, heartbeat 1 s, tick 1 s). The model takes 1 s a call, so kills land mid-step.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import time
from dataclasses import dataclass

import output
import psutil
import records
import scratch

from pipeline.processes.celery_process import CeleryProcess, wait_for

NAME = "time_to_resume"
REDIS_DB = 14
STEPS = 1000  # a trial's run never finishes by itself: it is cancelled once resumed


@dataclass(frozen=True)
class Lease:
    name: str
    lease: float
    heartbeat: float
    tick: float
    target: float
    """p95 target for a whole-worker kill (a pool child's target is CHILD_TARGET)."""

    def env(self) -> dict[str, str]:
        return {
            "NIGHTSHIFT_LEASE_SECONDS": f"{self.lease:g}",
            "NIGHTSHIFT_HEARTBEAT_SECONDS": f"{self.heartbeat:g}",
            "NIGHTSHIFT_TICK_SECONDS": f"{self.tick:g}",
        }


LEASES = (Lease("default", 15, 5, 2, 20.0), Lease("fast", 3, 1, 1, 20.0))
CHILD_TARGET = 3.0
SCENARIOS = ("pool child", "whole worker")
SCENARIO_NAMES = {"child": "pool child", "worker": "whole worker"}


@dataclass(frozen=True)
class Trial:
    resumed_after: float
    lease_left: float
    """Seconds the dead holder's lease still had to run at the kill."""
    same_worker: bool


def holder() -> tuple[int, str | None, float | None]:
    """(attempt, lease_owner, seconds left on the lease) of the only running run."""
    rows = records.sql(
        "SELECT attempt, lease_owner, extract(epoch FROM lease_expires_at - now())"
        " FROM runs WHERE status = 'running'"
    )
    if len(rows) != 1:
        return -1, None, None
    attempt, owner, left = rows[0]
    return int(attempt), owner, None if left is None else float(left)


def owner_pid(owner: str | None) -> int | None:
    return int(owner.split(":")[1]) if owner else None


def pool_of(worker: CeleryProcess) -> set[int]:
    return {child.pid for child in psutil.Process(worker.pid).children(recursive=True)}


def trial(
    bench: scratch.Scratch, workers: list[CeleryProcess], scenario: str, lease: Lease
) -> Trial:
    (run_id,), _ = records.create_runs(1, STEPS, f"{lease.name}-{scenario}")

    def mid_step() -> tuple[int, str] | None:
        attempt, owner, _ = holder()
        return (attempt, owner) if owner and attempt >= 2 else None

    # Into the second step's model call (it takes about a second), at a random point.
    attempt, owner = wait_for(mid_step, timeout=60, what="a step in flight")
    time.sleep(random.uniform(0.1, 0.6))
    attempt, now_owner, lease_left = holder()
    if now_owner != owner:
        records.sql("UPDATE runs SET cancel_requested = true WHERE id = :id", id=run_id)
        return trial(bench, workers, scenario, lease)  # the step ended first: try again
    victim_pid = owner_pid(owner)
    worker = next(w for w in workers if victim_pid in pool_of(w))
    if scenario == "whole worker":
        worker.kill()
    else:
        os.kill(victim_pid, signal.SIGKILL)
    killed = time.monotonic()

    def resumed() -> str | None:
        new_attempt, new_owner, _ = holder()
        return new_owner if new_attempt > attempt and new_owner else None

    new_owner = wait_for(resumed, timeout=120, what="a claim after the kill", interval=0.02)
    after = time.monotonic() - killed
    same = not worker.exited() and owner_pid(new_owner) in pool_of(worker)
    records.sql("UPDATE runs SET cancel_requested = true WHERE id = :id", id=run_id)
    wait_for(lambda: records.run_counts()[0] >= count_runs(), timeout=60, what="the run to stop")
    if scenario == "whole worker":
        index = workers.index(worker)
        workers[index] = bench.worker(
            f"w{index + 1}", pool="prefork", concurrency=2, env=lease.env()
        )
    else:
        wait_for(lambda: len(pool_of(worker)) >= 2, timeout=30, what="a new pool child")
    return Trial(after, lease_left or 0.0, same)


def count_runs() -> int:
    return int(records.sql("SELECT count(*) FROM runs")[0][0])


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--trials", type=int, default=5, help="kills per case (default 5)")
    parser.add_argument("--latency", type=float, default=1.0, help="model seconds (1.0)")
    parser.add_argument("--leases", default="default,fast", help="default,fast or one of them")
    parser.add_argument(
        "--killed", default="child,worker", help="child,worker (pool child, whole worker) or one"
    )
    args = parser.parse_args(argv)
    leases = [lease for lease in LEASES if lease.name in args.leases.split(",")]
    unknown = set(args.killed.split(",")) - SCENARIO_NAMES.keys()
    if unknown:
        parser.error(f"--killed: no such kill {', '.join(sorted(unknown))} (child or worker)")
    killed = {SCENARIO_NAMES[name] for name in args.killed.split(",")}
    scenarios = [scenario for scenario in SCENARIOS if scenario in killed]

    results: dict[tuple[str, str], list[Trial]] = {}
    with (
        scratch.model_server(args.latency) as server,
        scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs, model_url=server.url) as b,
    ):
        for lease in leases:
            output.log(f"{lease.name} lease: starting beat and two prefork workers (-c 2)")
            b.beat(env=lease.env())
            workers = [
                b.worker(f"w{i}", pool="prefork", concurrency=2, env=lease.env()) for i in (1, 2)
            ]
            for scenario in scenarios:
                trials = results.setdefault((lease.name, scenario), [])
                for i in range(args.trials):
                    trials.append(trial(b, workers, scenario, lease))
                    output.log(
                        f"{lease.name} lease, {scenario} killed, trial {i + 1}/{args.trials}:"
                        f" resumed after {trials[-1].resumed_after:.2f}s"
                    )
            b.stop_all()
            b.flush_broker()

    rows = []
    notes = []
    for lease in leases:
        for scenario in scenarios:
            trials = results[(lease.name, scenario)]
            waits = [t.resumed_after for t in trials]
            p95 = output.percentile(waits, 95)
            target = CHILD_TARGET if scenario == "pool child" else lease.target
            rows.append(
                [
                    f"{lease.name} ({lease.lease:g}/{lease.heartbeat:g}/{lease.tick:g})",
                    scenario,
                    len(waits),
                    output.secs(output.percentile(waits, 50)),
                    output.secs(p95),
                    output.secs(max(waits)),
                    output.secs(statistics.median(t.lease_left for t in trials)),
                    sum(t.same_worker for t in trials),
                ]
            )
            notes.append(
                f"{lease.name} lease, {scenario}: p95 {output.secs(p95)}, "
                f"{'met' if p95 < target else 'MISSED'} (target < {target:g} s)"
            )
    output.print_table(
        "time_to_resume: SIGKILL mid-step -> next claim by a live worker "
        f"(2 prefork workers -c 2, beat, model {args.latency:g} s)",
        [
            "lease (lease/heartbeat/tick s)",
            "killed",
            "n",
            "p50",
            "p95",
            "max",
            "lease left at kill (median)",
            "resumed in same worker",
        ],
        rows,
    )
    output.print_notes(b.machine(), *notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
