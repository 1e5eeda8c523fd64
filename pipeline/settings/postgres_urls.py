"""The PostgreSQL URL forms nightshift takes, and the one way each is read: SQLAlchemy's URL for
the pool, libpq's connection string for the connections outside it (LISTEN, health checks).

Accepted, one host or several (a failover: libpq tries them in turn, and with
`target_session_attrs=read-write` skips a standby):
- `postgresql://user:pw@host:5432/db`, and libpq's URI with several hosts,
  `postgresql://user@a:5432,b:5433/db?target_session_attrs=read-write`;
- libpq's host lists in the query, `postgresql://user@/db?host=a,b&port=5432,5433`;
- SQLAlchemy's multi-host form, `postgresql://user@/db?host=a:5432&host=b:5433`;
- libpq's key=value string, `host=a,b port=5432,5433 dbname=db user=u`.
SQLAlchemy's URL parser cannot read the first multi-host URI nor a key=value string: those two
are rewritten into the host lists of the query form, which both libraries read.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import psycopg
from sqlalchemy import URL, make_url
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import ArgumentError

from pipeline.errors import SettingsError

DRIVER = "postgresql+psycopg"
EXAMPLE = "postgresql://user@host:5432/dbname"
SEVERAL_HOSTS = "postgresql://user@a:5432,b:5432/dbname?target_session_attrs=read-write"
_SCHEMES = ("postgresql", "postgres")


def postgres_url(name: str, raw: str) -> str:
    """`raw` as the URL SQLAlchemy is given (the psycopg 3 driver), or a one-line error naming
    the variable, the form it got and the form to use."""
    raw = raw.strip()
    scheme, found, rest = raw.partition("://")
    if not found:
        url = _from_params(name, _libpq_parse(name, raw, "a key=value string"))
    elif scheme.split("+", 1)[0] not in _SCHEMES:
        raise SettingsError(
            f"{name} must look like {EXAMPLE} (got a value with scheme {scheme or 'none'!r}); "
            f"several hosts: {SEVERAL_HOSTS}"
        )
    elif "," in _hosts_part(rest):
        url = _from_params(name, _libpq_parse(name, "postgresql://" + rest, "a multi-host URI"))
    else:
        url = _sqlalchemy_url(name, DRIVER + "://" + rest)
    params = libpq_params(url, name)
    if not params.get("host"):
        raise SettingsError(f"{name} names no host: it must look like {EXAMPLE}")
    _check_ports(name, params)
    return url


def libpq_params(url: str, name: str = "the database URL") -> dict[str, Any]:
    """The keywords psycopg connects with: what SQLAlchemy's pool passes, so that a connection
    outside it goes where the pool's go."""
    try:
        _, params = PGDialect_psycopg().create_connect_args(make_url(url))
    except (ArgumentError, ValueError) as exc:
        raise SettingsError(f"{name}: {_first_line(exc)}; several hosts: {SEVERAL_HOSTS}") from None
    return {key: str(value) for key, value in params.items() if value is not None}


def conninfo(url: str) -> str:
    """`url` as libpq's connection string (passwords included: for connecting, never shown)."""
    return psycopg.conninfo.make_conninfo("", **libpq_params(url))


def where(url: str) -> str:
    """The hosts, ports and database, for a message: `a:5432,b:5433/nightshift`."""
    params = libpq_params(url)
    hosts = params.get("host", "localhost").split(",")
    ports = params.get("port", "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    pairs = zip(hosts, ports, strict=True)
    shown = ",".join(f"{host}:{port}" if port else host for host, port in pairs)
    return f"{shown}/{params.get('dbname', '')}"


def _hosts_part(rest: str) -> str:
    """What stands between `scheme://` (and any user@) and the database's path."""
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    return authority.rsplit("@", 1)[-1]


def _libpq_parse(name: str, raw: str, form: str) -> dict[str, str]:
    try:
        return psycopg.conninfo.conninfo_to_dict(raw)  # type: ignore[return-value]
    except psycopg.ProgrammingError as exc:
        # libpq's message may quote any part of the string, the password too: only an
        # unknown keyword's is shown.
        line = _first_line(exc)
        why = f" ({line})" if line.startswith("invalid connection option") else ""
        raise SettingsError(
            f"{name} is {form} libpq cannot read{why}; it must look like {EXAMPLE}, or for "
            f"several hosts {SEVERAL_HOSTS}"
        ) from None


def _from_params(name: str, params: dict[str, str]) -> str:
    """libpq's keywords as a SQLAlchemy URL: one host in its place, several in the query."""
    params = {key: str(value) for key, value in params.items()}
    if params.get("host"):
        _check_ports(name, params)
    host, port = params.pop("host", ""), params.pop("port", "")
    user, password = params.pop("user", None), params.pop("password", None)
    database = params.pop("dbname", None)
    if "," in host or "," in port or host.startswith("/"):  # a list, or a socket's directory
        params = {"host": host, **({"port": port} if port else {}), **params}
        host, port = "", ""
    try:
        url = URL.create(
            DRIVER,
            username=user,
            password=password,
            host=host or None,
            port=int(port) if port else None,
            database=database,
            query=params,
        )
    except ValueError:
        raise SettingsError(f"{name}: port {port!r} is not a number") from None
    return url.render_as_string(hide_password=False)


def _sqlalchemy_url(name: str, raw: str) -> str:
    try:
        make_url(raw)
    except (ArgumentError, ValueError):  # its message quotes the URL, password included
        host = urlsplit(raw).netloc.rsplit("@", 1)[-1]
        raise SettingsError(
            f"{name} must look like {EXAMPLE} (SQLAlchemy cannot read the one given, host {host!r})"
        ) from None
    return raw


def _check_ports(name: str, params: dict[str, Any]) -> None:
    hosts = params["host"].split(",")
    ports = params.get("port", "").split(",")
    if len(ports) > 1 and len(ports) != len(hosts):
        raise SettingsError(
            f"{name} names {len(hosts)} hosts and {len(ports)} ports: give one port for all, or "
            f"one per host ({SEVERAL_HOSTS})"
        )
    for port in ports:
        if port and not port.isdigit():
            raise SettingsError(f"{name}: port {port!r} is not a number")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
