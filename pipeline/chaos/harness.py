"""`nightshift chaos`: a mixed workload on real workers while faults are injected, then a check
from the database and the sandbox delivery logs that every run finished and every side effect
happened once.

Threads: the workload (starts runs, approves them later), the injector (the seeded fault
schedule), the sampler (polls the runs table: progress, and the first claim after each fault)
and the main thread (the supervisor that replaces dead workers, and progress lines).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from pipeline.chaos.approvals import Approvals
from pipeline.chaos.cluster import LEASE_SECONDS, Cluster
from pipeline.chaos.common import TRANSIENT
from pipeline.chaos.faults import FaultKind, default_weights, parse_weights, registered
from pipeline.chaos.hosts import unavailable
from pipeline.chaos.injector import Injector
from pipeline.chaos.plan import plan_faults, schedule_hash, write_fault_log, write_schedule
from pipeline.chaos.report import ChaosReport, deliveries, verify
from pipeline.chaos.workload import Workload
from pipeline.db import transaction
from pipeline.errors import NightshiftError
from pipeline.runs.decisions import Actor, decide

DEFAULT_RATE = 24.0
"""Faults a minute: 240 in the default ten minutes."""
ACTIVE = ("running", "waiting", "needs_attention")


@dataclass(frozen=True)
class ChaosConfig:
    duration: float = 600.0
    seed: int = 0
    workers: int = 3
    hosts: int = 0
    """Worker hosts (network namespaces) the workers are spread over; 0: this machine's own
    network, and no partitions."""
    weights: dict[str, float] = field(default_factory=lambda: parse_weights(default_weights()))
    rate: float = DEFAULT_RATE
    settle_seconds: float | None = None
    """Default: a third of the duration, between 60 and 180 seconds."""
    keep: bool = False
    """Keep the PostgreSQL and Redis data (logs are always kept)."""

    @property
    def settle_timeout(self) -> float:
        return self.settle_seconds or min(180.0, max(60.0, self.duration / 3))

    def planned_weights(self) -> dict[str, float]:
        """Partitions need worker hosts: without them their weight is 0."""
        kinds = registered()
        return {
            k: 0.0 if kinds[k].needs_hosts and not self.hosts else w
            for k, w in self.weights.items()
        }


def _partitions() -> list[FaultKind]:
    return [kind for kind in registered().values() if kind.needs_hosts]


def default_hosts() -> int:
    """Three worker hosts where network namespaces can be made (root), else none."""
    return 0 if unavailable() else 3


# -- the sampler ----------------------------------------------------------------------------


@dataclass
class Watch:
    run_id: uuid.UUID
    fence: int
    kind: str
    started: float
    """time.monotonic() when the fault began."""


class Sampler:
    """Polls the runs table every 0.2 s: which runs are active, when each last moved, and the
    first claim (a higher fence) after each fault that took a run away from its worker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[uuid.UUID, tuple[str, int, int]] = {}
        """Active (and watched) runs: id -> (status, step, fence)."""
        self.moved: dict[uuid.UUID, float] = {}
        self.watches: list[Watch] = []
        self.resumed: list[tuple[str, float]] = []
        """(fault kind, seconds from the fault to the run's next claim)."""
        self.interrupted: set[uuid.UUID] = set()
        self.send_windows: list[SendWindow] = []
        self.stopping = threading.Event()

    def watch(self, runs: list[tuple[uuid.UUID, int]], kind: str, started: float) -> None:
        with self.lock:
            for run_id, fence in runs:
                self.watches.append(Watch(run_id, fence, kind, started))
                self.interrupted.add(run_id)

    def watch_sends(self, kind: str, service: str, started: float, seconds: float) -> None:
        """Watch every run whose send to `service` is in flight within the window."""
        with self.lock:
            self.send_windows.append(SendWindow(kind, service, started, started + seconds))

    def running_fences(self) -> list[tuple[uuid.UUID, int]]:
        with self.lock:
            return [(run, f) for run, (status, _, f) in self.rows.items() if status == "running"]

    def running(self) -> list[uuid.UUID]:
        with self.lock:
            return [run for run, (status, _, _) in self.rows.items() if status == "running"]

    def active_count(self) -> int:
        with self.lock:
            return sum(1 for status, _, _ in self.rows.values() if status in ACTIVE)

    def still(self, seconds: float) -> list[uuid.UUID]:
        """Active runs that have not moved (status, step or fence) for `seconds`."""
        now = time.monotonic()
        with self.lock:
            return [
                run
                for run, (status, _, _) in self.rows.items()
                if status in ACTIVE and now - self.moved.get(run, now) >= seconds
            ]

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            # While PostgreSQL restarts polls fail; resume times still count from the fault.
            with contextlib.suppress(*TRANSIENT):
                self.poll()

    def poll(self) -> None:
        with self.lock:
            watched = list({w.run_id for w in self.watches})
        query = text(
            "SELECT id, status, step, fence FROM runs"
            " WHERE status IN ('running', 'waiting', 'needs_attention') OR id = ANY(:watched)"
        )
        now = time.monotonic()
        with self.lock:
            windows = [w for w in self.send_windows if w.started <= now <= w.ends]
        with transaction() as session:
            found = {
                r.id: (r.status, r.step, r.fence)
                for r in session.execute(query, {"watched": watched})
            }
            sending = list(session.execute(_SENDING)) if windows else []
        self._watch_sends(windows, sending)
        now = time.monotonic()
        with self.lock:
            for run, row in found.items():
                if self.rows.get(run) != row:
                    self.moved[run] = now
            self.rows = found
            waiting = []
            for watch in self.watches:
                status, _, fence = found.get(watch.run_id, ("gone", 0, watch.fence))
                if fence > watch.fence:
                    self.resumed.append((watch.kind, now - watch.started))
                elif status in ACTIVE:
                    waiting.append(watch)
                # else: it finished without another claim (the step it was in completed)
            self.watches = waiting

    def _watch_sends(self, windows: list[SendWindow], sending: list[Any]) -> None:
        for window in windows:
            hit = [
                (row.run_id, row.fence)
                for row in sending
                if row.service == window.service and row.run_id not in window.seen
            ]
            window.seen.update(run for run, _ in hit)
            self.watch(hit, window.kind, window.started)


@dataclass
class SendWindow:
    """A service misbehaving from `started` to `ends` (time.monotonic())."""

    kind: str
    service: str
    started: float
    ends: float
    seen: set[uuid.UUID] = field(default_factory=set)


_SENDING = text(
    "SELECT a.run_id, a.service, r.fence FROM actions a JOIN runs r ON r.id = a.run_id"
    " WHERE a.state = 'attempted'"
)


# -- the run --------------------------------------------------------------------------------


def run_chaos(config: ChaosConfig, say: Callable[[str], None] = print) -> ChaosReport:
    weights = config.planned_weights()
    plan = plan_faults(config.seed, config.duration, config.rate, weights, LEASE_SECONDS)
    digest = schedule_hash(plan)
    # Directly under /tmp: PostgreSQL runs as a system user (when we are root) and must
    # reach its data through every parent directory.
    root = Path(tempfile.mkdtemp(prefix="nightshift-chaos-", dir="/tmp"))
    root.chmod(0o755)
    kinds = registered()
    sentinels = any(kinds[name].needs_sentinels for name, w in weights.items() if w > 0)
    cluster = Cluster(
        root, config.workers, queue=f"chaos-{os.getpid()}", hosts=config.hosts,
        use_sentinels=sentinels,
    )  # fmt: skip
    write_schedule(root / "schedule.txt", plan)
    where = f"on {config.hosts} worker hosts" if config.hosts else "on this machine's network"
    say(
        f"chaos: seed {config.seed}, {config.duration:.0f}s, {config.workers} workers {where}, "
        f"{len(plan)} faults planned (schedule {digest}: {root / 'schedule.txt'})"
    )
    if not config.hosts and any(config.weights.get(k.name) for k in _partitions()):
        say(f"no partitions: no worker hosts ({unavailable() or 'asked for none: --hosts 0'})")
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    try:
        say(f"starting PostgreSQL, Redis, the sandbox services, beat and workers in {root}")
        cluster.start(clock)
        started = time.monotonic()
        assert cluster.webhook is not None
        sampler, approvals = Sampler(), Approvals(cluster.webhook)
        workload = Workload(config.seed, clock, sampler, approvals)
        injector = Injector(plan, cluster, sampler, clock, approvals)
        threads = [
            threading.Thread(target=target, name=name, daemon=True)
            for name, target in (
                ("sampler", sampler.run),
                ("workload", workload.run),
                ("injector", injector.run),
            )
        ]
        for thread in threads:
            thread.start()
        _drive(config, cluster, workload, injector, clock, say)
        injector.stopping.set()
        threads[2].join(timeout=120)
        workload.starting = False
        say(f"settling: no new runs or faults; up to {config.settle_timeout:.0f}s")
        settled = _settle(config, cluster, workload, sampler, clock)
        workload.stopping.set()
        sampler.stopping.set()
        for thread in threads[:2]:
            thread.join(timeout=30)
        write_fault_log(cluster.logs / "faults.txt", injector.records)
        (cluster.logs / "approvals.txt").write_text("\n".join(approvals.log) + "\n")
        return verify(
            config=config,
            plan=plan,
            digest=digest,
            cluster=cluster,
            workload=workload,
            sampler=sampler,
            injector=injector,
            approvals=approvals,
            settled=settled,
        )
    finally:
        # Results of the steps the harness sent unsubscribe when collected: while Redis is up.
        gc.collect()
        cluster.stop()
        if not config.keep:
            _remove_service_data(cluster)


def _drive(
    config: ChaosConfig,
    cluster: Cluster,
    workload: Workload,
    injector: Injector,
    clock: Callable[[], float],
    say: Callable[[str], None],
) -> None:
    """The main thread while the faults fly: supervise the workers, report progress."""
    every = 30.0 if config.duration >= 300 else 15.0
    next_report = every
    while clock() < config.duration:
        cluster.supervise()
        if clock() >= next_report:
            next_report += every
            fired = sum(1 for r in injector.records if r.injected)
            say(
                f"[+{clock():4.0f}s] runs started {len(workload.runs)} (and "
                f"{len(workload.batches)} batches), faults injected "
                f"{fired}/{len(injector.plan)}, workers replaced {cluster.replaced}, "
                f"unexpected exits {len(cluster.deaths)}"
            )
        time.sleep(0.2)


def _settle(
    config: ChaosConfig,
    cluster: Cluster,
    workload: Workload,
    sampler: Sampler,
    clock: Callable[[], float],
) -> float:
    """Let every run finish: thaw, approve what waits, let a person (the harness, which can
    read the sandbox logs) resolve unknown outcomes; stop when nothing is active, or nothing
    moved for ten leases, or at the timeout. Returns the seconds it took."""
    began = clock()
    cluster.thaw_all()
    stall = LEASE_SECONDS * 10
    next_sweep = 0.0
    while clock() - began < config.settle_timeout:
        cluster.supervise()
        if clock() >= next_sweep:
            next_sweep = clock() + 2
            # A decision may race a run that moved on meanwhile: the next sweep looks again.
            with contextlib.suppress(*TRANSIENT, NightshiftError):
                workload.approve_all()
                workload.resolved_by_person += _resolve_unknown(cluster)
        if sampler.active_count() == 0 and not workload.unstarted and clock() - began > 1:
            break
        still = set(sampler.still(stall))
        if still and len(still) == sampler.active_count():
            break
        time.sleep(0.5)
    return clock() - began


def _resolve_unknown(cluster: Cluster) -> int:
    """Be the person a run in needs_attention waits for: the sandbox logs say what happened."""

    query = text(
        "SELECT a.idempotency_key, a.service FROM actions a JOIN runs r ON r.id = a.run_id"
        " WHERE a.state = 'outcome_unknown' AND r.status = 'needs_attention'"
    )
    with transaction() as session:
        unknown = list(session.execute(query))
    delivered = deliveries(cluster)
    for key, service in unknown:
        happened = delivered.get(f"{service}:{key}", 0) > 0
        verdict = "happened" if happened else "did_not_happen"
        decide(key, verdict, Actor("chaos-operator", "chaos harness (read the sandbox logs)"))
    return len(unknown)


def _remove_service_data(cluster: Cluster) -> None:
    shutil.rmtree(cluster.services_dir, ignore_errors=True)
    shutil.rmtree(cluster.root / "data", ignore_errors=True)
