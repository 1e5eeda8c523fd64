"""The embedded default starts real servers, reuses them, and stops them leaving nothing behind."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
from redis import Redis, RedisError

from pipeline import embedded
from pipeline.errors import ServiceError

REPO = Path(__file__).resolve().parents[2]


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
    assert urls["postgres"].startswith("postgresql+psycopg://postgres:")
    assert urls["postgres"].endswith("/nightshift") and "@127.0.0.1:" in urls["postgres"]
    assert urls["redis"].startswith("redis://:") and "@127.0.0.1:" in urls["redis"]
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


def without_password(url: str) -> str:
    parts = urlsplit(url.replace("+psycopg", ""))
    user = parts.username or ""
    return parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}").geturl()


def test_each_service_requires_its_random_password_kept_in_a_private_file(
    data_dir: Path,
) -> None:
    # given the embedded services of a fresh data dir
    urls = embedded.ensure_running(data_dir)

    # then a login without the password is refused by both
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without_password(urls["postgres"]), connect_timeout=5).close()
    with pytest.raises(RedisError, match=r"NOAUTH|Authentication|authenticated"):
        ping(without_password(urls["redis"]))
    # and the passwords are random, each in a 0600 file in a 0700 folder
    secrets = data_dir / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    for name in ("postgres", "redis"):
        path = secrets / f"{name}.password"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(path.read_text().strip()) >= 40 and path.read_text().strip() in urls[name]
    assert stat.S_IMODE((data_dir / "redis" / "redis.conf").stat().st_mode) == 0o600
    assert "scram-sha-256" in (data_dir / "postgres" / "pg_hba.conf").read_text()
    # and no process shows the password on its command line
    for info in embedded.status(data_dir):
        password = (secrets / f"{info.name}.password").read_text().strip()
        assert info.pid is not None
        assert password not in " ".join(psutil.Process(info.pid).cmdline())


def test_a_data_dir_from_before_passwords_gets_them_at_its_next_start(data_dir: Path) -> None:
    # given a data dir that trusted every local login (initdb --auth=trust, no password files)
    embedded.ensure_running(data_dir)
    embedded.stop(data_dir)
    hba = data_dir / "postgres" / "pg_hba.conf"
    hba.write_text("host all all 127.0.0.1/32 trust\n")
    (data_dir / "secrets" / "postgres.password").unlink()

    # when it starts again
    urls = embedded.ensure_running(data_dir)

    # then the server requires the new password, and the data's owner logs in with it
    assert select_one(urls["postgres"]) == 1
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without_password(urls["postgres"]), connect_timeout=5).close()


def test_the_services_also_listen_where_they_are_told_and_let_those_clients_in(
    data_dir: Path,
) -> None:
    # when the services start with another address to listen on (here one on loopback)
    urls = embedded.ensure_running(data_dir, listen=["127.0.0.2"], clients=["127.0.0.0/8"])

    # then both answer there, with their passwords
    elsewhere = {name: url.replace("@127.0.0.1:", "@127.0.0.2:") for name, url in urls.items()}
    assert select_one(elsewhere["postgres"]) == 1
    assert ping(elsewhere["redis"])


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


def test_the_servers_start_with_none_of_the_environment_s_secrets(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a process whose environment holds the API's and the model's secrets
    secrets = {
        "NIGHTSHIFT_API_TOKEN": "api-token-marker-81f3",
        "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET": "approval-marker-81f3",
        "NIGHTSHIFT_NOTIFY_SECRET": "notify-marker-81f3",
        "ANTHROPIC_API_KEY": "sk-marker-81f3",
        "PGPASSWORD": "pg-marker-81f3",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)

    # when it starts the embedded services
    urls = embedded.ensure_running(data_dir)

    # then they work, and neither server's environment holds any of it
    assert select_one(urls["postgres"]) == 1 and ping(urls["redis"])
    for name, pid in pids(data_dir).items():
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        names = [line.split("=", 1)[0] for line in environ.split("\0")]
        assert "marker-81f3" not in environ, (name, names)
        assert not [n for n in names if n.startswith(("NIGHTSHIFT_", "ANTHROPIC_"))], names
