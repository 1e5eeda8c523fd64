"""Failed attempts of a run's step, counted apart from claims so that a poison run (its step
kills its worker, or always overruns its time bound) stops instead of being re-sent for ever.

An attempt fails when it is taken from its holder without a checkpoint: the tick finds its
lease expired, a claim takes over an expired lease or one whose process is gone, or the time
bound gives the step up. Each is recorded in the same UPDATE that takes the run over
(`failed_attempt_sets`), under `runs.failed_step`; a step that checkpoints leaves them behind
(they count only while `runs.step = failed_step`), and one that parks ends the row of them
(`ENDED_CLEANLY`).

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


def failed_attempt_sets(
    kind: FailureKind,
    *,
    worker: str,
    fence: str,
    when: str = "true",
    lapsed: tuple[str, str] | None = None,
    error: str = "NULL",
    counted: str = "true",
) -> str:
    """SET clauses for an `UPDATE runs` that takes the run from an attempt that failed.

    `worker` and `fence` are SQL for the failed attempt's holder and fence (the row's own
    `lease_owner` and `fence` before the UPDATE, or parameters); `when` is SQL for whether this
    row's attempt failed at all (the tick also hands on runs that merely lost their message);
    `lapsed`, SQL for when the attempt's lease expired and for a lease's length in seconds,
    when the attempt may have failed by its lease lapsing (a PostgreSQL restart excuses it);
    `error` and `counted`, SQL for a database error's line and whether it counts
    (DATABASE_ERROR only).
    Every expression reads the row as it was before the UPDATE, as SET clauses do.
    """
    if kind is FailureKind.DATABASE_ERROR:
        return _database_error_sets(worker, error, counted)
    restarted = "false"
    if lapsed is not None:
        expired, lease = lapsed
        restarted = (
            f"coalesce({expired} < now() AND {expired} < pg_postmaster_start_time()"
            f" + make_interval(secs => 2 * {lease}), false)"
        )
    counted = "true" if kind is FailureKind.TIME_LIMIT else f"quarantine_fence = {fence}"
    counted = f"coalesce({counted}, false)"
    # The first failure of a step counts whatever its cause: the run becomes a suspect.
    first = "(failed_step IS DISTINCT FROM step OR failed_attempts = 0)"
    same_step = "failed_step IS NOT DISTINCT FROM step"
    entry = (
        f"jsonb_build_object('kind', '{kind.value}', 'worker', {worker}, "
        f"'counted', NOT {restarted} AND ({first} OR {counted}), "
        f"'database_restarted', {restarted}, 'at', now())"
    )
    return f"""
       failed_attempts = CASE WHEN NOT ({when}) THEN failed_attempts
                              WHEN {restarted} AND {same_step} THEN failed_attempts
                              WHEN {restarted} THEN 0
                              WHEN {first} THEN 1
                              WHEN {counted} THEN failed_attempts + 1
                              ELSE failed_attempts END,
       failures = CASE WHEN NOT ({when}) THEN failures
                       WHEN NOT ({same_step}) THEN jsonb_build_array({entry})
                       ELSE failures || jsonb_build_array({entry}) END,
       failed_step = CASE WHEN NOT ({when}) THEN failed_step ELSE step END"""


def _database_error_sets(worker: str, error: str, counted: str) -> str:
    """A database error counts (SQL `counted`) unless it says PostgreSQL went away: an outage is
    the server's failure, not the run's, while a statement that always fails on this run's data
    stops it after max_step_attempts. It never makes the run a suspect: its process did not
    die, so quarantine has nothing to tell apart (StepFailures.suspect)."""
    same_step = "failed_step IS NOT DISTINCT FROM step"
    entry = (
        f"jsonb_build_object('kind', '{FailureKind.DATABASE_ERROR.value}', 'worker', {worker}, "
        f"'counted', {counted}, 'error', {error}, 'database_restarted', false, 'at', now())"
    )
    first = f"CASE WHEN {counted} THEN 1 ELSE 0 END"
    return f"""
       failed_attempts = CASE WHEN NOT ({same_step}) THEN {first}
                              WHEN {counted} THEN failed_attempts + 1
                              ELSE failed_attempts END,
       failures = CASE WHEN NOT ({same_step}) THEN jsonb_build_array({entry})
                       ELSE failures || jsonb_build_array({entry}) END,
       failed_step = step"""


ENDED_CLEANLY = {"failed_attempts": 0}
"""What an attempt that ends well without moving the run to its next step (it parks on an
approval or a timer, or replays its step at once) writes with its release: the failures in a
row are over. A step that waits on several approvals runs as several attempts of one step, and
a lapse before each must not add up to a poison run's count. The entries stay, for `show`."""


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
