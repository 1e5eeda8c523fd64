"""Failed attempts of a run's step, counted apart from claims so that a poison run (its step
kills its worker, or always overruns its time bound) stops instead of being re-sent for ever.

An attempt fails when it is taken from its holder without a checkpoint: the tick finds its
lease expired, a claim takes over an expired lease or one whose process is gone, or the time
bound gives the step up. Each is recorded in the same statement that takes the run over
(models/sql/: the claim, take_orphans, give_up_step), by one function,
`nightshift_failed_attempt` (models/sql/schema.sql), under `runs.failed_step`; a step that
checkpoints leaves them behind (they count only while `runs.step = failed_step`), and one that
parks ends the row of them (`failed_attempts = 0` in runs.sql's park and release_to_replay).

What counts towards the agent's `max_step_attempts`, so that the innocent runs that shared a
killed process with a poison run are not failed because of it: a step's first failure always
(the run becomes a suspect); after that only failures the run cannot share: its own time bound,
or a loss while it ran in quarantine, alone among the suspects of its process
(pipeline/engine/quarantine.py records that attempt's fence in `runs.quarantine_fence`). A
suspect that dies while another suspect is in quarantine, or while it waits for its turn, is
not counted again: the one in quarantine is the likely cause.

A lease that lapsed because PostgreSQL itself restarted is no failed attempt at all: every step
in flight then loses its lease (its holder cannot renew it), and counting those would make
each of them a suspect, queue them for quarantine and fail innocent runs at the next blip. A
lapse counts as the restart's when the lease expired before the server had been up for two
leases (`pg_postmaster_start_time()`): one for a renewal sent before the outage and answered
after it, one for its holder to reconnect. Its entry says `database_restarted` and is not
counted; the attempts counted so far stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class FailureKind(StrEnum):
    """Why an attempt failed; the run's stop reason once the attempts run out."""

    CRASHED_WORKER = "crashed_worker"
    """Its lease lapsed with no checkpoint: its worker was lost, or could not reach PostgreSQL
    to renew it."""
    TIME_LIMIT = "time_limit"
    """It overran the step's time bound and was given up."""
    DATABASE_ERROR = "database_error"
    """A statement of the step failed in PostgreSQL (or in a pooler in front of it); its worker
    went on and handed the run to another attempt."""


@dataclass(frozen=True)
class StepFailures:
    """The failed attempts of the step a run is at, as its row says."""

    step: int
    count: int
    entries: list[dict[str, Any]]

    @classmethod
    def of(cls, failed_step: int | None, count: int, entries: list[Any], step: int) -> StepFailures:
        if failed_step != step:
            return cls(step, 0, [])
        return cls(step, count, list(entries))

    @property
    def suspect(self) -> bool:
        """An attempt of this step failed with its process (or its time bound): the next one
        runs in quarantine. One that failed on a database error left its process running."""
        return self.count > 0 and self.kind is not FailureKind.DATABASE_ERROR

    @property
    def kind(self) -> FailureKind:
        return FailureKind(self.entries[-1]["kind"]) if self.entries else FailureKind.CRASHED_WORKER

    def describe(self) -> str:
        """The stop's message: the step, the attempts and their workers."""
        workers = ", ".join(dict.fromkeys(str(e.get("worker")) for e in self.entries))
        kinds = {
            FailureKind.CRASHED_WORKER.value: "its lease lapsed: its worker was lost or cut off",
            FailureKind.TIME_LIMIT.value: "it overran the step's time limit",
            FailureKind.DATABASE_ERROR.value: "it failed on a database error",
        }
        why = "; ".join(dict.fromkeys(_why(kinds, e) for e in self.entries))
        return (
            f"step {self.step} failed {self.count} attempts in a row ({why}); "
            f"{len(self.entries)} lost attempt(s) on worker(s) {workers}"
        )


def _why(kinds: dict[str, str], entry: dict[str, Any]) -> str:
    said = kinds[entry["kind"]]
    return f"{said} ({entry['error']})" if entry.get("error") else said
