"""The chaos harness's faults: a schedule drawn up front from the seed, and how each kind is
injected (SIGKILL or SIGSTOP a worker, restart Redis or PostgreSQL, deliver a step message
twice, fire an approval webhook twice at once)."""

from __future__ import annotations

import hashlib
import heapq
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from pipeline.app import send_step
from pipeline.chaos.common import ChaosError, NoTarget, retrying
from pipeline.db import transaction
from pipeline.runs.decisions import Actor, decide

if TYPE_CHECKING:
    from pipeline.chaos.cluster import Cluster
    from pipeline.chaos.harness import Sampler

KINDS = ("kill", "stop", "redis", "postgres", "duplicate", "webhook")
DEFAULT_WEIGHTS = "kill=3,stop=2,redis=1,postgres=1,duplicate=2,webhook=2"
RETRIES, RETRY_SECONDS = 3, 4.0
"""A fault with no target (no pending approval, no busy worker) is tried again this often."""
RESUMABLE = frozenset({"kill", "stop", "redis", "postgres"})
"""Kinds that take a run away from its worker: the time until its next claim is measured."""


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
    """stop: seconds frozen; redis/postgres: seconds down between stop and start."""
    mode: str = ""
    """kill: worker|child; redis: term|kill; postgres: fast|immediate."""

    def describe(self) -> str:
        extra = " ".join(x for x in (self.mode, f"{self.hold:.1f}s" if self.hold else "") if x)
        return f"#{self.index:03d} +{self.at:6.1f}s {self.kind}" + (f" ({extra})" if extra else "")


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


def write_fault_log(path: Path, records: list[FaultRecord]) -> None:
    """One line per fault as it fired: when, what it hit, which runs."""
    lines = []
    for r in records:
        outcome = "injected" if r.injected else "not injected"
        lines.append(
            f"{r.wall} {r.fault.describe()} fired +{r.fired_at:.1f}s {outcome}: {r.target or '-'}"
            + (f" runs={','.join(r.affected)}" if r.affected else "")
            + (f" [{r.note}]" if r.note else "")
        )
    path.write_text("\n".join(lines) + "\n")


def parse_weights(text: str) -> dict[str, float]:
    """`kill=3,stop=2` -> {"kill": 3.0, "stop": 2.0, others: 0}."""
    weights = dict.fromkeys(KINDS, 0.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in weights:
            raise ChaosError(f"unknown fault kind {name!r}; known: {', '.join(KINDS)}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ChaosError(f"fault weight for {name} must be a number (got {value!r})") from None
        if weights[name] < 0:
            raise ChaosError(f"fault weight for {name} must not be negative")
    if not any(weights.values()):
        raise ChaosError("at least one fault kind needs a positive weight")
    return weights


def plan_faults(
    seed: int, duration: float, rate: float, weights: Mapping[str, float], lease_seconds: float
) -> list[Fault]:
    """The whole schedule, from the seed alone: the same seed gives the same faults.

    `rate` faults a minute; every kind with a positive weight appears at least once (when
    there are enough faults), the rest are drawn by weight. Times are spread over the run,
    after a short warm-up and before the very end.
    """
    rng = random.Random(seed)
    count = max(1, round(rate * duration / 60))
    kinds = [k for k in KINDS if weights.get(k, 0) > 0]
    drawn = kinds[:count] + rng.choices(
        kinds, [weights[k] for k in kinds], k=max(0, count - len(kinds))
    )
    rng.shuffle(drawn)
    start, end = min(10.0, duration * 0.05), duration * 0.97
    times = sorted(rng.uniform(start, end) for _ in drawn)
    faults = []
    for index, (at, kind) in enumerate(zip(times, drawn, strict=True)):
        pick, hold, mode = rng.random(), 0.0, ""
        if kind == "kill":
            mode = rng.choice(("worker", "child"))
        elif kind == "stop":
            # Past the lease, and sometimes past the doubled lease of a send in flight.
            hold = rng.uniform(lease_seconds + 1, lease_seconds * 3)
        elif kind == "redis":
            mode, hold = rng.choice(("term", "term", "kill")), rng.uniform(0, 2)
        elif kind == "postgres":
            mode, hold = rng.choice(("fast", "fast", "immediate")), rng.uniform(0, 2)
        faults.append(Fault(index, round(at, 3), kind, round(pick, 6), round(hold, 3), mode))
    return faults


def schedule_hash(faults: list[Fault]) -> str:
    text = json.dumps([asdict(f) for f in faults], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pending_approvals() -> list[str]:
    """Keys of the actions waiting for a person's approval, oldest first."""

    query = text(
        "SELECT idempotency_key FROM actions WHERE state = 'pending_approval' ORDER BY created_at"
    )
    with transaction() as session:
        return list(session.scalars(query))


APPROVER = "chaos-approver@example.com"
"""Named as the approver of every approval-requiring tool on the harness's workers."""


class Approvals:
    """Every approval the harness fires (the workload's and the webhook faults'), to check
    that exactly one decision per action came back as the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.firsts: Counter[str] = Counter()
        self.calls = 0
        self.concurrent = 0
        """Approvals fired from two threads at the same instant."""
        self.errors: list[str] = []
        self.log: list[str] = []
        """One line per call: wall-clock time, key, outcome (written to approvals.txt)."""

    def fire(self, key: str, times: int = 1) -> list[Any]:
        """Approve `key` from `times` threads at the same instant (a webhook fired twice).

        Returns each call's DecisionResult, or the exception it raised.
        """

        barrier = threading.Barrier(times)
        results: list[Any] = [None] * times

        def call(i: int) -> None:
            barrier.wait()
            try:
                results[i] = decide(key, "approve", Actor(APPROVER, f"chaos harness {i}"))
            except Exception as exc:  # reported, not raised: the harness keeps going
                results[i] = exc

        threads = [threading.Thread(target=call, args=(i,)) for i in range(times)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        now = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        with self.lock:
            self.calls += times
            self.concurrent += times > 1
            for result in results:
                if isinstance(result, Exception):
                    outcome = f"{type(result).__name__}: {str(result).splitlines()[0][:200]}"
                    self.errors.append(f"{key}: {outcome}")
                else:
                    self.firsts[key] += result.first
                    outcome = f"first={result.first} state={result.state}"
                self.log.append(f"{now} {key} x{times}: {outcome}")
        return results

    def doubled(self) -> list[str]:
        """Actions approved as the first decision more than once: single use was broken."""
        with self.lock:
            return sorted(key for key, count in self.firsts.items() if count > 1)


class Injector:
    """Fires the planned faults at their times, in order, from its own thread."""

    def __init__(
        self,
        plan: list[Fault],
        cluster: Cluster,
        sampler: Sampler,
        clock: Callable[[], float],
        approvals: Approvals,
    ) -> None:
        self.plan = plan
        self.cluster = cluster
        self.sampler = sampler
        self.clock = clock
        self.approvals = approvals
        self.records: list[FaultRecord] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        # (when, index, fault, tries): a fault with nothing to hit yet comes back a bit later.
        queue = [(f.at, f.index, f, 0) for f in self.plan]
        while queue:
            at, _, fault, tries = heapq.heappop(queue)
            while self.clock() < at:
                if self.stopping.wait(min(0.1, at - self.clock())):
                    return
            if self.stopping.is_set():
                return
            record = self.inject(fault)
            if record.note.startswith("skipped") and tries < RETRIES:
                heapq.heappush(queue, (self.clock() + RETRY_SECONDS, fault.index, fault, tries + 1))
            else:
                self.records.append(record)

    def inject(self, fault: Fault) -> FaultRecord:
        wall = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        record = FaultRecord(fault, round(self.clock(), 3), injected=True, wall=wall)
        handler = getattr(self, f"_{fault.kind}")
        try:
            handler(fault, record)
        except NoTarget as exc:
            record.injected, record.note = False, f"skipped: {exc}"
        except Exception as exc:  # a fault that failed is reported, the run goes on
            record.injected, record.note = False, f"failed: {type(exc).__name__}: {exc}"
        return record

    # -- one handler per kind ----------------------------------------------------------------

    def _kill(self, fault: Fault, record: FaultRecord) -> None:
        started = time.monotonic()
        slot, child = self.cluster.choose_worker(fault.pick)
        if child is not None and fault.mode == "child":
            record.target = f"{slot.name} pool child {child}"
            dead = {child}
            self.cluster.kill_child(slot, child)
        else:
            record.target = f"{slot.name} (pid {slot.pid})"
            dead = self.cluster.kill(slot)
        self._watch(record, dead, started)

    def _stop(self, fault: Fault, record: FaultRecord) -> None:
        started = time.monotonic()
        slot, _ = self.cluster.choose_worker(fault.pick)
        frozen = self.cluster.freeze(slot, fault.hold)
        record.target = f"{slot.name} (pid {slot.pid}) for {fault.hold:.1f}s"
        self._watch(record, frozen, started)

    def _redis(self, fault: Fault, record: FaultRecord) -> None:
        self._restart("redis", fault, record)

    def _postgres(self, fault: Fault, record: FaultRecord) -> None:
        self._restart("postgres", fault, record)

    def _restart(self, name: str, fault: Fault, record: FaultRecord) -> None:
        held = self.cluster.held_runs()
        started = time.monotonic()
        down = self.cluster.restart(name, fault.mode, fault.hold)
        record.target = f"{name} ({fault.mode}, unreachable {down:.1f}s)"
        in_flight = [(run, fence) for runs in held.values() for run, fence in runs]
        record.affected = [str(run) for run, _ in in_flight]
        self.sampler.watch(in_flight, fault.kind, started)

    def _duplicate(self, fault: Fault, record: FaultRecord) -> None:
        running = sorted(self.sampler.running())
        if not running:
            raise NoTarget("no running run to send twice")
        run_id = running[int(fault.pick * len(running))]
        for _ in range(2):
            retrying(lambda: send_step(run_id, agent="(sent twice by chaos)"))
        record.target, record.affected = f"run {run_id}", [str(run_id)]

    def _webhook(self, fault: Fault, record: FaultRecord) -> None:
        keys = sorted(retrying(pending_approvals))
        if not keys:
            raise NoTarget("no approval pending")
        key = keys[int(fault.pick * len(keys))]
        results = self.approvals.fire(key, times=2)
        firsts = sum(1 for r in results if getattr(r, "first", False))
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]
        run_ids = {str(r.run_id) for r in results if hasattr(r, "run_id")}
        record.target, record.affected = key, sorted(run_ids)
        record.note = f"first decisions: {firsts}" + (f"; errors: {errors}" if errors else "")

    def _watch(self, record: FaultRecord, pids: set[int], started: float) -> None:
        """The runs those processes held right after the fault: they must be taken over."""
        held = self.cluster.held_runs()
        hit = [(run, fence) for pid in pids for run, fence in held.get(pid, [])]
        record.affected = [str(run) for run, _ in hit]
        self.sampler.watch(hit, record.fault.kind, started)
