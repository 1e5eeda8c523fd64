"""The data directory's lock and its ports: each server keeps its port (services.json) while it
is free, so URLs stay the same across restarts."""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
from collections.abc import Iterator
from pathlib import Path

from pipeline.embedded.server import HOST


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    # flock belongs to the open file, so threads of one process exclude each other too; the
    # descriptor is close-on-exec, so the servers we start never inherit the lock.
    with (root / "services.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stored_ports(root: Path) -> dict[str, int]:
    try:
        raw = json.loads((root / "services.json").read_text())
        return {name: int(entry["port"]) for name, entry in raw.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def choose_port(root: Path, name: str) -> int:
    """The port stored for `name` if it is still free, else a new free one (then stored)."""
    ports = stored_ports(root)
    others = {port for other, port in ports.items() if other != name}
    stored = ports.get(name)
    if stored is not None and stored not in others and bindable(stored):
        return stored
    while (port := bindable(0)) in others:
        pass
    ports[name] = port
    tmp = root / "services.json.tmp"
    tmp.write_text(json.dumps({n: {"port": p} for n, p in ports.items()}, indent=2))
    tmp.replace(root / "services.json")
    return port


def bindable(port: int) -> int:
    """`port` (or, for 0, a fresh one) if it can be bound on HOST now, else 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            sock.bind((HOST, port))
        except OSError:
            return 0
        return int(sock.getsockname()[1])
