"""What the compose file tests share: the file itself, and its commands started as this
machine's processes in the services' environment (the `launch` fixture, conftest's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())
BIN = Path(sys.executable).parent


class Started:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path, **popen: Any) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            **popen,
        )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


@pytest.fixture
def launch(db_url: str, tmp_path: Path) -> Iterator:
    started: list[Started] = []
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "NIGHTSHIFT_DATA_DIR": str(tmp_path / "data"),
        "NIGHTSHIFT_FLOWER_BASIC_AUTH": "ops:night-owl",
        "NIGHTSHIFT_API_TOKEN": "compose-test-token-0123456789",
        "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET": "compose-test-approvals-0123456789",
        "NIGHTSHIFT_EVENT_WEBHOOK_SECRET": "compose-test-events-0123456789",
    }

    def start(name: str, argv: list[str], **popen: Any) -> Started:
        """Start `argv` in the services' environment (`env=` replaces it), with Popen's options."""
        process = Started(argv, popen.pop("env", env), tmp_path / f"{name}.log", **popen)
        started.append(process)
        return process

    yield start, env
    for process in started:
        process.stop()
