"""CLI verbs for the services nightshift needs: the embedded PostgreSQL and Redis, and the
database schema."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

import psycopg
import redis

import pipeline.embedded as embedded
from pipeline.cli.format import print_json, table
from pipeline.db import broker_url, database_url
from pipeline.errors import redact_url
from pipeline.migrate import current, upgrade
from pipeline.settings import get_settings

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


def cmd_services(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.action == "up":
        if not settings.embedded:
            print("NIGHTSHIFT_DATABASE_URL and NIGHTSHIFT_BROKER_URL are set: nothing to start.")
            return 0
        embedded.ensure_running(
            settings.data_dir,
            postgres=settings.database_url is None,
            redis=settings.broker_url is None,
        )
    elif args.action == "env":
        return _print_env()
    elif args.action == "down":
        connected = [] if args.force else _connected_clients(embedded.status(settings.data_dir))
        if connected:
            print(
                f"nightshift: {', '.join(connected)} connected to the embedded services "
                "(workers, beat, the API or Flower); stop them first, or pass --force "
                "(they then fail until `nightshift services up`)"
            )
            return 2
        stopped = embedded.stop(settings.data_dir)
        # embedded.stop logs each "stopped NAME (pid N)" line itself.
        if not stopped:
            print("nothing was running")
        return 0
    # Shown without the passwords: they stay in their files (DATA_DIR/secrets/, mode 0600).
    infos = [
        replace(i, url=redact_url(i.url) if i.url else None)
        for i in embedded.status(settings.data_dir)
    ]
    if args.json:
        print_json([info.__dict__ for info in infos])
        return 0
    rows = [
        (i.name, "running" if i.running else "stopped", i.pid, i.url or "", i.data_path)
        for i in infos
    ]
    print(f"data directory: {settings.data_dir} (passwords in {settings.data_dir / 'secrets'})")
    print(table(rows, ["service", "state", "pid", "url", "data"]))
    return 0


def _print_env() -> int:
    """`export` lines with the real URLs, passwords included, for a plain client's shell:
    `eval "$(nightshift services env)"`. On the embedded default it starts what is not running."""
    settings = get_settings()
    for name, value in (
        ("NIGHTSHIFT_DATABASE_URL", database_url()),
        ("NIGHTSHIFT_BROKER_URL", broker_url()),
        # Through Sentinel a Celery client also needs the master's name (and the sentinels'
        # password, TLS and its CA): its broker_transport_options and
        # result_backend_transport_options, and broker_use_ssl and redis_backend_use_ssl.
        ("NIGHTSHIFT_BROKER_SENTINEL_MASTER", settings.broker_sentinel_master),
        ("NIGHTSHIFT_BROKER_SENTINEL_PASSWORD", settings.broker_sentinel_password),
        ("NIGHTSHIFT_BROKER_SENTINEL_TLS", "1" if settings.broker_sentinel_tls else None),
        ("NIGHTSHIFT_BROKER_SENTINEL_TLS_CA", settings.broker_sentinel_tls_ca),
        ("NIGHTSHIFT_QUEUE", settings.queue),
    ):
        if value:
            print(f"export {name}={shlex.quote(str(value))}")
    return 0


def _connected_clients(infos: list[embedded.ServiceInfo]) -> list[str]:
    """Who else is connected to the running embedded servers, in words."""
    found = []
    for info in infos:
        if not (info.running and info.url):
            continue
        count = _postgres_clients(info.url) if info.name == "postgres" else _redis_clients(info.url)
        if count:
            found.append(f"{count} client{'s' if count > 1 else ''} of {info.name}")
    return found


def _postgres_clients(url: str) -> int:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def _redis_clients(url: str) -> int:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        me = client.client_id()
        return sum(1 for c in client.client_list() if int(c["id"]) != me)
    finally:
        client.close()


def cmd_migrate(args: argparse.Namespace) -> int:
    upgrade()
    print(f"database schema at revision {current()}")
    return 0


def register(add: AddCommand) -> None:
    services = add(
        "services", cmd_services, "start, stop or show the embedded PostgreSQL and Redis"
    )
    services.add_argument(
        "action",
        choices=["up", "down", "status", "env"],
        help="env: print `export` lines with the real URLs (passwords included) for "
        '`eval "$(nightshift services env)"`',
    )
    services.add_argument("--json", action="store_true", help="machine-readable output")
    services.add_argument(
        "--force", action="store_true", help="down: stop even with clients connected"
    )

    add("migrate", cmd_migrate, "upgrade the database schema to the latest revision")
