"""lying_service: a service does the work and answers 503."""

from __future__ import annotations

import random
import time

from pipeline.chaos.faults.base import SERVICES, Draw, Fault, FaultKind, FaultRecord, Scene


class LyingService(FaultKind):
    """For `hold` seconds a sandbox service (`mode`) does the work and answers 503."""

    name = "lying_service"
    draw_order = 10
    weight = 1
    interrupts = True

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        mode = rng.choice(SERVICES)
        return Draw(mode=mode, hold=rng.uniform(3, 8))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        scene.cluster.misbehave(fault.mode, fault.hold, status_after_work=503)
        scene.sampler.watch_sends(fault.kind, fault.mode, time.monotonic(), fault.hold)
        record.target = f"{fault.mode} does the work and answers 503, for {fault.hold:.1f}s"
