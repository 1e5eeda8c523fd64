"""model_outage: the Messages API answers 529, or 429 with a retry-after, to every request."""

from __future__ import annotations

import random

from pipeline.chaos.faults.base import Draw, Fault, FaultKind, FaultRecord, Scene


class ModelOutage(FaultKind):
    """For 10-30 s (`hold`) the Messages API answers `mode` (529, or 429 asking to retry after
    `delay` seconds) to every request: the runs must wait it out, none may fail
    model_unavailable."""

    name = "model_outage"
    draw_order = 12
    weight = 0.3
    delay_words = "retry-after"

    def draw(self, rng: random.Random, lease_seconds: float) -> Draw:
        mode = rng.choice(("529", "429"))
        hold = rng.uniform(10, 30)
        return Draw(hold, mode, delay=rng.uniform(3, 15) if mode == "429" else 0.0)

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        retry_after = fault.delay or None
        scene.cluster.model_outage(int(fault.mode), fault.hold, retry_after)
        asks = f" with retry-after {retry_after:.0f}s" if retry_after else ""
        record.target = f"the Messages API answers {fault.mode}{asks} for {fault.hold:.1f}s"
