"""A Redis that fails over: a master, a replica and three sentinels (quorum 2) on free ports
in a directory, run from a `redis-server` binary (its `--sentinel` mode is redis-sentinel). The
chaos fault `redis_failover` and tests/integration/test_redis_sentinel.py kill its master and
wait for the sentinels to promote the replica; the old master comes back as the new one's
replica, so the next failover has a replica to promote. With `tls` every server and sentinel
speaks TLS only (`port 0`, `tls-port`), to clients and to each other."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from redis import Redis, RedisError

MASTER_NAME = "nightshift"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000
"""How long a master must stay silent before a sentinel thinks it down: short, as a test's."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Certificates:
    """PEM files for TLS: the CA clients verify against, and the certificate (for the host
    every client uses) and key that every server and sentinel presents."""

    ca: Path
    cert: Path
    key: Path


class SentinelRedis:
    """Two Redis servers (one the master, one its replica) and three sentinels watching them,
    every one with `password` (the servers' requirepass and masterauth; the sentinels ask
    none), listening on `host`, over TLS only with `tls`."""

    def __init__(
        self, root: Path, program: str, password: str, *, host: str = "127.0.0.1",
        also: Sequence[str] = (), tls: Certificates | None = None,
    ) -> None:  # fmt: skip
        self.root = root
        self.tls = tls
        self.program = program
        self.password = password
        self.host = host
        """The address every client uses (the sentinels name the master by it)."""
        self.bind = " ".join(dict.fromkeys([host, *also]))
        self.server_ports = [free_port(host) for _ in range(2)]
        self.sentinel_ports = [free_port(host) for _ in range(SENTINELS)]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """NIGHTSHIFT_BROKER_URL: every sentinel, the master's password and database on the
        first (NIGHTSHIFT_BROKER_SENTINEL_MASTER is MASTER_NAME)."""
        first, *others = self.sentinel_ports
        return ";".join(
            [f"sentinel://:{self.password}@{self.host}:{first}/0"]
            + [f"sentinel://{self.host}:{port}" for port in others]
        )

    def start(self, timeout: float = 30.0) -> SentinelRedis:
        self.root.mkdir(parents=True, exist_ok=True)
        master, replica = self.server_ports
        self._server(master)
        self._server(replica, replica_of=master)
        for port in self.sentinel_ports:
            self._sentinel(port, master)
        self._wait(lambda: self._replicas_seen() >= 1, timeout, "the sentinels to see a replica")
        return self

    def master_port(self) -> int | None:
        """The master's port, as the sentinels that answer say; None while they don't know."""
        for port in self.sentinel_ports:
            with contextlib.suppress(RedisError), self._client(port, sentinel=True) as client:
                found = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                if found:
                    return int(found[1])
        return None

    def fail_over(self, timeout: float = 60.0) -> tuple[int, float]:
        """Kill the master (SIGKILL) and wait until a replica is promoted and answers as the
        master; then start the old one again, which the sentinels turn into the new master's
        replica. Returns the killed master's port and the seconds until the promotion."""
        old = self.master_port()
        if old is None:
            raise RuntimeError("the sentinels name no master")
        started = time.monotonic()
        process = self.processes.pop(old)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        self._wait(lambda: self._promoted(old), timeout, f"a replica promoted instead of {old}")
        promoted = time.monotonic() - started
        self._server(old, replica_of=self.master_port())
        self._wait(lambda: self._replicas_seen() >= 1, timeout, "the old master to rejoin")
        return old, promoted

    def restart_master(self, sig: signal.Signals, down_seconds: float, forget: bool) -> None:
        """Stop the master with `sig`, keep it down `down_seconds` (longer than DOWN_AFTER_MS,
        the sentinels promote its replica meanwhile), then start it again on its port: empty
        with `forget`; as the replica of whichever server is the master by then."""
        old = self.master_port()
        if old is None:
            raise RuntimeError("the sentinels name no master")
        process = self.processes.pop(old)
        process.send_signal(sig)
        process.wait(timeout=30)
        if forget:
            shutil.rmtree(self._data(old), ignore_errors=True)
        time.sleep(down_seconds)
        now = self.master_port()
        self._server(old, replica_of=now if now not in (None, old) else None)
        self._wait(lambda: self._answers(old), 60, f"redis on {old} to answer")

    def flushall(self) -> None:
        """Every key of the master gone (its replica follows)."""
        port = self.master_port()
        if port is None:
            raise RuntimeError("the sentinels name no master")
        with self._client(port) as client:
            client.flushall()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self.processes.clear()

    def log(self) -> str:
        """Every server's and sentinel's log, one after the other."""
        return "\n".join(
            f"== {path.name}\n{path.read_text(errors='replace')}"
            for path in sorted(self.root.glob("*.log"))
        )

    # -- internals ---------------------------------------------------------------------------

    def _data(self, port: int) -> Path:
        return self.root / f"redis-{port}"

    def _server(self, port: int, replica_of: int | None = None) -> None:
        self._data(port).mkdir(mode=0o700, exist_ok=True)
        lines = [
            *self._listen(port),
            f"dir {self._data(port)}",
            "appendonly yes",
            "save ''",
            "maxmemory-policy noeviction",
            f"requirepass {self.password}",
            f"masterauth {self.password}",
            f"logfile {self.root / f'redis-{port}.log'}",
        ]
        if replica_of is not None:
            lines.append(f"replicaof {self.host} {replica_of}")
        self._run(port, f"redis-{port}.conf", lines)

    def _sentinel(self, port: int, master: int) -> None:
        lines = [
            *self._listen(port),
            f"dir {self.root}",
            f"sentinel monitor {MASTER_NAME} {self.host} {master} {QUORUM}",
            f"sentinel auth-pass {MASTER_NAME} {self.password}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} 10000",
            f"logfile {self.root / f'sentinel-{port}.log'}",
        ]
        self._run(port, f"sentinel-{port}.conf", lines, "--sentinel")

    def _listen(self, port: int) -> list[str]:
        """Where a server or sentinel listens: `port`, or only its TLS port `port` with `tls`,
        where it also replicates and (a sentinel) watches the servers and the others."""
        if self.tls is None:
            return [f"port {port}", f"bind {self.bind}"]
        return [
            "port 0",
            f"tls-port {port}",
            f"bind {self.bind}",
            f"tls-cert-file {self.tls.cert}",
            f"tls-key-file {self.tls.key}",
            f"tls-ca-cert-file {self.tls.ca}",
            # Clients prove nothing (no client certificate); the server proves who it is.
            "tls-auth-clients no",
            "tls-replication yes",
        ]

    def _run(self, port: int, config: str, lines: Sequence[str], *mode: str) -> None:
        # The password is in a 0600 file, not on the command line (ps shows that to everyone);
        # a sentinel rewrites its own file as it learns.
        path = self.root / config
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write("\n".join(lines) + "\n")
        self.processes[port] = subprocess.Popen(
            [self.program, str(path), *mode],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _client(self, port: int, *, sentinel: bool = False) -> Redis:
        password = None if sentinel else self.password
        tls: dict[str, object] = {}
        if self.tls is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca)}
        return Redis(
            host=self.host, port=port, password=password, socket_timeout=2,
            socket_connect_timeout=2, **tls,  # type: ignore[arg-type]
        )  # fmt: skip

    def _replicas_seen(self) -> int:
        """The fewest replicas in good standing any sentinel knows of (0 if one cannot say)."""
        seen = []
        for port in self.sentinel_ports:
            try:
                with self._client(port, sentinel=True) as client:
                    replicas = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
            except RedisError:
                return 0
            good = [r for r in replicas if "s_down" not in _fields(r).get("flags", "")]
            seen.append(len(good))
        return min(seen)

    def _answers(self, port: int) -> bool:
        try:
            with self._client(port) as client:
                return bool(client.ping())
        except RedisError:  # includes LOADING while the append-only file is replayed
            return False

    def _promoted(self, old: int) -> bool:
        new = self.master_port()
        if new is None or new == old:
            return False
        try:
            with self._client(new) as client:
                return client.execute_command("ROLE")[0] in (b"master", "master")
        except RedisError:
            return False

    @staticmethod
    def _wait(condition: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout:.0f}s for {what}")


def _fields(reply: object) -> dict[str, str]:
    """A sentinel's reply about one server: a flat [name, value, ...] list (RESP2) or a map."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        flat = list(reply)  # type: ignore[call-overload]
        items = list(zip(flat[::2], flat[1::2], strict=True))
    return {_text(name): _text(value) for name, value in items}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
