"""What an embedded server is (Server: find, answer, start, stop, its log and its failures), what
`status` shows of one (ServiceInfo), and waiting for a process to stop."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

import pipeline.embedded.access as access
from pipeline.errors import ServiceError
from pipeline.settings import server_environment

HOST = "127.0.0.1"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


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


class Server(ABC):
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
        """Ask the server to shut down cleanly; `halt` waits for it (and kills if need be)."""

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
        env = server_environment({"HOME": owner.pw_dir} if owner else None)
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


def halt(server: Server, pid: int) -> None:
    """Wait for `pid` to exit; kill it and its children when it takes too long."""
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        name = process.name()
        if wait_until(lambda: not alive(pid, name), STOP_TIMEOUT):
            return
        for straggler in [*process.children(recursive=True), process]:
            with contextlib.suppress(psutil.Error):
                straggler.kill()
        if not wait_until(lambda: not alive(pid, name), 5.0):
            raise server.failure(f"(pid {pid}) did not stop")


def alive(pid: int, name: str) -> bool:
    """A live (not zombie) process named `name`: a stale pid file may name a reused pid."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.name() == name
    except psutil.Error:
        return False


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
