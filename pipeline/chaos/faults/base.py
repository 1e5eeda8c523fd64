"""What every fault kind is and shares: a planned fault, the record of its firing, the kind's
class (its name, weight, how it draws its parameters from the seed, how it strikes), and the
scene it strikes in."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pipeline.chaos.approvals import Approvals
    from pipeline.chaos.cluster import Cluster
    from pipeline.chaos.harness import Sampler

SERVICES = ("email", "pricing", "githost")
"""The sandbox services side effects go to."""


@dataclass(frozen=True)
class Fault:
    """One planned fault. Its target is chosen when it fires, among what exists then."""

    index: int
    at: float
    """Seconds after the workload started."""
    kind: str
    pick: float
    """Which target, in [0, 1): an index into the sorted candidates at firing time."""
    hold: float = 0.0
    """How long it lasts (a kind's `Draw` says what that is for it)."""
    mode: str = ""
    """How it strikes (its kind's word: worker|child, term|kill, a service's name...)."""
    delay: float = 0.0
    """A second duration some kinds draw (a reply's delay, a retry-after)."""


@dataclass(frozen=True)
class Draw:
    """What a kind draws from the seed for one fault: its `hold`, `mode` and `delay`."""

    hold: float = 0.0
    mode: str = ""
    delay: float = 0.0


@dataclass
class FaultRecord:
    """What happened when a fault fired."""

    fault: Fault
    fired_at: float
    injected: bool
    wall: str = ""
    """Wall-clock time it fired, to line it up with the worker logs."""
    target: str = ""
    affected: list[str] = field(default_factory=list)
    """Runs the fault hit: held by the frozen or killed worker, in flight during a restart,
    sent twice, or approved twice."""
    note: str = ""


@dataclass(frozen=True)
class Scene:
    """What a fault strikes and tells: the cluster, the sampler that times each interrupted
    run's next claim, the approvals the harness fires, and whether the harness is stopping."""

    cluster: Cluster
    sampler: Sampler
    approvals: Approvals
    stopping: threading.Event

    def watch_pids(self, record: FaultRecord, pids: set[int], started: float) -> None:
        """The runs those processes held right after the fault: they must be taken over."""
        held = self.cluster.held_runs()
        hit = [(run, fence) for pid in pids for run, fence in held.get(pid, [])]
        record.affected = [str(run) for run, _ in hit]
        self.sampler.watch(hit, record.fault.kind, started)


class FaultKind:
    """A kind of fault: one subclass a module of pipeline/chaos/faults/, found there by name.

    Its docstring says what it does; the report, the CLI and the plan learn the rest here."""

    name: ClassVar[str] = ""
    """What `--faults` and the report call it (empty: an abstract kind, not registered)."""
    draw_order: ClassVar[int]
    """Its place among the kinds when a schedule is drawn: a seed's schedule depends on it, so
    a new kind takes the next free number and every seed keeps the schedule it had."""
    weight: ClassVar[float]
    """Its default weight in `--faults`."""
    interrupts: ClassVar[bool] = False
    """It takes runs away from their worker: the report times their next claim."""
    needs_hosts: ClassVar[bool] = False
    """It needs worker hosts (network namespaces); without them its weight is 0."""
    needs_sentinels: ClassVar[bool] = False
    """It needs Redis behind Sentinel (a master, its replica, three sentinels): the cluster's
    broker is then that instead of one embedded Redis."""
    tally: ClassVar[str] = ""
    """What the report's "of which" line counts it as (partitions, broker wipes)."""
    delay_words: ClassVar[str] = "replies after"
    """How a planned fault's `delay` reads."""

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        """Its parameters, from the schedule's random numbers (nothing to draw by default)."""
        return Draw()

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        """Strike now, filling in `record` (target, runs affected); raises NoTarget when there
        is nothing to strike yet."""
        raise NotImplementedError

    def describe(self, fault: Fault) -> str:
        delay = f"{self.delay_words} {fault.delay:.1f}s" if fault.delay else ""
        hold = f"{fault.hold:.1f}s" if fault.hold else ""
        extra = " ".join(x for x in (fault.mode, hold, delay) if x)
        return f"#{fault.index:03d} +{fault.at:6.1f}s {fault.kind}" + (
            f" ({extra})" if extra else ""
        )


# -- what several kinds are --------------------------------------------------------------------


class ServerRestart(FaultKind):
    """Restart PostgreSQL or Redis (`mode` how, down `hold` seconds): the runs in flight must
    resume."""

    server: ClassVar[str]
    modes: ClassVar[tuple[str, ...]]
    """How it may stop, drawn evenly (a mode listed twice is drawn twice as often)."""
    interrupts = True

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        mode = rng.choice(self.modes)
        return Draw(mode=mode, hold=rng.uniform(0, 2))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        held = scene.cluster.held_runs()
        started = time.monotonic()
        down = scene.cluster.restart(self.server, fault.mode, fault.hold)
        record.target = f"{self.server} ({fault.mode}, unreachable {down:.1f}s)"
        in_flight = [(run, fence) for runs in held.values() for run, fence in runs]
        record.affected = [str(run) for run, _ in in_flight]
        scene.sampler.watch(in_flight, fault.kind, started)


class Partition(FaultKind):
    """Cut a worker host off from PostgreSQL or Redis (`service`) for `hold` seconds, past the
    lease, then heal it."""

    service: ClassVar[str]
    interrupts = True
    needs_hosts = True
    tally = "partitions"

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        return Draw(hold=rng.uniform(lease_seconds + 1, lease_seconds * 4))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        host = scene.cluster.uncut_host(self.service, fault.pick)
        started = time.monotonic()
        scene.cluster.cut(host, self.service, fault.hold)
        record.target = f"{host.hostname} cut off from {self.service} for {fault.hold:.1f}s"
        scene.watch_pids(record, scene.cluster.pids_on(host), started)
