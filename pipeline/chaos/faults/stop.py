"""stop: SIGSTOP a worker past its lease, then SIGCONT it."""

from __future__ import annotations

import random
import time

from pipeline.chaos.faults.base import Draw, Fault, FaultKind, FaultRecord, Scene


class Stop(FaultKind):
    """Freeze a worker past its lease (`hold` seconds); its runs are taken over, and what it
    writes when it thaws must be refused."""

    name = "stop"
    draw_order = 1
    weight = 2
    interrupts = True

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        # Past the lease, and sometimes past the doubled lease of a send in flight.
        return Draw(hold=rng.uniform(lease_seconds + 1, lease_seconds * 3))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        started = time.monotonic()
        slot, _ = scene.cluster.choose_worker(fault.pick)
        frozen = scene.cluster.freeze(slot, fault.hold)
        record.target = f"{slot.name} (pid {slot.pid}) for {fault.hold:.1f}s"
        scene.watch_pids(record, frozen, started)
