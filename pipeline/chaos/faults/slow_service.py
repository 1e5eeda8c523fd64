"""slow_service: a service answers only after the lease ran out, having done the work."""

from __future__ import annotations

import random
import time

from pipeline.chaos.faults.base import SERVICES, Draw, Fault, FaultKind, FaultRecord, Scene


class SlowService(FaultKind):
    """For `hold` seconds a sandbox service (`mode`) does the work, then waits `delay` seconds
    (past the lease) before it answers."""

    name = "slow_service"
    draw_order = 9
    weight = 1
    interrupts = True

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        mode = rng.choice(SERVICES)
        hold = rng.uniform(6, 15)
        return Draw(hold, mode, delay=rng.uniform(lease_seconds * 1.5, lease_seconds * 3))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        scene.cluster.misbehave(fault.mode, fault.hold, delay_seconds=fault.delay)
        scene.sampler.watch_sends(fault.kind, fault.mode, time.monotonic(), fault.hold)
        record.target = (
            f"{fault.mode} answers {fault.delay:.1f}s after doing the work, for {fault.hold:.1f}s"
        )
