"""A rolling deploy during a night: what it costs and what it loses.

Two nights of `--children` nightly reports (each fetches its sources and sends one email to a
service that sends every request it gets, so a resend would be a second email) on three
workers. The first runs undisturbed (the baseline); during the second each worker in turn is
sent SIGTERM while it holds runs, waited for (its drain: a warm shutdown finishes its steps),
and replaced by a new process before the next goes. Printed: both walls, the drains, the
takeovers and re-sends the runs needed, failed runs and emails sent twice.

    python bench/rolling_deploy.py --children 1000
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from typing import Any

import output
import scratch
from sqlalchemy import text

from pipeline import BatchPlan
from pipeline.db import transaction
from pipeline.processes.celery_process import wait_for
from pipeline.registry import registry
from pipeline.runs.fanout import create_batch_txn
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings

NAME = "rolling_deploy"
REDIS_DB = 12


def night(children: int, label: str) -> str:
    plan = BatchPlan(
        f"{label}-{uuid.uuid4().hex[:8]}", "rolling", "nightly_report",
        [{"team": f"{label}-{n}", "date": "2026-11-29"} for n in range(children)],
        "bench_synthesis", {},
    )  # fmt: skip
    registry()
    with transaction() as session:
        create_batch_txn(session, plan)
    return plan.batch_id


def night_done(batch: str) -> bool:
    with transaction() as session:
        query = (
            "SELECT count(*) FROM runs WHERE (batch_id = :b OR id = (SELECT synthesis_run_id"
            " FROM batches WHERE id = :b)) AND status IN ('running', 'waiting')"
        )
        left = session.execute(text(query), {"b": batch}).scalar_one()
        started = session.execute(
            text("SELECT synthesis_run_id IS NOT NULL FROM batches WHERE id = :b"), {"b": batch}
        ).scalar_one()
    return bool(started and not left)


def outcome(batch: str) -> dict[str, Any]:
    runs = "(SELECT id FROM runs WHERE batch_id = :b)"
    queries = {
        "statuses": f"SELECT status::text, count(*) FROM runs WHERE id IN {runs} GROUP BY 1",
        "resumed": f"SELECT cause::text, count(*) FROM resumptions WHERE run_id IN {runs}"
        " GROUP BY 1",
        "failed": f"SELECT 'runs', count(*) FROM runs WHERE id IN {runs} AND failed_attempts > 0",
    }
    with transaction() as session:
        return {
            name: {str(k): int(v) for k, v in session.execute(text(query), {"b": batch}).all()}
            for name, query in queries.items()
        }


def leases_held_by(pid: int) -> int:
    with transaction() as session:
        query = (
            "SELECT count(*) FROM runs WHERE lease_expires_at > now()"
            " AND split_part(lease_owner, ':', 2) = :pid"
        )
        return int(session.execute(text(query), {"pid": str(pid)}).scalar_one())


def main() -> None:
    parser = output.parser(__doc__)
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    web, email = WebSandbox().start(), EmailSandbox(mode="no-keys-lookup").start()
    email.delay_seconds = 0.1
    os.environ |= {
        "NIGHTSHIFT_WEB_URL": web.url,
        "NIGHTSHIFT_EMAIL_URL": email.url,
        "NIGHTSHIFT_EMAIL_MODE": "lookup",
        "NIGHTSHIFT_SHIPPED_AGENTS": "nightly_report",
    }
    rows = []
    try:
        with scratch.scratch(NAME, REDIS_DB) as bench:
            get_settings.cache_clear()
            bench.beat()
            workers = [bench.worker(f"w{n}-1", concurrency=args.concurrency) for n in (1, 2, 3)]
            for label in ("baseline", "rolling"):
                sent_before = len(email.deliveries())
                started = time.monotonic()
                batch = night(args.children, label)
                drains = []
                if label == "rolling":
                    for n, old in enumerate(list(workers), start=1):

                        def busy(old: Any = old, batch: str = batch) -> bool:
                            return bool(leases_held_by(old.pid)) or night_done(batch)

                        wait_for(busy, timeout=120, interval=0.05, what=f"{old.name} busy")
                        if night_done(batch):
                            break  # the night ended first: the drains column says how far
                        told = time.monotonic()
                        old.stop()
                        drains.append(time.monotonic() - told)
                        workers.remove(old)
                        workers.append(bench.worker(f"w{n}-2", concurrency=args.concurrency))
                wait_for(lambda b=batch: night_done(b), timeout=3600, interval=1,
                         what=f"the {label} night")  # fmt: skip
                wall = time.monotonic() - started
                sent = Counter(d["key"] for d in email.deliveries()[sent_before:])
                ended = outcome(batch)
                rows.append([
                    label, output.secs(wall), " ".join(f"{d:.1f}" for d in drains) or "-",
                    ", ".join(f"{s} {n}" for s, n in ended["statuses"].items()),
                    sum(ended["resumed"].values()), ended["failed"]["runs"],
                    sum(1 for n in sent.values() if n > 1), f"{sum(sent.values())}/{len(sent)}",
                ])  # fmt: skip
            output.print_table(
                f"rolling_deploy: {args.children} children on 3 workers x {args.concurrency}",
                ["night", "wall", "drains (s)", "children", "takeovers+re-sends",
                 "failed attempts", "emailed twice", "emails/keys"],
                rows,
            )  # fmt: skip
            output.print_notes(bench.machine())
    finally:
        email.stop()
        web.stop()


if __name__ == "__main__":
    main()
