"""Driving the plain Celery baseline (bench/plain_celery.py, the app its workers run) from a
benchmark: its tables and broker, its workers, and its chains' hops."""

from __future__ import annotations

import itertools
import os
import sys

import plain_celery
from records import sql, wait_for_count
from scratch import Scratch

from pipeline.processes.celery_process import CeleryProcess


def prepare(bench: Scratch) -> None:
    """The baseline's tables in the scratch database, and its sends on the scratch broker."""
    os.environ["PLAIN_BROKER_URL"] = bench.broker_url
    plain_celery.configure(bench.broker_url)
    sql(plain_celery.CREATE_TABLE)
    sql(plain_celery.CREATE_RUNS_TABLE)
    sql(plain_celery.CREATE_BATCHES_TABLE)


class PlainProcess(CeleryProcess):
    """A worker of the plain baseline app (bench/plain_celery.py), prefork unless told, on its
    own queue. It logs only warnings, so it is ready once a warm-up chain went through."""

    cpu_group = "plain workers"

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


def plain_worker(
    bench: Scratch,
    name: str = "plain",
    *,
    concurrency: int = 1,
    pool: str = "prefork",
    model_url: str | None = None,
    model_seconds: float = 0,
) -> PlainProcess:
    """A plain baseline worker, ready once a warm-up chain of 20 hops ran; with
    `model_url`, its model hops ask the Messages API there; its durable hops' stand-in
    model takes `model_seconds`."""
    prepare(bench)
    env = {
        "PLAIN_DB_URL": plain_celery.libpq_url(bench.db_url),
        "PLAIN_MODEL_SECONDS": str(model_seconds),
    }
    if model_url:
        env["PLAIN_MODEL_URL"] = model_url
    process = PlainProcess(
        name=name,
        log_path=bench.log_dir / f"{name}.log",
        env=env,
        pool=pool,
        concurrency=concurrency,
    )
    bench.processes.append(process)
    process.start(wait=True)
    run_chain(f"warmup-{name}", 20, timeout=60)
    return process


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
