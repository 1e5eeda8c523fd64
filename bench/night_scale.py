"""A night at scale: one nightly batch of 1,000 children, then one of 10,000, each a fan-out
plus a synthesis, against the floor measured in the same run.

nightshift's batch goes the way a night's does: a schedule's slot fired by hand (the schedule
path, as `nightshift schedules fire` does) asks the `bench` agent's job for a BatchPlan, the
real fan-out creates the batch and its children in one transaction and sends each child's
first step after the commit, and the last child to finish starts one `bench_synthesis` run
(the durable join). Each child is a bench run of `--steps` steps (the scripted model sleeping
`--latency` seconds in process, one local tool call a step); the synthesis takes one step.
P worker processes x T threads, and beat running the tick, as in a deployment.

The floor: plain Celery doing the same durable work by hand (bench/plain_celery.py): one chain
of `plain.batch_hop` durable hops a child, whose last hop counts the child done in the batch's
row (in its checkpoint's transaction) and, as the last child, sends one durable hop for the
synthesis. Same slots, broker and database, the floor first at each size.

Per size: enqueue time (from the fan-out starting until every child's first step is queued),
wall time (until the synthesis finished) and its ratio to the floor's, the workers' CPU a step,
how many syntheses ran, the steps the tick re-sent, the Redis memory peak (INFO used_memory,
sampled, above the level before) with the most messages queued, and the bytes the database
grew by per run. Then, with the database at `--reads-at` runs (older finished nights added by
SQL): how long `nightshift batches show`, the batch's status page and /metrics take on a real
`nightshift api` (bench/night_reads.py).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import baseline
import cpu_use
import night_reads
import output
import plain_celery
import psycopg
import records
import redis
import scratch

NAME = "night_scale"
REDIS_DB = 9
SCALE_TARGET = 1.05
"""The largest batch's wall within this much of (the smallest's x the size ratio): 10.5x for
10x the children."""


@dataclass
class Night:
    """One batch through one side (the floor or nightshift)."""

    children: int
    enqueue: float
    wall: float
    cpu_a_step: float
    redis_peak: int
    """Bytes: the most the side's queue and unacknowledged messages held at once."""
    server_growth: int
    """Bytes: the highest INFO used_memory sampled, less the level before (the whole server)."""
    queued_peak: int
    """The most step messages queued at once (LLEN of the side's queue)."""
    message_bytes: int
    message_footprint: float
    """Bytes Redis takes to keep one message queued."""
    db_bytes: dict[str, int]
    """Table (with its indexes and TOAST) -> bytes it grew by."""
    syntheses: int = 1
    resent: dict[str, int] = field(default_factory=dict)
    """Steps sent again (a `resumptions` row each), by cause and by who found the run: the
    tick (`no_message`, `lease_expired`) or a claim (`lease_expired`, claim)."""

    @property
    def resends(self) -> int:
        return sum(self.resent.values())

    def bytes_a_run(self) -> float:
        return sum(self.db_bytes.values()) / (self.children + 1)


class RedisUse:
    """Samples the broker every 0.1 s in a thread while open: the peak of what the night's own
    keys hold (its queue's list and kombu's `unacked` hash and index: the messages slots took
    and have not acknowledged yet, MEMORY USAGE), the peak of the whole server's INFO
    used_memory above the level at the start (other work on a shared server shows there too),
    the most messages queued on `queue`, and one message's size, as sent and as Redis keeps
    it in a list."""

    FOOTPRINT_COPIES = 1000

    def __init__(self, url: str, queue: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.queue = queue
        self.keys = [queue, "unacked", "unacked_index"]
        self.peak = self.server_peak = self.queued = self.message_bytes = 0
        self.message_footprint = 0.0
        self._message = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RedisUse:
        self.server_before = self._used()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._message:
            self.message_footprint = self._footprint(self._message)
        self.client.close()

    @property
    def server_growth(self) -> int:
        return max(0, self.server_peak - self.server_before)

    def _used(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def _held(self) -> int:
        return sum(int(self.client.memory_usage(key, samples=0) or 0) for key in self.keys)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.server_peak = max(self.server_peak, self._used())
            self.peak = max(self.peak, self._held())
            queued = int(self.client.llen(self.queue))
            self.queued = max(self.queued, queued)
            if queued and not self._message:
                oldest = self.client.lindex(self.queue, -1)
                self._message = oldest if isinstance(oldest, bytes) else b""
                self.message_bytes = len(self._message)

    def _footprint(self, message: bytes) -> float:
        """Bytes Redis takes to keep one such message in a list (its own bytes and the list's
        per-entry cost), from a scratch list of copies."""
        scratch_key = "nsbench:footprint"
        self.client.delete(scratch_key)
        self.client.lpush(scratch_key, *[message] * self.FOOTPRINT_COPIES)
        held = int(self.client.memory_usage(scratch_key, samples=0) or 0)
        self.client.delete(scratch_key)
        return held / self.FOOTPRINT_COPIES


def table_bytes() -> dict[str, int]:
    """Every table's size with its indexes and TOAST (pg_total_relation_size)."""
    rows = records.sql(
        "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables"
        " WHERE relname <> 'alembic_version'"
    )
    return {str(name): int(size) for name, size in rows}


def grown(before: dict[str, int], after: dict[str, int], plain: bool) -> dict[str, int]:
    """What each of one side's tables (the floor's plain_* ones, or nightshift's) grew by."""
    return {
        name: size - before.get(name, 0)
        for name, size in after.items()
        if name.startswith("plain_") == plain and size != before.get(name, 0)
    }


def paced(done: Callable[[], bool], count: Callable[[], int], total: int) -> Callable[[], int]:
    """A count cheap enough to poll every 50 ms (records.wait_for_count): `total` once the
    cheap `done()` says so, else the last `count()`, taken at most every 2 s."""
    last = [0, 0.0]

    def probe() -> int:
        if done():
            return total
        if time.monotonic() - last[1] >= 2.0:
            last[:] = [count(), time.monotonic()]
        return int(last[0])

    return probe


class Sides:
    """The workers of both sides and how each runs one batch."""

    def __init__(self, bench: scratch.Scratch, args: argparse.Namespace) -> None:
        self.bench = bench
        self.steps: int = args.steps
        self.latency: float = args.latency
        processes, threads = args.processes, args.threads
        output.log(f"starting {processes} plain worker(s), threads x{threads} each")
        self.plain = [
            baseline.plain_worker(
                bench, f"plain{i + 1}", concurrency=threads, pool="threads",
                model_seconds=self.latency,
            )
            for i in range(processes)
        ]  # fmt: skip
        output.log(f"starting {processes} worker(s), threads x{threads} each, and beat")
        self.workers = [bench.worker(f"w{i + 1}", concurrency=threads) for i in range(processes)]
        bench.beat()
        from pipeline.settings import get_settings

        self.queue = get_settings().queue

    def timeout(self, children: int) -> float:
        return 300 + children * self.steps * max(self.latency, 0.2)

    def floor(self, children: int, label: str) -> Night:
        batch = f"night-{label}"
        synthesis = plain_celery.synthesis_chain(batch)
        before = table_bytes()

        def finished() -> bool:
            rows = records.sql("SELECT step FROM plain_runs WHERE id = :id", id=synthesis)
            return bool(rows) and int(rows[0][0]) >= 1

        def children_done() -> int:
            rows = records.sql("SELECT unfinished FROM plain_batches WHERE id = :id", id=batch)
            return children - int(rows[0][0]) if rows else 0

        url = plain_celery.libpq_url(self.bench.db_url)
        with (
            psycopg.connect(url) as conn,
            RedisUse(self.bench.broker_url, plain_celery.QUEUE) as broker,
            cpu_use.CpuMeter(self.plain) as cpu,
        ):
            started = time.monotonic()
            plain_celery.start_batch(conn, batch, children, self.steps)
            enqueue = time.monotonic() - started
            wall = records.wait_for_count(
                paced(finished, children_done, children + 1), children + 1,
                timeout=self.timeout(children), label=f"floor {label}", started=started,
            )  # fmt: skip
        return Night(
            children, enqueue, wall, cpu.seconds.get("plain workers", 0.0) / self.hops(children),
            broker.peak, broker.server_growth, broker.queued, broker.message_bytes,
            broker.message_footprint,
            grown(before, table_bytes(), plain=True),
        )  # fmt: skip

    def night(self, children: int, label: str) -> Night:
        from pipeline.runs.schedules import fire
        from pipeline.slots import Missed, Overlap, Schedule

        schedule = Schedule(
            name=f"bench-night-{label}", agent="bench", minute="*",
            params={"children": children, "steps": self.steps, "model_seconds": self.latency},
            missed=Missed.SKIP, overlap=Overlap.ALLOW,
        )  # fmt: skip
        before, resent = table_bytes(), resumptions()
        batch: list[str] = []

        def finished() -> bool:
            rows = records.sql("SELECT status FROM batches WHERE id = :id", id=batch[0])
            if rows and rows[0][0] not in ("running", "synthesizing", "succeeded"):
                raise RuntimeError(f"batch {batch[0]} ended {rows[0][0]}")
            return bool(rows) and rows[0][0] == "succeeded"

        def children_done() -> int:
            return int(
                records.sql(
                    "SELECT count(*) FROM runs WHERE batch_id = :id"
                    " AND status IN ('succeeded', 'failed', 'cancelled')",
                    id=batch[0],
                )[0][0]
            )

        with (
            RedisUse(self.bench.broker_url, self.queue) as broker,
            cpu_use.CpuMeter(self.workers) as cpu,
        ):
            started = time.monotonic()
            decision = fire(schedule.name, now=datetime.now(UTC), schedules=[schedule])
            enqueue = time.monotonic() - started
            if decision.batch_id is None:
                raise RuntimeError(f"the slot started no batch: {decision.reason}")
            batch.append(decision.batch_id)
            wall = records.wait_for_count(
                paced(finished, children_done, children + 1), children + 1,
                timeout=self.timeout(children), label=f"nightshift {label}", started=started,
            )  # fmt: skip
        night = Night(
            children, enqueue, wall, cpu.seconds.get("workers", 0.0) / self.hops(children),
            broker.peak, broker.server_growth, broker.queued, broker.message_bytes,
            broker.message_footprint,
            grown(before, table_bytes(), plain=False),
            syntheses=check_batch(batch[0], children), resent=since(resent, resumptions()),
        )  # fmt: skip
        self.last_batch = batch[0]
        return night

    def hops(self, children: int) -> int:
        return children * self.steps + 1


def resumptions() -> dict[str, int]:
    """`resumptions` rows by cause, and by who found the run: a claim records the row it
    resumes itself (resumed in the same transaction), the tick leaves it open for the claim."""
    rows = records.sql(
        "SELECT cause || CASE WHEN resumed_at = created_at THEN ' (claim)' ELSE ' (tick)' END,"
        " count(*) FROM resumptions GROUP BY 1"
    )
    return {str(cause): int(count) for cause, count in rows}


def since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    grown = {cause: count - before.get(cause, 0) for cause, count in after.items()}
    return {cause: count for cause, count in grown.items() if count}


def check_batch(batch_id: str, children: int) -> int:
    """How many synthesis runs the batch has; fails unless every child succeeded and a
    synthesis counted them all."""
    succeeded = records.sql(
        "SELECT count(*) FROM runs WHERE batch_id = :id AND status = 'succeeded'", id=batch_id
    )[0][0]
    syntheses = records.sql(
        "SELECT result->>'text' FROM runs WHERE agent = 'bench_synthesis'"
        " AND input->>'batch' = :id",
        id=batch_id,
    )
    said = f"{children} children: {children} succeeded."
    if succeeded != children or [text for (text,) in syntheses] != [said]:
        raise RuntimeError(
            f"batch {batch_id}: {succeeded} of {children} children succeeded; "
            f"syntheses said {[text for (text,) in syntheses]}"
        )
    return len(syntheses)


def sizes(value: str) -> list[int]:
    """Comma-separated counts, each at least 1 (an argparse type)."""
    try:
        parsed = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        parsed = []
    if not parsed or min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"expected counts like 1000,10000, got {value!r}")
    return parsed


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--sizes", type=sizes, default=[1000, 10000], help="children (1000,10000)")
    parser.add_argument("--steps", type=int, default=2, help="steps a child (default 2)")
    parser.add_argument("--latency", type=float, default=0.5, help="model seconds (0.5)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=100, help="threads a worker (100)")
    parser.add_argument(
        "--reads-at", type=sizes, default=[10000, 100000],
        help="runs in the database when the reads are timed (10000,100000); more are added",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=5, help="timings of each read (5)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    floors: list[Night] = []
    ours: list[Night] = []
    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        sides = Sides(bench, args)
        slots = args.processes * args.threads
        output.log(f"warm-up: a batch of {slots} children each side")
        sides.floor(slots, "warmup")
        sides.night(slots, "warmup")
        for size in args.sizes:
            floors.append(sides.floor(size, str(size)))
            ours.append(sides.night(size, str(size)))
        reads = night_reads.measure(bench, sides.last_batch, args.reads_at, args.repeat)
    load_end = os.getloadavg()
    report(args, floors, ours, reads, bench, (load_start, load_end))
    return 0


def report(
    args: argparse.Namespace,
    floors: Sequence[Night],
    ours: Sequence[Night],
    reads: Sequence[night_reads.Reads],
    bench: scratch.Scratch,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> None:
    steps, latency = args.steps, args.latency
    processes, threads = args.processes, args.threads
    output.print_table(
        f"night_scale: a batch of N children x {steps} steps (model {latency:g} s in process)"
        f" and one synthesis, {processes} worker(s) x {threads} threads, beat running the tick",
        ["children", "floor enqueue", "floor wall", "nightshift enqueue", "nightshift wall",
         "ratio", "floor CPU a hop", "nightshift CPU a step", "syntheses", "re-sends"],
        [
            [f"{n.children:,}", output.secs(f.enqueue), output.secs(f.wall),
             output.secs(n.enqueue), output.secs(n.wall), output.times(n.wall / f.wall),
             output.ms(f.cpu_a_step), output.ms(n.cpu_a_step), n.syntheses, n.resends]
            for f, n in zip(floors, ours, strict=True)
        ],
    )  # fmt: skip
    slots = processes * threads
    output.print_table(
        "night_scale: what a batch holds in Redis at most (its queue and unacknowledged messages;"
        " the whole server's used_memory above the level before) and leaves in PostgreSQL",
        ["children", "floor Redis peak", "nightshift Redis peak", "bound", "server growth",
         "queued at most", "a message (kept as)", "floor DB bytes a chain",
         "nightshift DB bytes a run"],
        [
            [f"{n.children:,}", kib(f.redis_peak), kib(n.redis_peak),
             kib(redis_bound(n, slots)), kib(n.server_growth), f"{n.queued_peak:,}",
             f"{n.message_bytes:,} B ({n.message_footprint:,.0f} B)",
             f"{f.bytes_a_run():,.0f} B", f"{n.bytes_a_run():,.0f} B"]
            for f, n in zip(floors, ours, strict=True)
        ],
    )  # fmt: skip
    night_reads.print_reads(reads)
    notes = [
        bench.machine(),
        "load average (1, 5, 15 min) at the start "
        + " ".join(f"{v:.2f}" for v in loads[0])
        + ", at the end "
        + " ".join(f"{v:.2f}" for v in loads[1]),
        "enqueue = from the fan-out starting until every child's first step is queued; wall ="
        " from the fan-out starting until the synthesis finished; floor = plain Celery doing"
        " the same durable work by hand (plain.batch_hop chains, the join in PostgreSQL, one"
        " synthesis hop)",
        "Redis bound = (children + 1 + slots) x a message as Redis keeps it in a list (its"
        " bytes and the list's per-entry cost, measured on a scratch list of copies): each"
        " unfinished run has one step message, queued or held unacknowledged by a slot (the"
        " tick's re-sends add one each); the peak is what the queue and kombu's unacked hash"
        " and index held (MEMORY USAGE, sampled every 0.1 s): "
        + "; ".join(
            f"{n.children:,}: {kib(n.redis_peak)} of {kib(redis_bound(n, slots))} "
            + ("met" if n.redis_peak <= redis_bound(n, slots) else "MISSED")
            for n in ours
        ),
    ]
    notes += [
        f"re-sends at {n.children:,} children by cause: "
        + (", ".join(f"{cause} {count:,}" for cause, count in sorted(n.resent.items())) or "none")
        + f" ({n.resends / (n.children + 1):.2%} of the runs; target <= 1%)"
        for n in ours
    ]
    if len(ours) > 1:
        small, large = ours[0], ours[-1]
        size_ratio = large.children / small.children
        ratio = large.wall / small.wall
        floor_ratio = floors[-1].wall / floors[0].wall
        notes.append(
            f"{large.children:,} vs {small.children:,} children: wall {output.times(ratio)}"
            f" (the floor's {output.times(floor_ratio)}): "
            + output.verdict(ratio, SCALE_TARGET * size_ratio)
        )
    largest = ours[-1]
    top = sorted(largest.db_bytes.items(), key=lambda item: -item[1])[:5]
    notes.append(
        f"the {largest.children:,}-child batch grew the database by "
        + ", ".join(f"{name} {kib(size)}" for name, size in top)
    )
    notes += night_reads.verdicts(reads)
    output.print_notes(*notes)


def redis_bound(night: Night, slots: int) -> int:
    """Bytes the broker may hold for a batch: a step message (as a list keeps it) for each of
    its runs and for each slot's message taken but not yet acknowledged."""
    return round((night.children + 1 + slots) * night.message_footprint)


def kib(size: float) -> str:
    return f"{size / 1024:,.0f} KiB"


if __name__ == "__main__":
    raise SystemExit(main())
