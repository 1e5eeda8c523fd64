"""Test fixtures: real PostgreSQL and Redis (configured, or the embedded default), a fresh
database per test cloned from a migrated template, and real `celery worker` subprocesses.

Configure with NIGHTSHIFT_DATABASE_URL / NIGHTSHIFT_BROKER_URL (CI does); with neither set,
the embedded services are started (under pytest-xdist, by the controller: its workers inherit
the URLs it found). The tests use Redis database 9 and a queue of their own.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.support import ServiceUrls

REPO = Path(__file__).resolve().parents[1]
BENCH_AGENTS = "bench.agents:AGENT,bench.agents:SYNTHESIS"
"""Registered in every test session (NIGHTSHIFT_AGENTS), as bench/scratch.py registers them."""
_counter = itertools.count()
_SERVICES: ServiceUrls | None = None
_STARTED_IN: list[Path] = []


def _discover_services() -> ServiceUrls:
    """The configured URLs, or the embedded default's (started here if needed)."""
    db = os.environ.get("NIGHTSHIFT_DATABASE_URL")
    broker = os.environ.get("NIGHTSHIFT_BROKER_URL")
    if not (db and broker):
        from pipeline import embedded
        from pipeline.settings import Settings

        data_dir = Settings.from_env().data_dir
        if not any(info.running for info in embedded.status(data_dir)):
            _STARTED_IN.append(data_dir)  # stopped again when the session ends
        urls = embedded.ensure_running(data_dir, postgres=not db, redis=not broker)
        db = db or urls["postgres"]
        broker = broker or urls["redis"]
    parts = urlsplit(broker)
    test_broker = urlunsplit(parts._replace(path="/9"))
    return ServiceUrls(database=db, broker=test_broker)


def _schedules_off() -> Path:
    from beat_schedule import SCHEDULES

    path = Path(tempfile.mkdtemp(prefix="nightshift-tests-")) / "schedules.json"
    path.write_text(json.dumps([{"name": s.name, "enabled": False} for s in SCHEDULES]))
    return path


def pytest_configure(config: pytest.Config) -> None:
    global _SERVICES
    _SERVICES = _discover_services()
    # Before the Celery app configures itself (first use): it reads these then, once.
    os.environ["NIGHTSHIFT_BROKER_URL"] = _SERVICES.broker
    os.environ["NIGHTSHIFT_DATABASE_URL"] = _SERVICES.database
    os.environ.setdefault("NIGHTSHIFT_LEASE_SECONDS", "4")
    os.environ.setdefault("NIGHTSHIFT_HEARTBEAT_SECONDS", "1")
    os.environ.setdefault("NIGHTSHIFT_TICK_SECONDS", "1")
    os.environ.setdefault("NIGHTSHIFT_HANDOFF_GRACE_SECONDS", "8")
    # The shipped nightly schedules stay off in tests: a test that happens to run at 02:00
    # Berlin time must not find an extra nightly run. Tests of schedules bring their own file.
    os.environ.setdefault("NIGHTSHIFT_SCHEDULES_FILE", str(_schedules_off()))
    # The benchmark agents (`bench`, `bench_synthesis`) are no production entry points: the
    # tests register them as the benchmarks do, for this process and every one it starts.
    os.environ.setdefault("NIGHTSHIFT_AGENTS", BENCH_AGENTS)
    # nightshift's own agents are off in a deployment until named; the tests run them all (a
    # test of that default unsets it for the processes it starts).
    os.environ.setdefault("NIGHTSHIFT_SHIPPED_AGENTS", "all")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    # A queue of this session's own: other test sessions may share the Redis database. Under
    # pytest-xdist each worker process inherits the controller's and adds its own name to it.
    os.environ.setdefault("NIGHTSHIFT_QUEUE", f"nightshift-test-{os.getpid()}")
    xdist_worker = os.environ.get("PYTEST_XDIST_WORKER")
    if xdist_worker:
        os.environ["NIGHTSHIFT_QUEUE"] += f"-{xdist_worker}"


def pytest_unconfigure(config: pytest.Config) -> None:
    from pipeline import embedded
    from pipeline.db import dispose_all

    dispose_all()
    for data_dir in _STARTED_IN:
        embedded.stop(data_dir)


@pytest.fixture(scope="session")
def services() -> ServiceUrls:
    assert _SERVICES is not None
    return _SERVICES


@pytest.fixture(scope="session")
def template_db(services: ServiceUrls) -> Iterator[str]:
    """A database migrated to head once per session; each test clones it."""
    from pipeline.db import dispose_all
    from pipeline.migrate import fresh_database, upgrade

    name = f"ns_tpl_{os.getpid()}"
    with fresh_database(services.database_url(name)) as url:
        upgrade(url)
        dispose_all()
        yield name


@pytest.fixture
def db_url(
    services: ServiceUrls, template_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh database for this test; the environment and settings point at it."""
    from pipeline.db import dispose_all
    from pipeline.migrate import fresh_database
    from pipeline.settings import get_settings

    name = f"ns_t_{os.getpid()}_{next(_counter)}"
    with fresh_database(services.database_url(name), template=template_db) as url:
        monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", url)
        monkeypatch.setenv("NIGHTSHIFT_DATA_DIR", str(tmp_path / "data"))
        get_settings.cache_clear()
        client = redis.Redis.from_url(services.broker)
        client.delete(os.environ["NIGHTSHIFT_QUEUE"])  # messages left by the previous test
        client.close()
        yield url
        _wait_for_connections_returned(url)
        dispose_all()
        get_settings.cache_clear()


def _wait_for_connections_returned(url: str, timeout: float = 10.0) -> None:
    """Disposing a pool closes only the connections checked in: one a thread of this process
    (an API server's handler, a waiter) still holds would be checked in to the discarded pool
    later and garbage-collected open, a ResourceWarning that fails whichever test runs then."""
    from pipeline.db import get_engine

    pool = get_engine(url).pool
    deadline = time.monotonic() + timeout
    while pool.checkedout() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pool.checkedout(), f"{pool.checkedout()} connection(s) still in use after the test"


class _SettingsAwareMonkeyPatch(pytest.MonkeyPatch):
    """A variable set or removed is seen at once by the settings, which each process reads
    once and caches (get_settings)."""

    def setenv(self, name: str, value: str, prepend: str | None = None) -> None:
        super().setenv(name, value, prepend)
        self._reread()

    def delenv(self, name: str, raising: bool = True) -> None:
        super().delenv(name, raising)
        self._reread()

    def undo(self) -> None:
        super().undo()
        self._reread()

    @staticmethod
    def _reread() -> None:
        from pipeline.settings import get_settings

        get_settings.cache_clear()


@pytest.fixture
def monkeypatch() -> Iterator[pytest.MonkeyPatch]:
    """pytest's own, made settings-aware: a test that sets NIGHTSHIFT_* in this process is not
    read stale settings cached before it (the CI failures of test_wait and test_metrics)."""
    patch = _SettingsAwareMonkeyPatch()
    yield patch
    patch.undo()


@pytest.fixture
def register_agents(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Register more agents by `module:ATTR` (NIGHTSHIFT_AGENTS, besides the session's), in
    this process and in the workers a test starts after calling it."""
    from pipeline.registry import registry
    from pipeline.settings import get_settings

    session = os.environ.get("NIGHTSHIFT_AGENTS")

    def register(*paths: str) -> None:
        monkeypatch.setenv("NIGHTSHIFT_AGENTS", ",".join(p for p in (*paths, session) if p))
        get_settings.cache_clear()
        registry.cache_clear()

    yield register
    if session:
        monkeypatch.setenv("NIGHTSHIFT_AGENTS", session)
    else:
        monkeypatch.delenv("NIGHTSHIFT_AGENTS", raising=False)
    get_settings.cache_clear()
    registry.cache_clear()


_DUPLICATES: list[int] = []


@pytest.fixture(scope="session")
def duplicate_report() -> list[int]:
    """Tests append the duplicate side effects they counted in the sandbox logs."""
    return _DUPLICATES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _DUPLICATES:
        terminalreporter.write_line(
            f"duplicate side effects counted in the sandbox logs: {sum(_DUPLICATES)} "
            f"(across {len(_DUPLICATES)} checks)"
        )
