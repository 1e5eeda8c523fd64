"""kill: SIGKILL a worker (its pool children too), or one prefork pool child."""

from __future__ import annotations

import random
import time

from pipeline.chaos.faults.base import Draw, Fault, FaultKind, FaultRecord, Scene


class Kill(FaultKind):
    """SIGKILL a worker busy with a step, or one of its prefork pool children."""

    name = "kill"
    draw_order = 0
    weight = 3
    interrupts = True

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        return Draw(mode=rng.choice(("worker", "child")))

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        started = time.monotonic()
        slot, child = scene.cluster.choose_worker(fault.pick)
        if child is not None and fault.mode == "child":
            record.target = f"{slot.name} pool child {child}"
            dead = {child}
            scene.cluster.kill_child(slot, child)
        else:
            record.target = f"{slot.name} (pid {slot.pid})"
            dead = scene.cluster.kill(slot)
        scene.watch_pids(record, dead, started)
