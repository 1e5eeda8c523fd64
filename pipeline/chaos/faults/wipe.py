"""wipe: the broker loses everything."""

from __future__ import annotations

import random
import time

from pipeline.chaos.faults.base import Draw, Fault, FaultKind, FaultRecord, Scene


class Wipe(FaultKind):
    """The broker loses every message: FLUSHALL, or a fresh empty Redis on its port (down
    `hold` seconds). The tick must find the runs left without a message."""

    name = "wipe"
    draw_order = 8
    weight = 0.8
    interrupts = True
    tally = "broker wipes"

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        mode = rng.choice(("flushall", "flushall", "fresh"))
        return Draw(mode=mode, hold=rng.uniform(0, 1))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        running = scene.sampler.running_fences()
        started = time.monotonic()
        if fault.mode == "fresh":
            down = scene.cluster.restart("redis", "kill", fault.hold, forget=True)
            record.target = f"redis replaced by an empty one (unreachable {down:.1f}s)"
        else:
            scene.cluster.flush_broker()
            record.target = "redis FLUSHALL"
        record.affected = [str(run) for run, _ in running]
        scene.sampler.watch(running, fault.kind, started)
