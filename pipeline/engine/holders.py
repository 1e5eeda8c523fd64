"""Who holds a lease: `host:pid:thread:scope.started`, and whether that process is certainly gone.

A hostname and a pid do not name a process: containers share hostnames (a replica set's pods,
two `docker run --hostname worker`), each has its own pid namespace, and pids are reused. So
the owner also says where its pid means something (`scope`: the kernel's boot id and the pid
namespace) and when that process started (its start time in clock ticks since boot). Another
worker trusts a pid only in the same scope, and takes a dead holder's run at once only when
that pid is gone, a zombie, or now names a process that started at another time.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    thread: str
    scope: str
    started: int

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.thread}:{self.scope}.{self.started}"

    @classmethod
    def parse(cls, owner: str) -> Holder | None:
        """The holder an owner string names; None for one in another format (an older worker,
        a test's made-up owner): such a holder is never declared dead."""
        host, _, rest = owner.partition(":")
        pid, _, rest = rest.partition(":")
        thread, _, identity = rest.rpartition(":")
        scope, _, started = identity.partition(".")
        if not (host and pid.isdigit() and thread and scope and started.isdigit()):
            return None
        return cls(host, int(pid), thread, scope, int(started))


def holder_here(thread: str) -> Holder:
    """This process, as a lease owner (`thread` tells its steps apart)."""
    return _holder(os.getpid(), thread)


@cache
def _holder(pid: int, thread: str) -> Holder:
    """Once a process and thread (a step asks for it each time; a forked child has its pid)."""
    return Holder(socket.gethostname(), pid, thread, scope_here() or "-", _own_start(pid))


def is_certainly_gone(owner: str) -> bool:
    """True only when `owner` was a process whose pid this process can check and that process
    no longer runs. Unknown formats, other scopes (another machine, container or pid
    namespace) and anything unreadable are False: their lease must lapse instead."""
    holder = Holder.parse(owner)
    here = scope_here()
    if holder is None or here is None or holder.scope != here:
        return False
    return _start_time(holder.pid, live_only=True) != holder.started


@cache
def scope_here() -> str | None:
    """Where a pid names one process: this boot of this kernel and this pid namespace
    (None where /proc cannot tell, e.g. not Linux: then no pid is trusted)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:12]


@cache
def _own_start(pid: int) -> int:
    return _start_time(pid) or 0  # keyed by pid: a forked pool child has its own


def _start_time(pid: int, *, live_only: bool = False) -> int | None:
    """The process's start time (clock ticks after boot), None if there is no such process
    (or, with `live_only`, it is a zombie: it exited and can write nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if live_only and fields[0] in ("Z", "X"):
        return None
    return int(fields[19])
