"""The chaos harness's injector: fires the planned faults at their times, each at a target
chosen among what exists then, and tells the sampler which runs it took from their workers."""

from __future__ import annotations

import heapq
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import text

from pipeline.app import send_step
from pipeline.chaos.common import NoTarget, retrying
from pipeline.chaos.faults import (
    RETRIES,
    RETRY_SECONDS,
    Approvals,
    Fault,
    FaultRecord,
    pending_approvals,
)
from pipeline.db import transaction

if TYPE_CHECKING:
    from pipeline.chaos.cluster import Cluster
    from pipeline.chaos.harness import Sampler

SEND_WAIT_SECONDS = 15.0
"""postgres_in_send: how long to wait for a send to be in flight before giving up."""
_IN_FLIGHT = text(
    "SELECT a.run_id, r.fence FROM actions a JOIN runs r ON r.id = a.run_id"
    " WHERE a.state = 'attempted' AND a.last_attempt_at > now() - interval '1 second'"
)


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
        results = self.approvals.fire(key, times=2, same=True)
        answers = [r for r in results if not isinstance(r, Exception)]
        firsts = sum(1 for r in answers if r.first)
        replays = sum(1 for r in answers if r.replay)
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]
        run_ids = {r.run_id for r in answers if r.run_id}
        record.target, record.affected = key, sorted(run_ids)
        record.note = f"first decisions: {firsts}; refused as replays: {replays}" + (
            f"; errors: {errors}" if errors else ""
        )

    def _cut_postgres(self, fault: Fault, record: FaultRecord) -> None:
        self._cut("postgres", fault, record)

    def _cut_redis(self, fault: Fault, record: FaultRecord) -> None:
        self._cut("redis", fault, record)

    def _cut(self, service: str, fault: Fault, record: FaultRecord) -> None:
        host = self.cluster.uncut_host(service, fault.pick)
        started = time.monotonic()
        self.cluster.cut(host, service, fault.hold)
        record.target = f"{host.hostname} cut off from {service} for {fault.hold:.1f}s"
        self._watch(record, self.cluster.pids_on(host), started)

    def _wipe(self, fault: Fault, record: FaultRecord) -> None:
        running = self.sampler.running_fences()
        started = time.monotonic()
        if fault.mode == "fresh":
            down = self.cluster.restart("redis", "kill", fault.hold, forget=True)
            record.target = f"redis replaced by an empty one (unreachable {down:.1f}s)"
        else:
            self.cluster.flush_broker()
            record.target = "redis FLUSHALL"
        record.affected = [str(run) for run, _ in running]
        self.sampler.watch(running, fault.kind, started)

    def _slow_service(self, fault: Fault, record: FaultRecord) -> None:
        self.cluster.misbehave(fault.mode, fault.hold, delay_seconds=fault.delay)
        self.sampler.watch_sends(fault.kind, fault.mode, time.monotonic(), fault.hold)
        record.target = (
            f"{fault.mode} answers {fault.delay:.1f}s after doing the work, for {fault.hold:.1f}s"
        )

    def _lying_service(self, fault: Fault, record: FaultRecord) -> None:
        self.cluster.misbehave(fault.mode, fault.hold, status_after_work=503)
        self.sampler.watch_sends(fault.kind, fault.mode, time.monotonic(), fault.hold)
        record.target = f"{fault.mode} does the work and answers 503, for {fault.hold:.1f}s"

    def _model_outage(self, fault: Fault, record: FaultRecord) -> None:
        retry_after = fault.delay or None
        self.cluster.model_outage(int(fault.mode), fault.hold, retry_after)
        asks = f" with retry-after {retry_after:.0f}s" if retry_after else ""
        record.target = f"the Messages API answers {fault.mode}{asks} for {fault.hold:.1f}s"

    def _postgres_in_send(self, fault: Fault, record: FaultRecord) -> None:
        deadline = time.monotonic() + SEND_WAIT_SECONDS
        while not (sending := retrying(_sends_in_flight)):
            if time.monotonic() > deadline or self.stopping.wait(0.02):
                raise NoTarget("no side effect's send in flight")
        held = self.cluster.held_runs()
        started = time.monotonic()
        down = self.cluster.restart("postgres", fault.mode, fault.hold)
        record.target = f"postgres ({fault.mode}, unreachable {down:.1f}s) during a send"
        hit = {*sending, *((run, fence) for runs in held.values() for run, fence in runs)}
        record.affected = sorted(str(run) for run, _ in hit)
        self.sampler.watch(sorted(hit), fault.kind, started)

    def _watch(self, record: FaultRecord, pids: set[int], started: float) -> None:
        """The runs those processes held right after the fault: they must be taken over."""
        held = self.cluster.held_runs()
        hit = [(run, fence) for pid in pids for run, fence in held.get(pid, [])]
        record.affected = [str(run) for run, _ in hit]
        self.sampler.watch(hit, record.fault.kind, started)


def _sends_in_flight() -> list[tuple[uuid.UUID, int]]:
    """(run, fence) of the runs whose side effect is being sent right now."""
    with transaction() as session:
        return [(row.run_id, row.fence) for row in session.execute(_IN_FLIGHT)]
