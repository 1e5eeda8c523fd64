"""What every benchmark shares: a scratch database and Redis db, real worker processes,
run and journal queries, percentiles, progress lines and the result table.

A benchmark never touches real data: it creates `nsbench_<name>` next to the configured (or
embedded) database, migrates it, points its workers at it and a Redis db of its own, and
drops and flushes both at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import itertools
import math
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import plain_celery
import psutil
import psycopg
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from pipeline.cli.format import progress_bar, table
from pipeline.local.processes import CeleryProcess, wait_for
from pipeline.sandbox.messages_api import MessagesSandbox

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
AGENT = "bench"


# -- arguments and output ---------------------------------------------------------------------


def parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(description or "").strip())
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs (kept anyway on failure)"
    )
    return parser


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the figures."""
    print(f"  .. {message}", file=sys.stderr, flush=True)


class Progress:
    """A progress line at most every `every` seconds (and at the end)."""

    def __init__(
        self, label: str, total: int, every: float = 2.0, started: float | None = None
    ) -> None:
        self.label, self.total, self.every = label, total, every
        self.started = time.monotonic() if started is None else started
        self._last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last >= self.every or done >= self.total:
            self._last = now
            elapsed = now - self.started
            log(f"{self.label} {progress_bar(done, self.total)} {elapsed:.1f}s")


class CpuMeter:
    """How busy the whole machine was between enter and exit, and who was busy: the workers,
    PostgreSQL, Redis, this process (and the sandbox server in it), everything else.
    Figures are in cores: 1.0 means one core busy for the whole time. Also counts the
    database connections opened meanwhile (a server process each, whose CPU a short-lived
    one takes with it when it exits: this meter cannot see exited processes)."""

    def __init__(self, workers: Sequence[CeleryProcess] = ()) -> None:
        self._workers = workers
        self.seconds: dict[str, float] = {}
        """CPU seconds (user + system) each group used meanwhile."""

    def __enter__(self) -> CpuMeter:
        self._started = time.monotonic()
        self._start_total = psutil.cpu_times()
        self._start_procs = self._by_process()
        self._start_sessions = db_sessions()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = self.wall = time.monotonic() - self._started
        end = psutil.cpu_times()
        spent = {
            name: getattr(end, name) - getattr(self._start_total, name) for name in end._fields
        }
        total = sum(spent.values())
        idle = spent.get("idle", 0.0) + spent.get("iowait", 0.0)
        self.busy = (total - idle) / total if total > 0 else 0.0
        self.connections = db_sessions() - self._start_sessions
        for pid, (group, used) in self._by_process().items():
            before = self._start_procs.get(pid, (group, 0.0))[1]
            self.seconds[group] = self.seconds.get(group, 0.0) + used - before
        self.groups = {group: used / max(wall, 1e-9) for group, used in self.seconds.items()}

    def _by_process(self) -> dict[int, tuple[str, float]]:
        workers: dict[int, str] = {}
        for worker in self._workers:
            group = "plain workers" if isinstance(worker, PlainProcess) else "workers"
            workers.update(dict.fromkeys(tree_pids(worker), group))
        found: dict[int, tuple[str, float]] = {}
        for process in psutil.process_iter(["name", "cpu_times"]):
            times = process.info["cpu_times"]
            if times is None:
                continue
            name = process.info["name"] or ""
            if process.pid in workers:
                group = workers[process.pid]
            elif process.pid == os.getpid():
                group = "bench process"
            elif name.startswith(("postgres", "postmaster")):
                group = "postgres"
            elif name.startswith("redis"):
                group = "redis"
            else:
                group = "other"
            found[process.pid] = (group, times.user + times.system)
        return found

    def describe(self) -> str:
        return f"{self.busy:.0%} of {psutil.cpu_count()} cores busy"

    def per_task(self, tasks: int) -> str:
        """Machine CPU time per task (all processes): what bounds throughput when CPU-bound."""
        spent = self.busy * (psutil.cpu_count() or 1) * self.wall
        return ms(spent / max(tasks, 1))

    def worker_per_task(self, tasks: int, group: str = "workers") -> str:
        """CPU (user + system) of nightshift's workers, or with group="plain workers" of the
        plain baseline's, pool children included, per task."""
        return ms(self.seconds.get(group, 0.0) / max(tasks, 1))

    def breakdown(self) -> str:
        order = sorted(self.groups.items(), key=lambda item: -item[1])
        cores = ", ".join(f"{group} {cores:.2f}" for group, cores in order if cores >= 0.005)
        return f"{cores}; {self.connections} new database connections"


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), interpolating between the two nearest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:.2f} s"


def times(ratio: float) -> str:
    return f"{ratio:.2f}x"


def verdict(ratio: float, target: float) -> str:
    """Whether `ratio` is within `target` (lower is better)."""
    return f"{'met' if ratio <= target else 'MISSED'} (target <= {target:g}x)"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(f"\n{title}")
    print(table(rows, headers), flush=True)


def print_notes(*notes: str) -> None:
    for note in notes:
        print(f"  - {note}")
    sys.stdout.flush()


# -- services ---------------------------------------------------------------------------------


def configured_urls() -> tuple[str, str]:
    """The database and broker the runtime would use: configured, else the embedded default."""
    from pipeline.db import broker_url, database_url
    from pipeline.settings import Settings

    settings = Settings.from_env()
    return database_url(settings), broker_url(settings)


def _with_redis_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def _admin_conninfo(db_url: str) -> str:
    url = make_url(db_url).set(drivername="postgresql", database="postgres")
    return url.render_as_string(hide_password=False)


def _drop_database(db_url: str, name: str) -> None:
    with psycopg.connect(_admin_conninfo(db_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class BenchProcess(CeleryProcess):
    """A nightshift worker as the benchmarks start it."""

    def argv(self) -> list[str]:
        # Celery takes `--pool=prefork` for "no --pool given" and uses the configured
        # worker_pool instead; `processes` is its alias that really means prefork.
        return ["--pool=processes" if arg == "--pool=prefork" else arg for arg in super().argv()]


class PlainProcess(CeleryProcess):
    """A worker of the plain baseline app (bench/plain_celery.py), prefork unless told, on its
    own queue. It logs only warnings, so it is ready once a warm-up chain went through."""

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "plain_celery", "worker", "-n", self.nodename,
            "--loglevel=WARNING", f"--pool={self.pool}", f"--concurrency={self.concurrency}",
            "-Q", plain_celery.QUEUE, "--without-mingle", "--without-gossip",
            "--without-heartbeat",
        ]  # fmt: skip

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited early:\n{self.log()[-3000:]}")
        return True


def tree_pids(process: CeleryProcess) -> set[int]:
    """A live worker's pid and its pool children's."""
    if process.process is None or process.process.poll() is not None:
        return set()
    pids = {process.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(c.pid for c in psutil.Process(process.pid).children(recursive=True))
    return pids


def cpu_seconds(processes: Sequence[CeleryProcess]) -> float:
    """User + system CPU seconds used so far by these workers and their pool children."""
    total = 0.0
    for process in processes:
        for pid in tree_pids(process):
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
    return total


@dataclass
class Scratch:
    """One benchmark's scratch database, Redis db, log directory and the processes it started."""

    name: str
    db_url: str
    broker_url: str
    log_dir: Path
    processes: list[CeleryProcess] = field(default_factory=list)
    load_at_start: float = field(default_factory=lambda: os.getloadavg()[0])

    def machine(self) -> str:
        """A note for the figures: the cores and how loaded the machine was at the start."""
        return (
            f"machine: {psutil.cpu_count()} cores, load average {self.load_at_start:.1f} at the "
            "start (above half the cores: other work ran too, the figures are noisy)"
        )

    def worker(
        self,
        name: str,
        *,
        pool: str = "threads",
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        wait: bool = True,
        wrap: list[str] | None = None,
    ) -> CeleryProcess:
        """`wrap`: run it under that argv prefix (a worker host's, bench/scale_out.py)."""
        process = BenchProcess(
            name=name,
            log_path=self.log_dir / f"{name}.log",
            env=env or {},
            pool=pool,
            concurrency=concurrency,
            wrap=wrap or [],
        )
        self.processes.append(process)
        return process.start(wait=wait)

    def plain_worker(
        self,
        name: str = "plain",
        *,
        concurrency: int = 1,
        pool: str = "prefork",
        model_url: str | None = None,
    ) -> PlainProcess:
        """A plain baseline worker, ready once a warm-up chain of 20 hops ran; with
        `model_url`, its model hops ask the Messages API there."""
        env = {"PLAIN_DB_URL": plain_celery.libpq_url(self.db_url)}
        if model_url:
            env["PLAIN_MODEL_URL"] = model_url
        process = PlainProcess(
            name=name,
            log_path=self.log_dir / f"{name}.log",
            env=env,
            pool=pool,
            concurrency=concurrency,
        )
        self.processes.append(process)
        process.start(wait=True)
        run_chain(f"warmup-{name}", 20, timeout=60)
        return process

    def beat(self, env: dict[str, str] | None = None) -> CeleryProcess:
        process = CeleryProcess(
            name="beat",
            log_path=self.log_dir / f"beat-{len(self.processes)}.log",
            env=env or {},
            beat=True,
        )
        self.processes.append(process)
        return process.start()

    def stop_all(self) -> None:
        for process in self.processes:
            process.stop()
        self.processes.clear()

    def flush_broker(self) -> None:
        client = redis.Redis.from_url(self.broker_url)
        try:
            client.flushdb()
        finally:
            client.close()


@contextmanager
def scratch(
    name: str,
    redis_db: int,
    *,
    keep_logs: bool = False,
    model_url: str | None = None,
) -> Iterator[Scratch]:
    """A migrated scratch database `nsbench_<name>` and Redis db `redis_db`, used by this process
    and every worker it starts; both are dropped/flushed at the end.

    With `model_url`, workers call the Messages API there through the real SDK (a dummy key);
    without it they use the scripted model, whatever ANTHROPIC_API_KEY says.
    """
    from pipeline.db import dispose_all
    from pipeline.migrate import upgrade
    from pipeline.settings import get_settings

    base_db, base_broker = configured_urls()
    # Two benchmarks on one server at once (other people's too) each need their own.
    redis_db = int(os.environ.get("NSBENCH_REDIS_DB") or redis_db)
    db_name = f"nsbench_{name}{os.environ.get('NSBENCH_DB_SUFFIX', '')}"
    db_url = make_url(base_db).set(database=db_name).render_as_string(hide_password=False)
    bench = Scratch(
        name=name,
        db_url=db_url,
        broker_url=_with_redis_db(base_broker, redis_db),
        log_dir=Path(tempfile.mkdtemp(prefix=f"nsbench-{name}-")),
    )
    log(f"scratch database {db_name}, broker db {redis_db}, logs in {bench.log_dir}")
    if bench.load_at_start > (psutil.cpu_count() or 1) / 2:
        log(f"load average {bench.load_at_start:.1f}: other work is running, figures will vary")
    _drop_database(base_db, db_name)  # left over from an interrupted run
    with psycopg.connect(_admin_conninfo(base_db), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    upgrade(db_url)

    # Before anything imports celeryconfig: the app reads the environment once.
    os.environ["NIGHTSHIFT_DATABASE_URL"] = db_url
    os.environ["NIGHTSHIFT_BROKER_URL"] = bench.broker_url
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BENCH_DIR), str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    os.environ["PLAIN_BROKER_URL"] = bench.broker_url
    plain_celery.configure(bench.broker_url)
    if model_url is None:
        os.environ.pop("ANTHROPIC_API_KEY", None)
        os.environ.pop("ANTHROPIC_BASE_URL", None)
    else:
        os.environ["ANTHROPIC_API_KEY"] = "bench-dummy-key"
        os.environ["ANTHROPIC_BASE_URL"] = model_url
    get_settings.cache_clear()
    dispose_all()
    bench.flush_broker()
    failed = True
    try:
        sql(plain_celery.CREATE_TABLE)
        yield bench
        failed = False
    finally:
        bench.stop_all()
        dispose_all()
        _drop_database(base_db, db_name)
        bench.flush_broker()
        if failed or keep_logs:
            print(f"worker logs kept in {bench.log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(bench.log_dir, ignore_errors=True)


@contextmanager
def model_server(latency: float) -> Iterator[MessagesSandbox]:
    """The local Messages API server answering as the bench agent, `latency` seconds a call;
    pass its `url` to `scratch(model_url=...)` so workers reach it through the real SDK."""
    from pipeline.sandbox.responders import agent_responder

    with tempfile.TemporaryDirectory(prefix="nsbench-model-") as log_dir:
        server = MessagesSandbox(
            responder=agent_responder,
            latency_seconds=latency,
            log_path=Path(log_dir) / "messages.jsonl",
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()


# -- runs, journal, hops ----------------------------------------------------------------------


def sql(statement: str, **params: Any) -> list[Any]:
    from pipeline.db import transaction

    with transaction() as session:
        result = session.execute(text(statement), params)
        return list(result) if result.returns_rows else []


def create_runs(count: int, steps: int, label: str = "") -> tuple[list[uuid.UUID], float]:
    """Create `count` bench runs in one transaction, whose commit sends each its first step
    (create_run_txn does, once per run). Returns the ids and the time.monotonic() of the
    commit, just before the first send: where a benchmark's clock starts."""
    from pipeline.db import after_commit, transaction
    from pipeline.runs.start import create_run_txn

    run_input: dict[str, Any] = {"steps": steps, "label": label} if label else {"steps": steps}
    committed: list[float] = []
    with transaction() as session:
        # Registered first, so it runs after the commit and before the sends.
        after_commit(session, lambda: committed.append(time.monotonic()))
        run_ids = [create_run_txn(session, AGENT, run_input).run_id for _ in range(count)]
    return run_ids, committed[0]


def run_counts() -> tuple[int, int]:
    """(terminal runs, failed or cancelled runs) in the scratch database."""
    row = sql(
        "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'cancelled')),"
        " count(*) FILTER (WHERE status IN ('failed', 'cancelled')) FROM runs"
    )[0]
    return int(row[0]), int(row[1])


def wait_for_count(
    count: Callable[[], int],
    total: int,
    *,
    timeout: float,
    label: str,
    started: float | None = None,
) -> float:
    """Block until count() reaches `total`, with progress lines; the seconds it took since
    `started` (a time.monotonic() value; default: now)."""
    progress = Progress(label, total, started=started)

    def probe() -> bool:
        done = count()
        progress.update(done)
        return done >= total

    wait_for(probe, timeout=timeout, what=f"{label}: {total}", interval=0.05)
    return time.monotonic() - progress.started


def wait_for_runs(total: int, *, timeout: float, label: str, started: float | None = None) -> float:
    """Block until `total` runs are terminal; fail if any did not succeed. The seconds it took."""
    took = wait_for_count(
        lambda: run_counts()[0], total, timeout=timeout, label=label, started=started
    )
    _, failed = run_counts()
    if failed:
        errors = sql("SELECT stop_reason, error FROM runs WHERE status <> 'succeeded' LIMIT 3")
        raise RuntimeError(f"{failed} run(s) did not succeed, e.g. {errors}")
    return took


def db_sessions() -> int:
    """Connections ever opened to the scratch database (PostgreSQL 14+; -1 if unknown).
    Each one forks a server process: a pool that keeps reconnecting shows up here."""
    try:
        rows = sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    except Exception:  # an older server: the column is missing
        return -1
    return int(rows[0][0]) if rows else -1


def step_times(run_id: uuid.UUID) -> list[tuple[int, float]]:
    """(step, when its model reply was journaled, epoch seconds), in step order."""
    rows = sql(
        "SELECT step, extract(epoch FROM created_at) FROM journal"
        " WHERE run_id = :run_id AND key LIKE 'model:%' ORDER BY step",
        run_id=run_id,
    )
    return [(int(step), float(at)) for step, at in rows]


def step_intervals(run_id: uuid.UUID) -> dict[int, float]:
    """Step k -> seconds from step k-1's journaled model reply to step k's: one full cycle of
    tool call, journal writes, checkpoint, hand-off through the broker, claim, load and model.
    """
    stamps = step_times(run_id)
    return {b[0]: b[1] - a[1] for a, b in itertools.pairwise(stamps)}


def hop_intervals(chain: str) -> list[float]:
    """Seconds between consecutive commits of one baseline chain."""
    rows = sql(
        "SELECT extract(epoch FROM created_at) FROM plain_hops WHERE chain = :chain ORDER BY hop",
        chain=chain,
    )
    stamps = [float(r[0]) for r in rows]
    return [b - a for a, b in itertools.pairwise(stamps)]


def hop_count(chain: str | None = None) -> int:
    """Hops committed by one chain, or by all chains."""
    if chain is None:
        return int(sql("SELECT count(*) FROM plain_hops")[0][0])
    return int(sql("SELECT count(*) FROM plain_hops WHERE chain = :chain", chain=chain)[0][0])


def start_chain(chain: str, length: int, *, model: bool = False) -> None:
    """Send a baseline chain's first hop (a model hop with `model`) to the plain workers."""
    plain_celery.start_chain(chain, length, model=model)


def run_chain(chain: str, length: int, *, timeout: float) -> list[float]:
    """Run one baseline chain of `length` hops to the end; its hop intervals."""
    start_chain(chain, length)
    wait_for_count(lambda: hop_count(chain), length, timeout=timeout, label=f"chain {chain}")
    return hop_intervals(chain)


# -- profiling the engine in-process ----------------------------------------------------------

PROFILED_STEPS = 5

# Phases of one step: (label, file suffix, function), cumulative time, nested as indented.
PHASES = [
    ("whole step (execute_step)", "pipeline/engine/step.py", "execute_step"),
    ("  claim", "pipeline/engine/leases.py", "claim_txn"),
    ("  load run + journal (_load_txn)", "pipeline/engine/step.py", "_load_txn"),
    ("    of which Journal.load_txn", "pipeline/engine/journal.py", "load_txn"),
    ("  rebuild messages (Journal.messages)", "pipeline/engine/journal.py", "messages"),
    ("  cancel/deadline/budget checks (all)", "pipeline/engine/step.py", "_keep_going"),
    ("  model call + its check + journal write", "pipeline/engine/step.py", "_model_reply"),
    ("    of which the scripted model", "pipeline/engine/llm.py", "reply"),
    ("  tool call + journal write", "pipeline/engine/toolcalls.py", "run_tool_call"),
    ("  checkpoint", "pipeline/engine/step.py", "_checkpoint"),
]
# Counted per step (calls by the profiled thread; the heartbeat thread is not profiled).
COUNTS = [
    ("SQL statements", "sqlalchemy/engine/base.py", "_execute_context"),
    ("pool pre-ping round trips", "postgresql/_psycopg_common.py", "do_ping"),
    ("commits (transactions)", "psycopg/connection.py", "commit"),
]


def profile_steps(run_id: uuid.UUID, steps: int = PROFILED_STEPS) -> pstats.Stats:
    """cProfile `steps` steps of `run_id` run in this process (no Celery, scripted model),
    after one unprofiled step that warms connections and caches."""
    from pipeline.engine.step import Outcome, execute_step

    execute_step(run_id, "bench:warm-up")
    profiler = cProfile.Profile()
    for _ in range(steps):
        profiler.enable()
        result = execute_step(run_id, "bench:profile")
        profiler.disable()
        if result.outcome is not Outcome.CONTINUE:
            raise RuntimeError(f"profiled step of run {run_id} ended with {result.outcome}")
    return pstats.Stats(profiler)


def _entries(stats: pstats.Stats, suffix: str, function: str) -> list[tuple[int, float]]:
    raw = stats.stats  # type: ignore[attr-defined]
    return [
        (row[1], row[3])
        for (path, _, name), row in raw.items()
        if name == function and path.endswith(suffix)
    ]


def phase_rows(profiles: Sequence[pstats.Stats], *, growth: bool = False) -> list[list[str]]:
    """One row per phase (ms per step) and per count, a column per profile."""
    rows = []
    for label, suffix, function in PHASES:
        each = [sum(t for _, t in _entries(p, suffix, function)) / PROFILED_STEPS for p in profiles]
        extra = [ms(each[-1] - each[0])] if growth else []
        rows.append([label, *map(ms, each), *extra])
    for label, suffix, function in COUNTS:
        each = [sum(n for n, _ in _entries(p, suffix, function)) / PROFILED_STEPS for p in profiles]
        rows.append([label, *(f"{n:g}" for n in each), *([""] if growth else [])])
    return rows


def top_functions(stats: pstats.Stats, count: int) -> list[list[str]]:
    """The functions with the most own time, per step."""
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(raw.items(), key=lambda item: -item[1][2])[:count]
    return [
        [
            f"{Path(path).name}:{line} {name}",
            f"{row[1] / PROFILED_STEPS:g}",
            ms(row[2] / PROFILED_STEPS),
        ]
        for (path, line, name), row in rows
    ]
