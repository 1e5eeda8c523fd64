"""The chaos harness's injector: fires the planned faults at their times, each through its kind
(pipeline/chaos/faults/) at a target chosen among what exists then."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from pipeline.chaos.approvals import Approvals
from pipeline.chaos.common import NoTarget
from pipeline.chaos.faults import fault_kind
from pipeline.chaos.faults.base import Fault, FaultRecord, Scene

if TYPE_CHECKING:
    from pipeline.chaos.cluster import Cluster
    from pipeline.chaos.harness import Sampler

RETRIES, RETRY_SECONDS = 3, 4.0
"""A fault with no target (no pending approval, no busy worker) is tried again this often."""


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
        self.clock = clock
        self.records: list[FaultRecord] = []
        self.stopping = threading.Event()
        self.scene = Scene(cluster, sampler, approvals, self.stopping)

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
        try:
            fault_kind(fault.kind).inject(self.scene, fault, record)
        except NoTarget as exc:
            record.injected, record.note = False, f"skipped: {exc}"
        except Exception as exc:  # a fault that failed is reported, the run goes on
            record.injected, record.note = False, f"failed: {type(exc).__name__}: {exc}"
        return record
