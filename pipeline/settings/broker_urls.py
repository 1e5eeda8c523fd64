"""The broker URL forms nightshift takes, read once here for Celery and for nightshift's own
Redis clients (queue depth, health), so that both reach the same Redis.

- `redis://[user:password@]host:6379/0`, and `rediss://` for TLS;
- Redis Sentinel, as kombu's transport and Celery's result backend read it:
  `sentinel://[user:password@]host:26379/0;sentinel://host2:26379;...`, with the master's
  name in NIGHTSHIFT_BROKER_SENTINEL_MASTER. The user, password and database of the first
  address are the master's (its `requirepass`); the sentinels' own password, if they have one,
  is NIGHTSHIFT_BROKER_SENTINEL_PASSWORD. Every client asks the sentinels for the master on
  each new connection, so a promoted replica is followed. With NIGHTSHIFT_BROKER_SENTINEL_TLS
  the sentinels and the servers speak TLS (`tls_options`): kombu's and Celery's sentinel
  clients take no TLS options in the URL, only in their settings.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pipeline.errors import SettingsError

SENTINEL = "sentinel"
_REDIS = ("redis", "rediss")
EXAMPLE = "redis://host:6379/0"
SENTINELS_EXAMPLE = "sentinel://host1:26379;sentinel://host2:26379"
SENTINEL_PORT = 26379


def broker_url(name: str, raw: str) -> str:
    """`raw` if it is a Redis or Sentinel URL, else a one-line error naming `name`."""
    raw = raw.strip()
    if raw.split("://", 1)[0] == SENTINEL:
        sentinels_of(raw, name)
        return raw
    parts = urlsplit(raw)
    if parts.scheme not in _REDIS or not parts.hostname:
        raise SettingsError(
            f"{name} must look like {EXAMPLE} or, through Redis Sentinel, {SENTINELS_EXAMPLE} "
            f"(got a value with scheme {parts.scheme or 'none'!r} and host "
            f"{parts.hostname or 'none'!r})"
        )
    return raw


@dataclass(frozen=True)
class Sentinels:
    """A `sentinel://` URL read: where the sentinels listen, and the master's credentials and
    database (those of the first address, as kombu and Celery take them)."""

    addresses: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None

    def __str__(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self.addresses)


def sentinels_of(url: str, name: str = "NIGHTSHIFT_BROKER_URL") -> Sentinels:
    addresses = []
    first = None
    for piece in url.strip().split(";"):
        parts = urlsplit(piece.strip())
        try:
            port = parts.port or SENTINEL_PORT
        except ValueError:
            port = 0
        if parts.scheme != SENTINEL or not parts.hostname or not port:
            raise SettingsError(
                f"{name}: each address of a Sentinel URL must look like sentinel://host:26379, "
                f"separated by ';' (got one with scheme {parts.scheme or 'none'!r} and host "
                f"{parts.hostname or 'none'!r})"
            )
        if parts.query:
            raise SettingsError(
                f"{name}: a Sentinel URL takes no options after '?' (for TLS through Sentinel "
                "set NIGHTSHIFT_BROKER_SENTINEL_TLS and NIGHTSHIFT_BROKER_SENTINEL_TLS_CA)"
            )
        addresses.append((parts.hostname, port))
        first = first or parts
    assert first is not None  # split() gives at least one piece
    db = first.path.strip("/") or "0"
    if not db.isdigit():
        raise SettingsError(f"{name}: the database of a Sentinel URL is a number (got {db!r})")
    return Sentinels(tuple(addresses), int(db), first.username or None, first.password or None)


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL + "://")


def tls_options(ca: Path | None) -> dict[str, Any]:
    """redis-py's TLS keywords for a verified connection, as Celery's `broker_use_ssl` and
    `redis_backend_use_ssl` take them (`ssl_cert_reqs` as the `ssl` constant both read):
    the certificate must chain to `ca` (else to the system's CAs) and name the host."""
    options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if ca is not None:
        options["ssl_ca_certs"] = str(ca)
    return options
