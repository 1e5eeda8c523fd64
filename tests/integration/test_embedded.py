"""The embedded default starts real servers, reuses them, and stops them leaving nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
from redis import Redis

from pipeline import embedded
from pipeline.errors import ServiceError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not tmp_path: as root, postgres runs as another user that must traverse the path, and
    # every pytest session that starts resets /tmp/pytest-of-<user> to 0700.
    path = Path(tempfile.mkdtemp(prefix="nightshift-embedded-")) / "data"
    yield path
    embedded.stop(path)  # never leave a server behind, even when the test failed
    shutil.rmtree(path.parent)


def alive(pid: int | None) -> bool:
    """A zombie is gone: the container's init may reap late."""
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def select_one(url: str) -> int:
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        row = conn.execute("select 1").fetchone()
    assert row is not None
    return int(row[0])


def ping(url: str) -> bool:
    client = Redis.from_url(url)
    try:
        return bool(client.ping())
    finally:
        client.close()


def port(url: str) -> int:
    number = urlsplit(url).port
    assert number is not None
    return number


def pids(data_dir: Path) -> dict[str, int | None]:
    return {info.name: info.pid for info in embedded.status(data_dir)}


def test_start_reuse_stop(data_dir: Path) -> None:
    # given an empty data dir, when nightshift starts the services
    urls = embedded.ensure_running(data_dir)

    # then both are real servers that answer
    assert urls["postgres"].startswith("postgresql+psycopg://postgres@127.0.0.1:")
    assert urls["postgres"].endswith("/nightshift")
    assert urls["redis"].startswith("redis://127.0.0.1:")
    assert select_one(urls["postgres"]) == 1
    assert ping(urls["redis"])
    started = pids(data_dir)

    # and a second call reuses them: same URLs, same processes
    assert embedded.ensure_running(data_dir) == urls
    assert pids(data_dir) == started
    infos = embedded.status(data_dir)
    assert [(i.name, i.running, i.url) for i in infos] == [
        ("postgres", True, urls["postgres"]),
        ("redis", True, urls["redis"]),
    ]
    assert all(alive(i.pid) for i in infos)

    # when they are stopped, no process is left and status says so
    stopped = embedded.stop(data_dir)
    assert {(i.name, i.pid) for i in stopped} == set(started.items())
    assert not any(alive(pid) for pid in started.values())
    assert [(i.running, i.pid, i.url) for i in embedded.status(data_dir)] == [
        (False, None, None)
    ] * 2
    assert embedded.stop(data_dir) == []


def test_restart_keeps_data_and_moves_off_a_taken_port(data_dir: Path) -> None:
    # given services that ran once and kept a row, then were stopped
    urls = embedded.ensure_running(data_dir)
    with psycopg.connect(urls["postgres"].replace("+psycopg", "")) as conn:
        conn.execute("create table kept (x int)")
        conn.execute("insert into kept values (42)")
    embedded.stop(data_dir)
    # and another program has taken the redis port meanwhile
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port(urls["redis"])))
        squatter.listen()

        # when they start again
        again = embedded.ensure_running(data_dir)

    # then postgres is back on its port with the data, and redis found a free port
    assert again["postgres"] == urls["postgres"]
    assert again["redis"] != urls["redis"]
    assert ping(again["redis"])
    with psycopg.connect(again["postgres"].replace("+psycopg", "")) as conn:
        assert conn.execute("select x from kept").fetchall() == [(42,)]
    stored = json.loads((data_dir / "services.json").read_text())
    assert stored["redis"]["port"] == port(again["redis"])


def test_only_the_services_asked_for_start(data_dir: Path) -> None:
    assert set(embedded.ensure_running(data_dir, postgres=False)) == {"redis"}
    assert [(i.name, i.running) for i in embedded.status(data_dir)] == [
        ("postgres", False),
        ("redis", True),
    ]


def test_concurrent_starters_share_one_of_each(data_dir: Path) -> None:
    # given a worker, beat and the CLI starting at the same moment
    code = (
        "import json, sys; from pathlib import Path; from pipeline import embedded; "
        "print(json.dumps(embedded.ensure_running(Path(sys.argv[1]))))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    starters = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outputs = [starter.communicate(timeout=60) for starter in starters]

    # then all succeed with the same URLs
    assert [s.returncode for s in starters] == [0, 0, 0], [err for _, err in outputs]
    urls = {out for out, _ in outputs}
    assert len(urls) == 1
    assert set(json.loads(urls.pop())) == {"postgres", "redis"}

    # and exactly one postmaster and one redis-server serve this data dir
    postmasters = [
        p.pid
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "postgres" and str(data_dir) in " ".join(p.info["cmdline"] or [])
    ]
    redis_servers = [
        p.pid
        for p in psutil.process_iter(["name", "cwd"])
        if p.info["name"] == "redis-server" and p.info["cwd"] == str(data_dir / "redis")
    ]
    assert {"postgres": postmasters, "redis": redis_servers} == {
        name: [pid] for name, pid in pids(data_dir).items()
    }


def test_a_failed_start_names_the_service_and_its_log(data_dir: Path) -> None:
    # given a data dir whose postgres configuration was broken while it was stopped
    embedded.ensure_running(data_dir, redis=False)
    embedded.stop(data_dir)
    with (data_dir / "postgres" / "postgresql.conf").open("a") as conf:
        conf.write("\nshared_buffers = plenty\n")

    # when it starts, then the one-line error says which service, where its log is and why
    with pytest.raises(ServiceError) as failure:
        embedded.ensure_running(data_dir, redis=False)
    message = str(failure.value)
    assert message.startswith("postgres ")
    assert str(data_dir / "postgres.log") in message
    assert 'invalid value for parameter "shared_buffers"' in message
    assert "\n" not in message
    assert not embedded.status(data_dir)[0].running
