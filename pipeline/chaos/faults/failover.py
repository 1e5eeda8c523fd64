"""failover: PostgreSQL's primary dies and its synchronous standby is promoted."""

from __future__ import annotations

from pipeline.chaos.faults.base import Fault, FaultKind, FaultRecord, Scene


class Failover(FaultKind):
    """Stop PostgreSQL's primary like a crash and promote its synchronous standby (every process
    names both hosts, `target_session_attrs=read-write`); then rebuild a standby of the new
    primary where the old one was, for the next failover. The runs in flight must resume on the
    new primary, and no commit may be lost."""

    name = "failover"
    draw_order = 14
    weight = 0.3
    interrupts = True
    tally = "PostgreSQL failovers"

    def inject(self, scene: Scene, fault: Fault, record: FaultRecord) -> None:
        servers = scene.cluster.postgres
        assert servers is not None
        held = scene.cluster.held_runs()
        in_flight = [(run, fence) for runs in held.values() for run, fence in runs]
        done = servers.fail_over()
        record.affected = [str(run) for run, _ in in_flight]
        scene.sampler.watch(in_flight, fault.kind, done.stopped_at)
        rebuilt = servers.rebuild()
        record.target = (
            f"postgres primary stopped, standby promoted in {done.seconds:.1f}s; "
            f"a new standby streamed {rebuilt:.1f}s later"
        )
