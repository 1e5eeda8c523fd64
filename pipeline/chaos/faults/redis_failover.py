"""redis_failover: Redis's master dies and the sentinels promote its replica."""

from __future__ import annotations

import time

from pipeline.chaos.faults.base import Fault, FaultKind, FaultRecord, Scene


class RedisFailover(FaultKind):
    """Kill Redis's master (SIGKILL) so that the sentinels promote its replica (every process
    names only the sentinels: NIGHTSHIFT_BROKER_URL=sentinel://..., the master's name in
    NIGHTSHIFT_BROKER_SENTINEL_MASTER); the old master comes back as the new one's replica, for
    the next failover. The runs in flight must go on from the new master: a step message the
    old master had not replicated is lost like any in a broker outage, and the tick re-sends
    its run."""

    name = "redis_failover"
    draw_order = 15
    weight = 0.3
    interrupts = True
    needs_sentinels = True
    tally = "Redis failovers"

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        servers = scene.cluster.sentinels
        assert servers is not None
        held = scene.cluster.held_runs()
        in_flight = [(run, fence) for runs in held.values() for run, fence in runs]
        started = time.monotonic()
        killed, promoted = servers.fail_over()
        record.affected = [str(run) for run, _ in in_flight]
        scene.sampler.watch(in_flight, fault.kind, started)
        record.target = (
            f"redis master on {killed} killed, replica promoted in {promoted:.1f}s; "
            "the old master rejoined as its replica"
        )
