"""Infrastructure an ops team puts in front of PostgreSQL and Redis, run for real in a temporary
directory on free ports: PgBouncer (Debian's package) in transaction mode; a CA and a server
certificate made with openssl for TLS. A missing program skips the test locally and fails it in
CI (`.ci/run` installs them)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from pipeline.chaos.sentinels import Certificates

PGBOUNCER = "/usr/sbin/pgbouncer"


def need(program: str) -> str:
    """The program's path; skipped when it is missing, except in CI."""
    found = program if os.access(program, os.X_OK) else shutil.which(program)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{program} is required in CI (.ci/run installs it)")
    pytest.skip(f"{program} is not installed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:.0f}s")


def certificates(directory: Path, host: str = "127.0.0.1") -> Certificates:
    """A CA of its own and a certificate it signed for `host` (an IP address: the name
    clients verify), made with openssl in `directory`."""
    openssl = need("openssl")
    directory.mkdir(parents=True, exist_ok=True)
    made = Certificates(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    ca_key, request, extensions = (directory / n for n in ("ca.key", "server.csr", "san.ext"))
    extensions.write_text(f"subjectAltName = IP:{host}\n")
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
         "-keyout", ca_key, "-out", made.ca],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", made.key,
         "-out", request],
        ["x509", "-req", "-in", request, "-CA", made.ca, "-CAkey", ca_key, "-CAcreateserial",
         "-days", "2", "-extfile", extensions, "-out", made.cert],
    ):  # fmt: skip
        subprocess.run([openssl, *map(str, command)], check=True, capture_output=True)
    return made


def _unprivileged() -> dict[str, object]:
    """Servers that refuse root (PgBouncer) run as `nobody` when the tests run as root."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid}


class PgBouncer:
    """Debian's PgBouncer in transaction mode in front of the PostgreSQL `url` names, with the
    settings docs/operations.md gives, and so few server connections that consecutive
    transactions of one client connection run on different server connections."""

    def __init__(self, url: str, *, pool_size: int = 2) -> None:
        self.target = urlsplit(url)
        self.pool_size = pool_size
        self.dir = Path(tempfile.mkdtemp(prefix="nightshift-pgbouncer-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        program = need(PGBOUNCER)
        user = self.target.username or "postgres"
        (self.dir / "users.txt").write_text(f'"{user}" "{self.target.password or ""}"\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.target.hostname or '127.0.0.1'} port={self.target.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            f"admin_users = {user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
        )
        os.chmod(self.dir, 0o755)
        privileges = _unprivileged()
        if privileges:
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, privileges["user"], privileges["group"])  # type: ignore[arg-type]
        self.process = subprocess.Popen(  # type: ignore[call-overload]
            [program, str(self.dir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **privileges,
        )
        wait_for_port(self.port)
        return self

    def url(self, database: str) -> str:
        """`database` on the target server, through this PgBouncer (the target's scheme)."""
        netloc = self.target.netloc.rsplit("@", 1)
        where = f"127.0.0.1:{self.port}"
        through = f"{netloc[0]}@{where}" if len(netloc) == 2 else where
        return urlunsplit(self.target._replace(netloc=through, path=f"/{database}"))

    def admin(self, command: str) -> list[dict[str, object]]:
        """A command on PgBouncer's admin console (`SHOW POOLS`...), as rows."""
        user = self.target.username or "postgres"
        conninfo = f"host=127.0.0.1 port={self.port} dbname=pgbouncer user={user}"
        # The console speaks only the simple query protocol: a client-side cursor's.
        with psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=None, cursor_factory=psycopg.ClientCursor
        ) as connection:
            cursor = connection.execute(command)
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
