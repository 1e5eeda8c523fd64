"""A PostgreSQL primary and a standby streaming from it, on two ports that stay theirs: a
failover stops the primary like a crash (`pg_ctl -m immediate`) and promotes the standby
(`pg_ctl promote`); a rebuild makes the dead primary's place a standby of the new primary
(`pg_basebackup`), for the next failover. The chaos harness's `failover` fault and the failover
tests use it (bench/commit_probe.py counts what a failover forgets); it runs the
embedded server's binaries, as its system user when we are root.

Synchronous (`synchronous_standby_names = '*'`, `synchronous_commit` on): a commit returns only
once the standby has flushed it, so a failover loses no commit. A promoted standby has no
standby of its own until the rebuild: meanwhile it commits alone rather than stopping every
write (as Patroni's synchronous mode does unless it is strict), and waits for its standby again
once the rebuilt one streams. Asynchronous: a commit returns at once, and what the standby had
not received when the primary stopped is gone.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

import pipeline.embedded.access as access
from pipeline.embedded import HOST, ensure_server
from pipeline.embedded.ports import locked, stored_ports
from pipeline.embedded.postgres_server import PostgresServer
from pipeline.embedded.server import START_TIMEOUT, alive, wait_until


class Node(PostgresServer):
    """One server of the pair: a data directory of its own under the pair's, the pair's password
    (a standby is a copy of its primary, roles included), and streaming allowed."""

    replication = True

    def __init__(
        self, pair_root: Path, name: str, listen: Sequence[str], clients: Sequence[str]
    ) -> None:
        super().__init__(pair_root / name, listen, clients)
        self.pair_root = pair_root
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def password(self) -> str:
        return access.password(self.pair_root, "postgres")

    def launch(self) -> int:
        """Start it (or find it running) on the port its directory keeps; that port."""
        with locked(self.root):
            return ensure_server(self)

    def port(self) -> int:
        """The port its directory keeps (known once it started): the URL names it up or down."""
        return stored_ports(self.root)["postgres"]

    def connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        info = f"host={HOST} port={self.port()} user=postgres dbname=postgres connect_timeout=5"
        return psycopg.connect(info, password=self.password, autocommit=True)

    def halt(self, sig: signal.Signals) -> None:
        """Stop it with `sig` (SIGQUIT: immediate, a crash; SIGINT: fast) and wait until it is
        gone."""
        found = self.find()
        if found is None:
            return
        pid = found[0]
        os.kill(pid, sig)
        if not wait_until(lambda: not alive(pid, "postgres"), START_TIMEOUT):
            raise self.failure(f"(pid {pid}) did not stop on {sig.name}")


@dataclass(frozen=True)
class Failover:
    """When (time.monotonic()) the primary was gone and when the standby took writes."""

    stopped_at: float
    promoted_at: float

    @property
    def seconds(self) -> float:
        return self.promoted_at - self.stopped_at


class PostgresPair:
    """Two nodes, `a` and `b`; `primary` and `standby` say which is which now."""

    def __init__(
        self,
        root: Path,
        *,
        synchronous: bool = True,
        listen: Sequence[str] = (),
        clients: Sequence[str] = (),
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.synchronous = synchronous
        self.nodes = (Node(self.root, "a", listen, clients), Node(self.root, "b", listen, clients))
        self.primary, self.standby = self.nodes
        self.failovers = 0

    def start(self) -> PostgresPair:
        self.primary.launch()  # creates the nightshift database, which the standby copies
        self._follow(self.standby)
        return self

    def ports(self) -> list[int]:
        return [node.port() for node in self.nodes]

    def url(self, database: str = "nightshift", host: str = HOST) -> str:
        """Both nodes in libpq's host lists: a client tries them in turn and keeps the one that
        takes writes (`target_session_attrs=read-write`)."""
        ports = ",".join(str(port) for port in self.ports())
        return (
            f"postgresql+psycopg://postgres:{self.primary.password}@/{database}"
            f"?host={host},{host}&port={ports}&target_session_attrs=read-write"
        )

    def fail_over(self) -> Failover:
        """Stop the primary like a crash and promote the standby. The stopped node stays down
        until `rebuild`."""
        old, new = self.primary, self.standby
        old.halt(signal.SIGQUIT)
        stopped = time.monotonic()
        new.pg("pg_ctl", "-w", "-t", f"{START_TIMEOUT:.0f}", "promote")
        if self.synchronous:
            self._synchronous_standby(new, "")
        self.primary, self.standby = new, old
        self.failovers += 1
        return Failover(stopped, time.monotonic())

    def rebuild(self) -> float:
        """Make the stopped node a standby of the primary (a fresh base backup) and, when the
        pair is synchronous, have the primary wait for it again; the seconds it took."""
        started = time.monotonic()
        self._follow(self.standby)
        return time.monotonic() - started

    def restart_primary(self, sig: signal.Signals, down_seconds: float) -> None:
        """Stop the primary with `sig`, keep it down, start it again: still the primary."""
        self.primary.halt(sig)
        time.sleep(down_seconds)
        self.primary.launch()

    def stop(self) -> None:
        for node in self.nodes:
            node.halt(signal.SIGINT)

    def lag_bytes(self) -> int | None:
        """How far the standby's flushed WAL is behind the primary's, or None with no standby
        streaming."""
        with self.primary.connect() as connection:
            row = connection.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint"
                " FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _follow(self, node: Node) -> None:
        """`node` becomes a standby of the primary, streaming (and synchronous if the pair is)."""
        node.halt(signal.SIGQUIT)
        shutil.rmtree(node.data_path, ignore_errors=True)
        owner = access.postgres_owner()
        if owner is not None:
            access.grant_access(owner, node.data_path, node.log_path)
        else:
            node.data_path.mkdir(mode=0o700)
        source = (
            f"host={HOST} port={self.primary.port()} user=postgres"
            f" passfile={self._passfile(owner)} application_name=standby"
        )
        backup = ("-R", "-X", "stream", "-c", "fast")  # -R: standby.signal, primary_conninfo
        node.run(access.pg_bin("pg_basebackup"), "-D", node.data_path, "-d", source, *backup,
                 owner=owner)  # fmt: skip
        node.launch()
        if not wait_until(lambda: self.lag_bytes() is not None, START_TIMEOUT):
            raise node.failure("started as a standby but does not stream from the primary")
        if self.synchronous:
            self._synchronous_standby(self.primary, "*")

    def _passfile(self, owner: pwd.struct_passwd | None) -> Path:
        """The password in a 0600 file the servers' user reads: never on a command line."""
        path = self.root / "pgpass"
        if not path.exists():
            path.write_text(f"*:*:*:postgres:{self.primary.password}\n")
            path.chmod(0o600)
            if owner is not None:
                os.chown(path, owner.pw_uid, owner.pw_gid)
        return path

    @staticmethod
    def _synchronous_standby(node: Node, names: str) -> None:
        """Set who `node`'s commits wait for ('' nobody, '*' any standby). Commits waiting when
        it is emptied are let go at once."""
        with node.connect() as connection:
            connection.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            connection.execute("SELECT pg_reload_conf()")
