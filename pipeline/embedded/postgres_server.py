"""The embedded PostgreSQL: initdb with a password, our pg_hba, pg_ctl start and stop, and the
nightshift database created on first answer."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql

import pipeline.embedded.access as access
from pipeline.embedded.server import HOST, START_TIMEOUT, STOP_TIMEOUT, Server, alive
from pipeline.errors import ServiceError

log = logging.getLogger("nightshift.embedded")

# C collation with the builtin UTF-8 provider: the same sort order on every machine.
INITDB_OPTIONS = (
    "--auth=scram-sha-256 -U postgres --encoding=utf8 --locale=C"
    " --locale-provider=builtin --builtin-locale=C.UTF-8"
)


class PostgresServer(Server):
    name = "postgres"
    url_format = "postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/nightshift"
    replication = False
    """Whether a standby may stream from it (pg_hba.conf's replication lines)."""

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
        return (pid, port) if alive(pid, "postgres") else None

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
            access.write_hba(self.data_path, self.clients, owner, replication=self.replication)
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
            owner = access.postgres_owner()
            access.write_hba(self.data_path, self.clients, owner, replication=self.replication)
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
