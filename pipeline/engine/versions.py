"""A step under another agent version than the run's last one: record the version it runs
under, and apply the agent's on_version_change when there is a journal to replay.

`continue` replays the journal (each side effect settled through its recorded action);
`park` waits in needs_attention until a person allows this version (`nightshift allow`) or
cancels the run; `fail` ends the run with reason version_changed. A run whose journal is
empty has nothing to replay: it only records the version. So does a run started before
versions were recorded (no version to compare with).
"""

from __future__ import annotations

from dataclasses import dataclass

import pipeline.instruments as instruments
import pipeline.statements as statements
from models import RunStatus
from pipeline.agent_definition import Agent
from pipeline.db import after_commit
from pipeline.engine.actions import ParkRun
from pipeline.engine.leases import Lease, fenced
from pipeline.errors import RunStopped
from pipeline.keys import version_wait
from pipeline.logs import get_logger
from pipeline.registry import agent_version

log = get_logger("nightshift.versions")

VERSION_CHANGED = "version_changed"
"""The stop reason of a run failed, or parked, because the agent changed under it."""


@dataclass(frozen=True)
class RunVersions:
    """The versions on the run row, as the step loaded them."""

    started: str | None
    running: str | None
    allowed: str | None


@dataclass(frozen=True)
class StepVersion:
    version: str
    """The agent version this step runs under."""
    changed: bool
    """The run's last step ran under another version, with a journal to replay."""
    allowed: bool
    """A person allowed the run to go on under this version (after a park)."""


def version_for_step(
    lease: Lease, agent: Agent, versions: RunVersions, has_journal: bool
) -> StepVersion:
    """This step's version, recorded on the run if it is another one; ParkRun or RunStopped
    when the agent's on_version_change says the run must not go on under it."""
    version = agent_version(agent.name)
    allowed = versions.allowed == version
    previous = versions.running
    if previous == version:
        return StepVersion(version, changed=False, allowed=allowed)
    changed = previous is not None and has_journal
    if changed and not allowed and agent.on_version_change != "continue":
        why = (
            f"agent {agent.name} changed under the run: started under {versions.started}, "
            f"last step under {previous}, this worker runs {version}"
        )
        if agent.on_version_change == "fail":
            raise RunStopped(VERSION_CHANGED, why)
        log.warning("%s; waiting for a person (nightshift allow %s)", why, lease.run_id)
        raise ParkRun(
            RunStatus.NEEDS_ATTENTION,
            version_wait(version),
            reason=(VERSION_CHANGED, f"{why}; nightshift allow lets it go on, cancel stops it"),
        )
    _record(lease, agent.name, previous, version, counted=changed)
    if changed:
        log.warning("now running under agent version %s (last step: %s)", version, previous)
    return StepVersion(version, changed=changed, allowed=allowed)


def _record(lease: Lease, agent: str, previous: str | None, version: str, *, counted: bool) -> None:
    """The run's current version on its row, and each change as an event of its feed: the
    row says "started under X, now running under Y", the feed every version in between."""
    with fenced(lease) as session:
        statements.execute(
            session, "record_running_version", run_id=lease.run_id, fence=lease.fence,
            version=version, previous=previous,
        )  # fmt: skip
        if counted:
            after_commit(session, instruments.VERSION_CHANGES.labels(agent).inc)
