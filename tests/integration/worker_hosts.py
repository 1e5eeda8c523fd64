"""Two worker hosts (network namespaces, pipeline/chaos/hosts.py) around this test's own
embedded PostgreSQL and Redis and the sandbox services, which listen on the hosts' service
address (the `two_hosts` fixture, which conftest.py offers). Needs root: a module using it
skips with `needs_hosts`."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline import embedded
from pipeline.chaos.hosts import Network, unavailable
from pipeline.db import dispose_all
from pipeline.migrate import upgrade
from pipeline.sandbox import SandboxSet, start_all
from pipeline.sandbox.responders import agent_responder
from pipeline.settings import get_settings

needs_hosts = pytest.mark.skipif(
    unavailable() is not None, reason=f"worker hosts need network namespaces: {unavailable()}"
)
LEASE = 3


@dataclass
class TwoHosts:
    network: Network
    urls: dict[str, str]
    sandboxes: SandboxSet
    env: dict[str, str]
    """For processes on this side."""
    host_env: dict[str, str]
    """For workers on a worker host: the service address instead of 127.0.0.1."""


@pytest.fixture
def two_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoHosts]:
    network = Network(2).up()
    data_dir = Path(tempfile.mkdtemp(prefix="nightshift-partitions-", dir="/tmp"))
    data_dir.chmod(0o755)  # postgres, as a system user, must reach its data dir
    sandboxes = None
    try:
        urls = embedded.ensure_running(
            data_dir, listen=[network.service_address], clients=[network.clients]
        )
        sandboxes = start_all(
            tmp_path / "sandbox", responder=agent_responder, host=network.service_address
        )
        sandboxes.messages.delay_seconds = 1.0  # steps long enough to be cut in the middle
        env = {
            "NIGHTSHIFT_DATABASE_URL": urls["postgres"],
            "NIGHTSHIFT_BROKER_URL": urls["redis"],
            "NIGHTSHIFT_LEASE_SECONDS": str(LEASE),
            "NIGHTSHIFT_HEARTBEAT_SECONDS": "1",
            "NIGHTSHIFT_TICK_SECONDS": "1",
            "NIGHTSHIFT_HANDOFF_GRACE_SECONDS": str(2 * LEASE),
            "NIGHTSHIFT_WEB_URL": sandboxes.web.url,
            "NIGHTSHIFT_EMAIL_URL": sandboxes.email.url,
            "ANTHROPIC_API_KEY": "local-test-key",
            "ANTHROPIC_BASE_URL": sandboxes.messages.url,
            "NIGHTSHIFT_DATA_DIR": str(tmp_path / "data"),
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        dispose_all()
        upgrade()
        here, there = "@127.0.0.1:", f"@{network.service_address}:"
        host_env = {
            name: env[name].replace(here, there)
            for name in ("NIGHTSHIFT_DATABASE_URL", "NIGHTSHIFT_BROKER_URL")
        }
        yield TwoHosts(network, urls, sandboxes, env, host_env)
    finally:
        dispose_all()
        if sandboxes is not None:
            sandboxes.stop()
        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
        network.down()
        get_settings.cache_clear()
