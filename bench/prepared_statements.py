"""What server-side prepared statements save on a step: the engine's step in this process (no
Celery, scripted model), in rounds that alternate a connection pool that prepares (as on a
connection that is PostgreSQL's own session: pipeline.db.PREPARE_THRESHOLD) with one that
prepares nothing (as behind a transaction pooler).
Per step: wall time, this process's CPU, and the CPU of the PostgreSQL backends serving the
scratch database (read from /proc: PostgreSQL on this machine only).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import output
import psycopg
import records
import scratch

NAME = "prepared_statements"
REDIS_DB = 4
_TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(db_url: str) -> float | None:
    """CPU seconds so far of the PostgreSQL backends connected to the scratch database."""
    from pipeline.db import conninfo
    from pipeline.settings import Settings

    settings = Settings.from_env({**os.environ, "NIGHTSHIFT_DATABASE_URL": db_url})
    with psycopg.connect(conninfo(settings), autocommit=True) as connection:
        pids = [
            row[0]
            for row in connection.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ]
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None  # not on this machine
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def one_round(
    db_url: str, threshold: int | None, steps: int, label: str
) -> tuple[float, float, float]:
    """(wall, this process's CPU, the backends' CPU or nan) seconds a step, `steps` steps."""
    import pipeline.db as db
    from pipeline.engine.step import execute_step

    db.PREPARE_THRESHOLD = threshold  # read as each new connection finds no pooler
    db.dispose_all()
    (run_id,), _ = records.create_runs(1, steps + 15, label)
    for _ in range(10):
        execute_step(run_id, f"bench:{label}")
    server_before = backend_cpu(db_url)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        execute_step(run_id, f"bench:{label}")
    wall, own = time.perf_counter() - started, time.process_time() - cpu
    server_after = backend_cpu(db_url)
    server = (
        (server_after - server_before) / steps
        if server_before is not None and server_after is not None
        else float("nan")
    )
    return wall / steps, own / steps, server


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--steps", type=int, default=100, help="timed steps a round (100)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each kind (8)")
    args = parser.parse_args(argv)
    import pipeline.db as db

    kinds = {"prepared": db.PREPARE_THRESHOLD, "not prepared": None}
    figures: dict[str, list[tuple[float, ...]]] = {kind: [] for kind in kinds}
    load_start = os.getloadavg()
    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        for round_ in range(args.rounds):
            order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
            for kind in order:
                label = f"{kind.replace(' ', '-')}-{round_}"
                figures[kind].append(one_round(bench.db_url, kinds[kind], args.steps, label))
            output.log(f"round {round_ + 1} of {args.rounds}")
    load_end = os.getloadavg()
    rows = [
        [kind, *(output.ms(statistics.median(f[i] for f in figures[kind])) for i in range(3))]
        for kind in kinds
    ]
    output.print_table(
        f"prepared_statements: the engine's step in this process, {args.rounds} alternating"
        f" rounds of {args.steps} steps each way; medians a step",
        ["", "wall", "this process's CPU", "PostgreSQL's CPU"],
        rows,
    )
    output.print_notes(
        bench.machine(),
        f"load average (1, 5, 15 min) at the start {' '.join(f'{v:.2f}' for v in load_start)},"
        f" at the end {' '.join(f'{v:.2f}' for v in load_end)}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
