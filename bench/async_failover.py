"""What a PostgreSQL failover forgets with asynchronous replication, and what absorbs it.

A primary and an asynchronous standby (pipeline/chaos/postgres_pair.py), two workers and beat
on a URL naming both, a night of nightly reports (each sends one email under a key built from
what it means: `nightly_report:<date>:<team>`). Mid-night the primary's WAL sender is paused
for `--lag` seconds (the standby falls that far behind, as over a slow link or under load),
then the primary stops like a crash and the standby is promoted. Printed: the commits a probe
had acknowledged that the new primary lacks, the runs whose step went back (they redo it), the
emails sent whose action rows vanished, and at the end how many emails each key produced, with
an email service that honours keys (`--email keys`: the resend under the same key is answered
from its record, nothing sent twice) or one that does not (`--email no-keys`). The same with
`--synchronous`: nothing is forgotten.

    python bench/async_failover.py --lag 3 --email keys
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import output
import psutil
import scratch
from commit_probe import CommitProbe
from sqlalchemy import text

from pipeline.chaos.postgres_pair import PostgresPair
from pipeline.db import dispose_all, transaction
from pipeline.migrate import upgrade
from pipeline.processes.celery_process import wait_for
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings

NAME = "async_failover"
REDIS_DB = 13
DONE = ("succeeded", "failed", "cancelled", "needs_attention")


def steps() -> dict[str, int]:
    with transaction() as session:
        return {str(r.id): r.step for r in session.execute(text("SELECT id, step FROM runs"))}


def recorded_keys() -> set[str]:
    """The email keys the database has an action row for (in any state)."""
    with transaction() as session:
        query = "SELECT idempotency_key FROM actions WHERE service = 'email'"
        return set(session.scalars(text(query)))


def walsenders(pair: PostgresPair) -> list[psutil.Process]:
    found = pair.primary.find()
    assert found is not None
    children = psutil.Process(found[0]).children()
    return [p for p in children if "walsender" in " ".join(p.cmdline())]


def main() -> None:
    parser = output.parser(__doc__)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--lag", type=float, default=3.0, help="seconds the standby falls behind")
    parser.add_argument("--email", choices=("keys", "no-keys"), default="keys")
    parser.add_argument("--synchronous", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nightshift-async-failover-", dir="/tmp"))
    root.chmod(0o755)
    pair = PostgresPair(root, synchronous=args.synchronous).start()
    web, email = WebSandbox().start(), EmailSandbox(mode=args.email).start()
    email.delay_seconds = 0.3
    try:
        with scratch.scratch(NAME, REDIS_DB) as bench:
            upgrade(pair.url())
            os.environ |= {
                "NIGHTSHIFT_DATABASE_URL": pair.url(),
                "NIGHTSHIFT_WEB_URL": web.url,
                "NIGHTSHIFT_EMAIL_URL": email.url,
                "NIGHTSHIFT_EMAIL_MODE": "keys" if args.email == "keys" else "none",
                "NIGHTSHIFT_SHIPPED_AGENTS": "nightly_report",
                "NIGHTSHIFT_LEASE_SECONDS": "3",
                "NIGHTSHIFT_HEARTBEAT_SECONDS": "1",
                "NIGHTSHIFT_TICK_SECONDS": "1",
                "NIGHTSHIFT_HANDOFF_GRACE_SECONDS": "6",
            }
            os.environ.pop("ANTHROPIC_API_KEY", None)
            get_settings.cache_clear()
            dispose_all()
            bench.beat()
            for n in (1, 2):
                bench.worker(f"w{n}", concurrency=4)
            with CommitProbe(pair.url("postgres")) as probe:
                [
                    start_run("nightly_report", {"team": f"team-{n}", "date": "2026-11-29"})
                    for n in range(args.runs)
                ]
                wait_for(lambda: len(email.deliveries()) >= args.runs // 4, timeout=120,
                         what="a quarter of the emails")  # fmt: skip
                paused = walsenders(pair)
                for process in paused:
                    process.send_signal(signal.SIGSTOP)
                time.sleep(args.lag)
                before, sent_before = steps(), {d["key"] for d in email.deliveries()}
                failover = pair.fail_over()
                dispose_all()
                after, kept = steps(), recorded_keys()
                redone = [run for run, step in before.items() if after.get(run, -1) < step]
                vanished = sent_before - kept - {None}
                lost = {n for n, at in probe.acknowledged if at < failover.stopped_at}
                lost -= probe.kept()

                def finished() -> bool:
                    with transaction() as session:
                        query = "SELECT count(*) FROM runs WHERE status::text <> ALL(:done)"
                        return not session.execute(text(query), {"done": list(DONE)}).scalar_one()

                wait_for(finished, timeout=300, interval=1, what="every run to finish")
            with transaction() as session:
                query = "SELECT status::text, count(*) FROM runs GROUP BY 1"
                statuses = dict(session.execute(text(query)).all())
                query = "SELECT stop_reason, left(error, 200) FROM runs WHERE status = 'failed'"
                failures = [
                    f"failed: {reason}: {error}" for reason, error in session.execute(text(query))
                ]
            per_key = Counter(d["key"] for d in email.deliveries())
            output.print_table(
                f"async_failover: {args.runs} nightly reports, standby "
                f"{'synchronous' if args.synchronous else f'{args.lag:g} s behind'}, "
                f"email service {args.email}",
                ["what", "count"],
                [
                    ["commits acknowledged before the stop", len(
                        [n for n, at in probe.acknowledged if at < failover.stopped_at])],
                    ["  of which the new primary lacks", len(lost)],
                    ["runs whose step went back (redo it)", len(redone)],
                    ["emails sent whose action row vanished", len(vanished)],
                    ["keys emailed more than once at the end", sum(1 for n in per_key.values()
                                                                    if n > 1)],
                    ["emails sent / keys", f"{sum(per_key.values())} / {len(per_key)}"],
                    ["runs by status", ", ".join(f"{s} {n}" for s, n in statuses.items())],
                    ["promoted after the stop", f"{failover.seconds:.2f} s"],
                ],
            )  # fmt: skip
            output.print_notes(*failures, bench.machine())
    finally:
        email.stop()
        web.stop()
        dispose_all()
        pair.stop()


if __name__ == "__main__":
    main()
