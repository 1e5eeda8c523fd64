"""The sandbox services as a background process for a trial without Docker: started once,
found again by its pid file, stopped by `stop`; the URLs as shell `export` lines."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pipeline.errors import ServiceError
from pipeline.registry import SHIPPED_ENV
from pipeline.sandbox.base import read_log
from pipeline.sandbox.launcher import MANIFEST

PID_FILE = "sandbox.pid"
ENV_FILE = "sandbox.env"
LOG_FILE = "sandbox.log"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0

VARIABLES = {
    "web": "NIGHTSHIFT_WEB_URL",
    "email": "NIGHTSHIFT_EMAIL_URL",
    "pricing": "NIGHTSHIFT_PRICING_URL",
    "githost": "NIGHTSHIFT_GITHOST_URL",
    "git_url": "NIGHTSHIFT_CONFIG_PATCH_GIT_URL",
}
"""Sandbox service -> the variable the shipped agents' tools read it from (`git_url`: the git
host's bare repositories, which Patch clones and pushes to)."""


@dataclass(frozen=True)
class SandboxStatus:
    dir: Path
    pid: int | None
    """The live sandbox process, None when none runs."""
    urls: dict[str, str]
    """Variable -> URL, while it runs."""
    deliveries: dict[str, int]
    """Service -> side effects in its delivery log (emails sent, prices set, pulls opened)."""

    @property
    def running(self) -> bool:
        return self.pid is not None

    def exports(self) -> str:
        """Shell lines that point the CLI, workers and beat started from this shell at it, and
        turn on the shipped agents it stands in for (off in a deployment until named)."""
        lines = [f"export {name}={shlex.quote(url)}\n" for name, url in self.urls.items()]
        return "".join(lines) + (f"export {SHIPPED_ENV}=all\n" if lines else "")


def status(dir: Path) -> SandboxStatus:
    pid = _live_pid(dir)
    manifest = _manifest(dir) if pid is not None else {}
    urls = {variable: manifest[name] for name, variable in VARIABLES.items() if name in manifest}
    logs = manifest.get("logs", {})
    deliveries = {name: len(read_log(logs[name])) for name in VARIABLES if name in logs}
    return SandboxStatus(dir, pid, urls, deliveries)


def start(dir: Path, email_mode: str = "keys") -> SandboxStatus:
    """Start `python -m pipeline.sandbox` in its own session (it outlives this command), or
    find the one already running; writes the export lines to `dir/sandbox.env` too."""
    dir.mkdir(parents=True, exist_ok=True)
    running = status(dir)
    if running.running:
        return running
    (dir / MANIFEST).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pipeline.sandbox", "--dir", str(dir), "--email-mode", email_mode]
    with (dir / LOG_FILE).open("ab") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    (dir / PID_FILE).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while not (dir / MANIFEST).exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(dir)
            raise ServiceError(f"the sandbox services did not start; see {dir / LOG_FILE}")
        time.sleep(0.1)
    started = status(dir)
    (dir / ENV_FILE).write_text(started.exports())
    return started


def stop(dir: Path) -> int | None:
    """Stop the sandbox process; the pid it had, or None if none ran."""
    pid = _live_pid(dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        try:
            psutil.Process(pid).wait(STOP_TIMEOUT)
        except psutil.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    for name in (PID_FILE, ENV_FILE, MANIFEST):
        (dir / name).unlink(missing_ok=True)
    return pid


def _live_pid(dir: Path) -> int | None:
    """The pid in the pid file, if that process is alive and is this directory's sandbox."""
    try:
        pid = int((dir / PID_FILE).read_text().strip())
        process = psutil.Process(pid)
        command = process.cmdline()
    except (FileNotFoundError, ValueError, psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if process.status() == psutil.STATUS_ZOMBIE or "pipeline.sandbox" not in command:
        return None
    return pid if str(dir) in command else None


def _manifest(dir: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((dir / MANIFEST).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return manifest
