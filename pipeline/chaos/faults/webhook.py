"""webhook: one signed approval delivery posted twice at once."""

from __future__ import annotations

from pipeline.chaos.approvals import pending_approvals
from pipeline.chaos.common import NoTarget, retrying
from pipeline.chaos.faults.base import Fault, FaultKind, FaultRecord, Scene


class WebhookReplay(FaultKind):
    """Post one signed approval delivery twice at the same instant: the second must be refused
    as a replay, and the approval take effect once."""

    name = "webhook"
    draw_order = 5
    weight = 2

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        keys = sorted(retrying(pending_approvals))
        if not keys:
            raise NoTarget("no approval pending")
        key = keys[int(fault.pick * len(keys))]
        results = scene.approvals.fire(key, times=2, same=True)
        answers = [r for r in results if not isinstance(r, Exception)]
        firsts = sum(1 for r in answers if r.first)
        replays = sum(1 for r in answers if r.replay)
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]
        run_ids = {r.run_id for r in answers if r.run_id}
        record.target, record.affected = key, sorted(run_ids)
        record.note = f"first decisions: {firsts}; refused as replays: {replays}" + (
            f"; errors: {errors}" if errors else ""
        )
