"""Worker hosts for the chaos harness: network namespaces (`ip netns`) joined to this machine by
veth pairs, each with its own address and its own hostname (a UTS namespace), reaching
PostgreSQL, Redis and the sandbox services at one service address on this side.

A partition cuts one host off one service port, both ways: inside the host, traffic to that
port is routed to a next hop whose (permanent, made-up) MAC address nobody has, and on this
side the service's replies to the host likewise, so every packet is dropped silently, like a
firewall DROP (connections hang, they are not refused). Healing removes the rules; TCP's
retransmissions then carry on where they stopped.

Needs root, `ip` (iproute2) and `unshare` (util-linux); `unavailable()` says what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pipeline.chaos.common import ChaosError

PREFIX = "10.231"
"""10.231.<n>.0/24 for network n; .1 is the service address, host i has .4i+1 / .4i+2."""
LOCKS = Path("/run/nightshift-chaos")
NOWHERE_GATEWAY = "10.231.255.254"
NOWHERE_MAC = "02:00:00:00:de:ad"
"""A next hop that no interface answers for: packets routed to it are dropped."""
_FIRST_TABLE = 100
_FIRST_OUTSIDE = 1000
_PORTS_PER_HOST = 4
MAX_HOSTS = 60
MAX_NETWORKS = 120
"""Rule preferences on this side stay below the main table's (32766) for every combination."""


def unavailable() -> str | None:
    """Why worker hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (iproute2, util-linux)"
    return None


def _ip(*args: str, netns: str | None = None, check: bool = True) -> None:
    argv = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise ChaosError(f"`{' '.join(argv)}` failed: {done.stderr.strip()[:300]}")


@dataclass
class Host:
    """One worker host: a network namespace, its veth pair and hostname."""

    network: int
    index: int
    service_address: str
    cut_ports: set[int] = field(default_factory=set)
    _tables: dict[int, int] = field(default_factory=dict)
    """The n-th port ever cut: its routing tables (and rule preferences)."""

    @property
    def netns(self) -> str:
        return f"nsc{self.network}h{self.index}"

    @property
    def hostname(self) -> str:
        return f"chaos-host-{self.index}"

    @property
    def outer(self) -> str:
        """This side of the veth pair (its address is the host's gateway)."""
        return f"{self.netns}o"

    @property
    def inner(self) -> str:
        return f"{self.netns}i"

    @property
    def gateway(self) -> str:
        return f"{PREFIX}.{self.network}.{4 * self.index + 1}"

    @property
    def address(self) -> str:
        return f"{PREFIX}.{self.network}.{4 * self.index + 2}"

    def create(self) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _ip("link", "set", self.inner, "netns", self.netns)
        _ip("addr", "add", f"{self.gateway}/30", "dev", self.outer)
        _ip("link", "set", self.outer, "up")
        for args in (
            ("link", "set", "lo", "up"),
            ("addr", "add", f"{self.address}/30", "dev", self.inner),
            ("link", "set", self.inner, "up"),
            ("route", "add", "default", "via", self.gateway),
            ("neigh", "add", NOWHERE_GATEWAY, "lladdr", NOWHERE_MAC, "dev", self.inner,
             "nud", "permanent"),
        ):  # fmt: skip
            _ip(*args, netns=self.netns)
        _ip("neigh", "add", NOWHERE_GATEWAY, "lladdr", NOWHERE_MAC, "dev", self.outer,
            "nud", "permanent")  # fmt: skip
        # `ip netns exec` mounts these over /etc: the hostname resolves, DNS fails at once.
        etc = Path("/etc/netns") / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost {self.hostname}\n")
        (etc / "resolv.conf").write_text("options timeout:1 attempts:1\n")

    def destroy(self) -> None:
        for port in list(self.cut_ports):
            self.heal(port)
        _ip("netns", "delete", self.netns, check=False)  # takes its end of the veth pair along
        _ip("link", "delete", self.outer, check=False)
        shutil.rmtree(Path("/etc/netns") / self.netns, ignore_errors=True)

    def wrap(self) -> list[str]:
        """The argv prefix that runs a command on this host, under its own hostname."""
        become = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--",
                "sh", "-c", become, self.hostname]  # fmt: skip

    def cut(self, port: int) -> None:
        """Drop every packet between this host and the service on `port` (until `heal`)."""
        inside, outside = self._tables_for(port)
        there = (f"{self.service_address}/32", "via", NOWHERE_GATEWAY, "dev", self.inner)
        _ip("route", "replace", *there, "onlink", "table", inside, netns=self.netns)
        out = ("to", f"{self.service_address}/32", "ipproto", "tcp", "dport", str(port))
        _ip("rule", "add", "pref", inside, *out, "table", inside, netns=self.netns)
        back = (f"{self.address}/32", "via", NOWHERE_GATEWAY, "dev", self.outer)
        _ip("route", "replace", *back, "onlink", "table", outside)
        replies = ("from", f"{self.service_address}/32", "to", f"{self.address}/32",
                   "ipproto", "tcp", "sport", str(port))  # fmt: skip
        _ip("rule", "add", "pref", outside, *replies, "table", outside)
        self.cut_ports.add(port)

    def heal(self, port: int) -> None:
        if port in self.cut_ports:
            inside, outside = self._tables_for(port)
            _ip("rule", "del", "pref", inside, netns=self.netns, check=False)
            _ip("rule", "del", "pref", outside, check=False)
            self.cut_ports.discard(port)

    def _tables_for(self, port: int) -> tuple[str, str]:
        """Routing tables (and rule preferences) for a port: inside the host, and on this side
        (unique per network, host and port: other harnesses' hosts share this side's rules)."""
        n = self._tables.setdefault(port, len(self._tables))
        if n >= _PORTS_PER_HOST:
            raise ChaosError(f"{self.hostname}: at most {_PORTS_PER_HOST} ports can be cut")
        outside = _FIRST_OUTSIDE + _PORTS_PER_HOST * (MAX_HOSTS * self.network + self.index) + n
        return str(_FIRST_TABLE + n), str(outside)


@dataclass
class Network:
    """The service address on this side and the worker hosts; `down()` removes every trace."""

    count: int
    number: int = -1
    hosts: list[Host] = field(default_factory=list)
    _lock: IO[str] | None = None

    @property
    def service_address(self) -> str:
        return f"{PREFIX}.{self.number}.1"

    @property
    def clients(self) -> str:
        """The hosts' network, for PostgreSQL's pg_hba.conf."""
        return f"{PREFIX}.{self.number}.0/24"

    def up(self) -> Network:
        reason = unavailable()
        if reason is not None:
            raise ChaosError(f"worker hosts are not available: {reason}")
        if not 1 <= self.count <= MAX_HOSTS:
            raise ChaosError(f"between 1 and {MAX_HOSTS} worker hosts, not {self.count}")
        self.number = self._reserve()
        try:
            _ip("addr", "add", f"{self.service_address}/32", "dev", "lo")
            for index in range(1, self.count + 1):
                host = Host(self.number, index, self.service_address)
                host.destroy()  # a leftover of a harness that was killed
                self.hosts.append(host)
                host.create()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for host in self.hosts:
            host.destroy()
        self.hosts.clear()
        if self.number >= 0:
            _ip("addr", "del", f"{self.service_address}/32", "dev", "lo", check=False)
        if self._lock is not None:
            self._lock.close()  # releases the network's number
            self._lock = None

    def _reserve(self) -> int:
        """A network number no other harness on this machine holds (a lock file each)."""
        LOCKS.mkdir(parents=True, exist_ok=True)
        for number in range(1, MAX_NETWORKS + 1):
            handle = (LOCKS / f"net-{number}.lock").open("a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self._lock = handle
            with contextlib.suppress(ChaosError):  # a killed harness's address
                _ip("addr", "del", f"{PREFIX}.{number}.1/32", "dev", "lo")
            return number
        raise ChaosError(f"no free chaos network under {LOCKS}")
