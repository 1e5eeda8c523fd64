"""Where the CPU went while a benchmark measured: the whole machine by group (workers, plain
workers, PostgreSQL, Redis, this process, the rest), and a set of workers' own seconds."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence

import psutil
from output import ms
from records import db_sessions

from pipeline.processes.celery_process import CeleryProcess


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
            group = getattr(worker, "cpu_group", "workers")
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
