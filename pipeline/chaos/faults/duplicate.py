"""duplicate: a step message sent twice."""

from __future__ import annotations

from pipeline.app import send_step
from pipeline.chaos.common import NoTarget, retrying
from pipeline.chaos.faults.base import Fault, FaultKind, FaultRecord, Scene


class Duplicate(FaultKind):
    """Send a running run's step message twice more: the claim must refuse the duplicates."""

    name = "duplicate"
    draw_order = 4
    weight = 2

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        running = sorted(scene.sampler.running())
        if not running:
            raise NoTarget("no running run to send twice")
        run_id = running[int(fault.pick * len(running))]
        for _ in range(2):
            retrying(lambda: send_step(run_id, agent="(sent twice by chaos)"))
        record.target, record.affected = f"run {run_id}", [str(run_id)]
