"""The embedded default: a real PostgreSQL and Redis kept in the data directory.

The servers outlive the process that started them (worker, beat and the CLI share them) and
are stopped only by `stop()`; a file lock makes concurrent starters agree on one of each.
`server` is what a server is, `postgres_server` and `redis_server` the two, `ports` the lock and the
ports they keep, `access` their passwords and who may connect.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from pipeline.embedded.ports import choose_port, locked
from pipeline.embedded.postgres_server import PostgresServer
from pipeline.embedded.redis_server import RedisServer
from pipeline.embedded.server import HOST, START_TIMEOUT, Server, ServiceInfo, halt, wait_until

__all__ = ["HOST", "ServiceInfo", "ensure_running", "ensure_server", "status", "stop"]

log = logging.getLogger("nightshift.embedded")


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
    with locked(root):
        return {server.name: server.url(ensure_server(server)) for server in asked}


def stop(data_dir: Path, only: Collection[str] | None = None) -> list[ServiceInfo]:
    """Stop both servers (or those named in `only`) and wait until their processes are gone.

    Returns the services that were running, each with the pid of the process it stopped.
    """
    root = Path(data_dir).expanduser().resolve()
    stopped: list[ServiceInfo] = []
    if not root.is_dir():
        return stopped
    with locked(root):
        for server in _servers(root):
            if only is not None and server.name not in only:
                continue
            info = server.info()
            if info.pid is not None:
                server.stop(info.pid)
                halt(server, info.pid)
                log.info("stopped %s (pid %d)", server.name, info.pid)
                stopped.append(replace(info, running=False))
    return stopped


def status(data_dir: Path) -> list[ServiceInfo]:
    """What runs now, from the pid files and the process table; starts and stops nothing."""
    return [server.info() for server in _servers(Path(data_dir).expanduser().resolve())]


def _servers(
    root: Path, listen: Sequence[str] = (), clients: Sequence[str] = ()
) -> tuple[Server, Server]:
    return PostgresServer(root, listen, clients), RedisServer(root, listen)


def ensure_server(server: Server) -> int:
    """The server's port: a live server that answers is reused, else one is started (on the
    port its data dir keeps)."""
    found = server.find()
    if found is not None:
        pid, known = found
        if known is None or not wait_until(lambda: server.answers(known), START_TIMEOUT):
            raise server.failure(f"(pid {pid}) is running but does not answer")
        return known
    port = choose_port(server.root, server.name)
    server.start(port)
    # A daemon that dies at once leaves no pid file: fail fast instead of waiting for answers.
    if not wait_until(lambda: server.find() is not None, 10.0):
        raise server.failure("did not start")
    if not wait_until(lambda: server.answers(port), START_TIMEOUT):
        raise server.failure(f"started but does not answer on {HOST}:{port}")
    server.started(port)
    log.info("started %s on %s:%d (data: %s)", server.name, HOST, port, server.data_path)
    return port
