"""What live progress and synchronous waits cost, measured in one run on one scratch database:

1. The progress-feed triggers on the step: in-process steps of the bench agent with the
   triggers enabled and disabled, in alternating blocks (the same database, the same run).
2. Waiting: N idle long-polls (`GET /runs/{id}?wait=`, LISTEN on nightshift_run_settled) against
   N waiters polling the run with backoff (0.1 s doubling to 1 s, the alternative), each for
   the same window: transactions the database served per second, and how soon each answered
   after the commit that finished its run.
3. Reading the feed: one read of a run's whole feed, the idle re-read an SSE stream makes every
   poll, and the same for a batch of many runs.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import output
import records
import scratch
import uvicorn

from pipeline.processes.celery_process import wait_for

NAME = "live_progress"
REDIS_DB = 8
TRIGGER_TABLES = ("runs", "journal", "actions", "batches")


def step_time(run_id: uuid.UUID, steps: int) -> float:
    from pipeline.engine.step import execute_step

    started = time.perf_counter()
    for _ in range(steps):
        execute_step(run_id, "bench:live-progress")
    return (time.perf_counter() - started) / steps


def triggers(enabled: bool) -> None:
    verb = "ENABLE" if enabled else "DISABLE"
    for table in TRIGGER_TABLES:
        records.sql(f"ALTER TABLE {table} {verb} TRIGGER USER")


def trigger_cost(blocks: int, steps: int) -> tuple[list[float], list[float]]:
    """Seconds a step with the triggers (on) and without (off), block by block."""
    on: list[float] = []
    off: list[float] = []
    (run_id,), _ = records.create_runs(1, blocks * 2 * steps + 20, "triggers")
    step_time(run_id, 10)  # warm up imports, pools and plans
    for _ in range(blocks):
        for enabled, into in ((False, off), (True, on)):
            triggers(enabled)
            into.append(step_time(run_id, steps))
    triggers(True)
    return on, off


def transactions() -> int:
    row = records.sql(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"
    )[0]
    return int(row[0])


def serve() -> tuple[uvicorn.Server, str]:
    from pipeline.api.base import ApiConfig
    from pipeline.api.server import create_app

    app = create_app(ApiConfig(api_token="bench-token-0123456789abcdef"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off", ws="none"))  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    wait_for(lambda: server.started, timeout=15, what="the API server")
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def long_poll(base: str) -> Callable[[uuid.UUID, float], None]:
    headers = {"Authorization": "Bearer bench-token-0123456789abcdef"}

    def wait(run_id: uuid.UUID, until: float) -> None:
        while time.monotonic() < until:
            left = max(1.0, min(60.0, until - time.monotonic()))
            run = httpx.get(f"{base}/runs/{run_id}?wait={left:.0f}", headers=headers,
                            timeout=left + 30).json()["run"]  # fmt: skip
            if run["status"] != "running":
                return

    return wait


def backoff_poll(run_id: uuid.UUID, until: float) -> None:
    from pipeline.views.outcomes import outcome

    delay = 0.1
    while time.monotonic() < until and not outcome(run_id).settled:
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def waiting(
    name: str, wait: Callable[[uuid.UUID, float], None], waiters: int, idle: float
) -> tuple[float, list[float]]:
    """(transactions per second while `waiters` wait idle, seconds from each run's finishing
    commit to its waiter's answer)."""
    runs, _ = records.create_runs(waiters, 1, name)  # running, with no worker to move them
    answered: dict[uuid.UUID, float] = {}
    until = time.monotonic() + idle + 60

    def one(run_id: uuid.UUID) -> None:
        wait(run_id, until)
        answered[run_id] = time.monotonic()

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in runs]
    for thread in threads:
        thread.start()
    time.sleep(2)  # every waiter in place
    before, started = transactions(), time.monotonic()
    time.sleep(idle)
    rate = (transactions() - before) / (time.monotonic() - started)
    latencies = []
    for run_id in runs:
        records.sql("UPDATE runs SET status = 'succeeded' WHERE id = :id", id=run_id)
        finished = time.monotonic()
        wait_for(lambda r=run_id: r in answered, timeout=30, what=f"{name} answer")
        latencies.append(answered[run_id] - finished)
    for thread in threads:
        thread.join(timeout=5)
    return rate, latencies


def feed_reads(events_per_run: int, batch_runs: int) -> list[list[str]]:
    from pipeline.views.feed import START, Subject, latest_position, read

    rows = []
    batch_id = "bench:feed"
    records.sql(
        "INSERT INTO batches (id, name, params, status) VALUES (:id, 'bench', '{}', 'running')",
        id=batch_id,
    )
    runs, _ = records.create_runs(batch_runs, 1, "feed")
    records.sql("UPDATE runs SET batch_id = :b WHERE id = ANY(:ids)", b=batch_id, ids=runs)
    records.sql(
        "INSERT INTO run_events (run_id, kind, data) SELECT r, 'claimed', "
        "jsonb_build_object('step', n) FROM unnest(CAST(:ids AS uuid[])) r, "
        "generate_series(1, :n) n", ids=runs, n=events_per_run,
    )  # fmt: skip
    for label, subject in (("one run", Subject(run_id=runs[0])),
                           (f"batch of {batch_runs}", Subject(batch_id=batch_id))):  # fmt: skip
        whole = timed(lambda s=subject: read(s, START, limit=100_000))
        end = latest_position(subject)
        idle = timed(lambda s=subject, e=end: read(s, e))
        count = len(read(subject, START, limit=100_000).events)
        rows.append([label, str(count), output.ms(whole), output.ms(idle)])
    return rows


def timed(work: Callable[[], object], repeat: int = 20) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks of steps")
    parser.add_argument("--steps", type=int, default=50, help="steps per block")
    parser.add_argument("--waiters", type=int, default=50)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds the waiters wait idle")
    args = parser.parse_args()
    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        output.log("steps with and without the feed's triggers")
        on, off = trigger_cost(args.blocks, args.steps)
        server, base = serve()
        try:
            output.log(f"{args.waiters} long-polls waiting {args.idle:g} s")
            listen_rate, listen_latency = waiting("listen", long_poll(base), args.waiters,
                                                  args.idle)  # fmt: skip
            output.log(f"{args.waiters} backoff polls waiting {args.idle:g} s")
            poll_rate, poll_latency = waiting("poll", backoff_poll, args.waiters, args.idle)
        finally:
            server.should_exit = True
        output.log("feed reads")
        reads = feed_reads(events_per_run=200, batch_runs=30)

    step_on, step_off = statistics.median(on), statistics.median(off)
    output.print_table(
        "progress-feed triggers on the step (in-process, median of blocks)",
        ["triggers", "per step", "ratio"],
        [["off", output.ms(step_off), "1.00x"], ["on", output.ms(step_on),
          output.times(step_on / step_off)]],
    )  # fmt: skip
    output.print_table(
        f"{args.waiters} waiters, idle {args.idle:g} s, then each run finishes",
        ["how", "db transactions/s while idle", "answer after commit p50", "p95"],
        [[how, f"{rate:.1f}", output.ms(output.percentile(lat, 50)),
          output.ms(output.percentile(lat, 95))]
         for how, rate, lat in (("LISTEN long-poll", listen_rate, listen_latency),
                                ("poll with backoff", poll_rate, poll_latency))],
    )  # fmt: skip
    output.print_table(
        "reading the feed (median of 20)", ["subject", "events", "whole feed", "idle re-read"],
        reads,
    )  # fmt: skip
    output.print_notes(
        "idle transactions/s include the database's own background (autovacuum, stats)",
        bench.machine(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
