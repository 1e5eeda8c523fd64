"""postgres_in_send: PostgreSQL restarts while a side effect's send is in flight."""

from __future__ import annotations

import time
import uuid

from sqlalchemy import text

from pipeline.chaos.common import NoTarget, retrying
from pipeline.chaos.faults.base import Fault, FaultRecord, Scene, ServerRestart
from pipeline.db import transaction

SEND_WAIT_SECONDS = 15.0
"""How long to wait for a send to be in flight before giving up."""
_IN_FLIGHT = text(
    "SELECT a.run_id, r.fence FROM actions a JOIN runs r ON r.id = a.run_id"
    " WHERE a.state = 'attempted' AND a.last_attempt_at > now() - interval '1 second'"
)


class PostgresInSend(ServerRestart):
    """Restart PostgreSQL (fast or immediate, down `hold` seconds) while a side effect's send
    is in flight."""

    name = "postgres_in_send"
    draw_order = 11
    weight = 0.6
    server = "postgres"
    modes = ("fast", "fast", "immediate")

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        deadline = time.monotonic() + SEND_WAIT_SECONDS
        while not (sending := retrying(_sends_in_flight)):
            if time.monotonic() > deadline or scene.stopping.wait(0.02):
                raise NoTarget("no side effect's send in flight")
        held = scene.cluster.held_runs()
        started = time.monotonic()
        down = scene.cluster.restart("postgres", fault.mode, fault.hold)
        record.target = f"postgres ({fault.mode}, unreachable {down:.1f}s) during a send"
        hit = {*sending, *((run, fence) for runs in held.values() for run, fence in runs)}
        record.affected = sorted(str(run) for run, _ in hit)
        scene.sampler.watch(sorted(hit), fault.kind, started)


def _sends_in_flight() -> list[tuple[uuid.UUID, int]]:
    """(run, fence) of the runs whose side effect is being sent right now."""
    with transaction() as session:
        return [(row.run_id, row.fence) for row in session.execute(_IN_FLIGHT)]
