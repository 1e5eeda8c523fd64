"""Real celery worker and beat processes, started and stopped the same way by the demo,
the chaos harness and the tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from pipeline.settings import child_environment

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None],
    timeout: float = 30.0,
    what: str = "a condition",
    interval: float = 0.1,
) -> T:
    """Poll until probe() returns something truthy; TimeoutError naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# celeryconfig sets worker_pool="threads"; Celery reads an explicit --pool=prefork as "no
# pool given" and keeps threads, so prefork must be asked for by its other name.
_POOL_ALIASES = {"prefork": "processes"}


@dataclass
class CeleryProcess:
    """A real `celery -A pipeline worker` process (or beat, with `beat=True`)."""

    name: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 4
    pool: str = "threads"
    beat: bool = False
    wrap: list[str] = field(default_factory=list)
    """An argv prefix the process runs under, e.g. a network namespace's (pipeline.chaos)."""
    process: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def nodename(self) -> str:
        """Unique per launching process: other launchers may share the broker's pidbox."""
        return f"{self.name}.{os.getpid()}@{socket.gethostname()}"

    def argv(self) -> list[str]:
        celery = [sys.executable, "-m", "celery", "-A", "pipeline"]
        if self.beat:
            schedule = self.log_path.with_suffix(".schedule")
            return [*self.wrap, *celery, "beat", "--loglevel=INFO", f"--schedule={schedule}"]
        return [
            *self.wrap, *celery, "worker", "-n", self.nodename, "--loglevel=INFO",
            f"--pool={_POOL_ALIASES.get(self.pool, self.pool)}",
            f"--concurrency={self.concurrency}",
            "--without-mingle", "--without-gossip",
        ]  # fmt: skip

    def start(self, wait: bool = True) -> CeleryProcess:
        argv = self.argv()
        env = child_environment({**self.env, "PYTHONUNBUFFERED": "1"})
        self._log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            argv, env=env, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        if wait:
            wait_for(self.ready, timeout=60, what=f"{self.name} to start")
        return self

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited early:\n{self.log()[-3000:]}")
        return ("beat: Starting" if self.beat else " ready.") in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole worker (its process group: pool children die too)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGCONT)
                os.killpg(self.pid, signal.SIGTERM)
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass
        if self._log_file is not None:
            self._log_file.close()

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None
