"""Scale-out: the same batch on 1, 2 and 3 worker hosts (network namespaces, each with its own
address and hostname, reaching PostgreSQL and Redis over a veth pair), the model taking 0.5 s
(the local Messages API server through the real anthropic SDK).

Each host runs one worker process with the same threads, so the hosts add slots; PostgreSQL,
Redis, the model server and every host share this machine's cores. Aggregate steps per second
and PostgreSQL commits per second show where adding hosts stops helping, and the CPU figures
why. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cpu_use
import output
import plain_celery
import psycopg
import records
import scratch
from psycopg import sql

from pipeline import embedded
from pipeline.chaos.hosts import Network, unavailable
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.responders import agent_responder

NAME = "scale_out"
REDIS_DB = 6
DEFAULT_MAX_CONNECTIONS = 100


def commits() -> int:
    """Transactions committed in the scratch database so far (all backends)."""
    return int(
        records.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[
            0
        ][0]
    )


def commits_after_flush() -> int:
    # Backends report their counters about once a second: wait for the last ones.
    time.sleep(1.5)
    records.sql("SELECT pg_stat_clear_snapshot()")
    return commits()


def size_connections(
    services: Path, urls: dict[str, str], network: Network, hosts: int, threads: int
) -> dict[str, str]:
    """Give PostgreSQL the connections the most hosts need (docs/operations.md: 2 x (threads + 4) a
    worker process, plus this process and beat), restarting it if that is above its default. With
    the default 100, 6 hosts x 16 threads ran out ('too many clients already') mid-step."""
    needed = hosts * 2 * (threads + 4) + 20
    if needed <= DEFAULT_MAX_CONNECTIONS:
        return urls
    with psycopg.connect(plain_celery.libpq_url(urls["postgres"]), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SYSTEM SET max_connections = {}").format(needed))
    embedded.stop(services, only=["postgres"])
    return embedded.ensure_running(
        services, listen=[network.service_address], clients=[network.clients]
    )


def measure(
    bench: scratch.Scratch, network: Network, hosts: int, args: argparse.Namespace, env: dict
) -> list[str]:
    """One configuration: one worker on each of `hosts` hosts; its row of figures."""
    workers = [
        bench.worker(f"h{i}-of-{hosts}", concurrency=args.threads, env=env, wrap=host.wrap())
        for i, host in enumerate(network.hosts[:hosts], start=1)
    ]
    slots = hosts * args.threads
    done, _ = records.run_counts()
    output.log(f"{hosts} host(s): warming up {slots} slots")
    records.create_runs(slots, 1, f"warm-{hosts}")
    records.wait_for_runs(done + slots, timeout=180, label="warm-up runs")
    _, started = records.create_runs(args.runs, args.steps, f"measured-{hosts}")
    before = commits()
    with cpu_use.CpuMeter(workers) as cpu:
        wall = records.wait_for_runs(
            done + slots + args.runs,
            timeout=120 + args.runs * args.steps * args.latency,
            label="runs",
            started=started,
        )
    committed = commits_after_flush() - before
    for worker in workers:
        worker.stop()
        bench.processes.remove(worker)
    total = args.runs * args.steps
    ideal = math.ceil(args.runs / slots) * args.steps * args.latency
    return [
        str(hosts),
        str(slots),
        output.secs(wall),
        f"{total / wall:.1f}",
        f"{committed / wall:.0f}",
        f"{committed / total:.1f}",
        output.times(wall / ideal),
        f"{cpu.busy:.0%}",
        f"{cpu.groups.get('workers', 0.0):.2f}",
        f"{cpu.groups.get('postgres', 0.0):.2f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument(
        "--hosts", default="1,2,3,4,6", help="worker host counts (default 1,2,3,4,6)"
    )
    parser.add_argument("--threads", type=int, default=16, help="threads per host (16)")
    parser.add_argument("--runs", type=int, default=300, help="runs per configuration (300)")
    parser.add_argument("--steps", type=int, default=5, help="steps a run (default 5)")
    parser.add_argument("--latency", type=float, default=0.5, help="model seconds (0.5)")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.hosts.split(",") if n.strip()]
    if (why := unavailable()) is not None:
        print(f"scale_out needs worker hosts: {why}", file=sys.stderr)
        return 2

    network = Network(max(counts)).up()
    services = Path(tempfile.mkdtemp(prefix="nsbench-scale-out-", dir="/tmp"))
    services.chmod(0o755)  # as root, postgres runs as a system user that must traverse it
    rows: list[list[str]] = []
    try:
        # PostgreSQL and Redis of its own, reachable from the hosts at the service address.
        urls = embedded.ensure_running(
            services, listen=[network.service_address], clients=[network.clients]
        )
        urls = size_connections(services, urls, network, max(counts), args.threads)
        model = MessagesSandbox(
            responder=agent_responder,
            latency_seconds=args.latency,
            log_path=services / "messages.jsonl",
        ).start(network.service_address)
        # The scratch database and Redis db go on these servers (scratch() reads the variables).
        os.environ["NIGHTSHIFT_DATABASE_URL"] = urls["postgres"]
        os.environ["NIGHTSHIFT_BROKER_URL"] = urls["redis"]
        try:
            with scratch.scratch(
                NAME, REDIS_DB, keep_logs=args.keep_logs, model_url=model.url
            ) as bench:
                here, there = "@127.0.0.1:", f"@{network.service_address}:"
                host_env = {
                    "NIGHTSHIFT_DATABASE_URL": bench.db_url.replace(here, there),
                    "NIGHTSHIFT_BROKER_URL": bench.broker_url.replace(here, there),
                    "NIGHTSHIFT_WORKER_CONCURRENCY": str(args.threads),  # the pool's size
                }
                # The tick, as in any deployment: a step that failed resumes once its lease
                # lapses instead of holding the batch until the timeout.
                bench.beat()
                rows = [measure(bench, network, n, args, host_env) for n in counts]
                machine = bench.machine()
        finally:
            model.stop()
    finally:
        embedded.stop(services)
        shutil.rmtree(services, ignore_errors=True)
        network.down()

    output.print_table(
        f"scale_out: {args.runs} runs x {args.steps} steps, model {args.latency:g} s, one worker "
        f"process x {args.threads} threads per host",
        ["hosts", "slots", "wall", "steps/s", "PG commits/s", "commits/step",
         "vs slot ideal", "machine CPU", "workers (cores)", "postgres (cores)"],
        rows,
    )  # fmt: skip
    base = float(rows[0][3])
    output.print_notes(
        machine,
        "speed-up over one host: "
        + ", ".join(f"{r[0]} hosts {float(r[3]) / base:.2f}x" for r in rows),
        "slot ideal = ceil(runs / slots) x steps x latency: what the slots could do if steps "
        "cost no CPU",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
