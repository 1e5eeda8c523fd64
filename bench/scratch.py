"""A benchmark's scratch services: it never touches real data. It creates `nsbench_<name>` next
to the configured (or embedded) database, migrates it, points its workers at it and a Redis db
of its own, and drops and flushes both at the end; and the local Messages API server."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import redis
from output import log
from sqlalchemy.engine import make_url

from pipeline.processes.celery_process import CeleryProcess
from pipeline.sandbox.messages_api import MessagesSandbox

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
BENCH_AGENTS = "bench.agents:AGENT,bench.agents:SYNTHESIS"
"""The benchmark agents (bench/agents.py): registered for a benchmark's own processes only,
never as a production entry point."""


def configured_urls() -> tuple[str, str]:
    """The database and broker the runtime would use: configured, else the embedded default."""
    from pipeline.db import broker_url, database_url
    from pipeline.settings import Settings

    settings = Settings.from_env()
    return database_url(settings), broker_url(settings)


def _with_redis_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


class BenchProcess(CeleryProcess):
    """A nightshift worker as the benchmarks start it."""

    def argv(self) -> list[str]:
        # Celery takes `--pool=prefork` for "no --pool given" and uses the configured
        # worker_pool instead; `processes` is its alias that really means prefork.
        return ["--pool=processes" if arg == "--pool=prefork" else arg for arg in super().argv()]


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
    from pipeline.migrate import fresh_database, upgrade
    from pipeline.registry import registry
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
    with fresh_database(db_url):
        upgrade(db_url)
        # Before anything imports celeryconfig: the app reads the environment once.
        os.environ["NIGHTSHIFT_DATABASE_URL"] = db_url
        os.environ["NIGHTSHIFT_BROKER_URL"] = bench.broker_url
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(BENCH_DIR), str(REPO), os.environ.get("PYTHONPATH")) if p
        )
        os.environ["NIGHTSHIFT_AGENTS"] = ",".join(
            p for p in (os.environ.get("NIGHTSHIFT_AGENTS"), BENCH_AGENTS) if p
        )
        if str(REPO) not in sys.path:  # this process runs steps and checks agents too
            sys.path.append(str(REPO))
        if model_url is None:
            os.environ.pop("ANTHROPIC_API_KEY", None)
            os.environ.pop("ANTHROPIC_BASE_URL", None)
        else:
            os.environ["ANTHROPIC_API_KEY"] = "bench-dummy-key"
            os.environ["ANTHROPIC_BASE_URL"] = model_url
        get_settings.cache_clear()
        registry.cache_clear()
        dispose_all()
        bench.flush_broker()
        failed = True
        try:
            yield bench
            failed = False
        finally:
            bench.stop_all()
            dispose_all()
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
