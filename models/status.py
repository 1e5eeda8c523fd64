"""Status enums that carry their own rules; the database enforces them with guarded UPDATEs."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    RUNNING = "running"
    """Runnable: a step task may claim it."""
    WAITING = "waiting"
    """Parked on a timer, an approval or children; no worker and no broker message hold it."""
    NEEDS_ATTENTION = "needs_attention"
    """A side effect's outcome is unknown and only a person can say what happened."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in _TERMINAL_RUN

    def is_parked(self) -> bool:
        """Waiting with no worker and no broker message: only a wake moves it on."""
        return self in _PARKED_RUN

    @classmethod
    def terminal(cls) -> tuple[RunStatus, ...]:
        """Every finished status: the IN list of "is it finished" queries."""
        return tuple(s for s in cls if s in _TERMINAL_RUN)

    @classmethod
    def parked(cls) -> tuple[RunStatus, ...]:
        """Every status a wake (a timer, a decision, a person) makes runnable again."""
        return tuple(s for s in cls if s in _PARKED_RUN)

    @classmethod
    def sources_of(cls, new: RunStatus) -> tuple[RunStatus, ...]:
        """Statuses a run may move to `new` from: the WHERE clause of a guarded UPDATE."""
        return tuple(s for s in cls if new in RUN_TRANSITIONS[s])


_TERMINAL_RUN = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
_PARKED_RUN = frozenset({RunStatus.WAITING, RunStatus.NEEDS_ATTENTION})

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING,
            RunStatus.NEEDS_ATTENTION,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
        }
    ),
    RunStatus.WAITING: frozenset({RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.NEEDS_ATTENTION: frozenset(
        {RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


class ActionKind(StrEnum):
    """Who holds an action while it is sent: the same rows, states and statements either way."""

    TOOL = "tool"
    """A tool call's side effect, sent by its run's step under the run's lease and fence."""
    WEBHOOK = "webhook"
    """A webhook nightshift owes a receiver (a run's or batch's notify_url, or an alert's
    NIGHTSHIFT_ALERT_WEBHOOK_URL), sent by pipeline/delivery/ after what it announces
    committed: no step holds it, so the row carries its own claim (fence, lease)."""


class ActionState(StrEnum):
    PENDING_APPROVAL = "pending_approval"
    """Recorded, waiting for a person's decision; nothing has been sent."""
    INTENDED = "intended"
    """The key is saved; nothing has been sent yet."""
    ATTEMPTED = "attempted"
    """A send has started; its reply is not saved yet."""
    OUTCOME_UNKNOWN = "outcome_unknown"
    """A send started and no reply was saved: it may or may not have happened."""
    CONFIRMED = "confirmed"
    """The service's reply is saved: it happened once."""
    FAILED = "failed"
    """The service refused permanently: it did not happen."""
    REJECTED = "rejected"
    """A person declined the approval: it will not happen."""
    WITHDRAWN = "withdrawn"
    """The run ended (its deadline passed, it was cancelled) before anyone decided: it will
    not happen, and a later approval is refused. The next run that means this action takes
    the key over and proposes it afresh."""
    RELEASED = "released"
    """Not done, and no run will do it: its run ended before sending, a person said it did not
    happen after its run ended, or a person retried a failure. The next run that means this
    action takes the key over and does it afresh (asking for approval if the tool needs it)."""

    def is_terminal(self) -> bool:
        return self in (
            ActionState.CONFIRMED,
            ActionState.FAILED,
            ActionState.REJECTED,
            ActionState.WITHDRAWN,
            ActionState.RELEASED,
        )

    @classmethod
    def in_progress(cls) -> tuple[ActionState, ...]:
        """Owned by a run that may still send it (or may have): no other run may touch it."""
        return (cls.PENDING_APPROVAL, cls.INTENDED, cls.ATTEMPTED, cls.OUTCOME_UNKNOWN)

    @classmethod
    def sources_of(cls, new: ActionState) -> tuple[ActionState, ...]:
        return tuple(s for s in cls if new in ACTION_TRANSITIONS[s])


ACTION_TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.PENDING_APPROVAL: frozenset(
        {ActionState.INTENDED, ActionState.REJECTED, ActionState.WITHDRAWN}
    ),
    # released: the run ended before sending; outcome_unknown: it ended after a resend was
    # decided (something may have gone out).
    ActionState.INTENDED: frozenset(
        {ActionState.ATTEMPTED, ActionState.RELEASED, ActionState.OUTCOME_UNKNOWN}
    ),
    ActionState.ATTEMPTED: frozenset(
        {ActionState.CONFIRMED, ActionState.FAILED, ActionState.OUTCOME_UNKNOWN}
    ),
    ActionState.OUTCOME_UNKNOWN: frozenset(
        {
            ActionState.ATTEMPTED,
            ActionState.CONFIRMED,
            ActionState.FAILED,
            ActionState.INTENDED,
            ActionState.RELEASED,
        }
    ),
    ActionState.CONFIRMED: frozenset(),
    ActionState.FAILED: frozenset({ActionState.RELEASED}),
    ActionState.REJECTED: frozenset(),
    # Taken over, afresh, by the next run that means the action.
    ActionState.WITHDRAWN: frozenset({ActionState.PENDING_APPROVAL, ActionState.INTENDED}),
    ActionState.RELEASED: frozenset({ActionState.PENDING_APPROVAL, ActionState.INTENDED}),
}


class FireDecision(StrEnum):
    """What a schedule slot did; one row per (schedule, slot) in schedule_fires. Only a buffered
    slot changes its decision: it starts (fired), or a newer buffered slot replaces it
    (skipped_overlap)."""

    FIRED = "fired"
    """Started on time, by hand, or (from buffered) when the previous run finished."""
    CAUGHT_UP = "caught_up"
    """Started late: the slot was missed and the missed policy (once/all) runs it."""
    SKIPPED_MISSED = "skipped_missed"
    SKIPPED_OVERLAP = "skipped_overlap"
    """The previous slot's run was still going (or a newer buffered slot replaced this one)."""
    BUFFERED = "buffered"
    """Waiting for the previous slot's run to finish; at most one per schedule."""
    CANCELLED_OTHER = "cancelled_other"
    """Started after cancelling the previous slot's run (or its batch's runs)."""

    def started(self) -> bool:
        """Whether the slot started its job (its row names a run or a batch)."""
        return self in (FireDecision.FIRED, FireDecision.CAUGHT_UP, FireDecision.CANCELLED_OTHER)


class BatchStatus(StrEnum):
    RUNNING = "running"
    """Children are running; the synthesis starts when every child is terminal."""
    SYNTHESIZING = "synthesizing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    """Stopped by a budget or an operator; the reason is on the batch."""

    def is_terminal(self) -> bool:
        return self in (BatchStatus.SUCCEEDED, BatchStatus.FAILED, BatchStatus.STOPPED)

    @classmethod
    def terminal(cls) -> tuple[BatchStatus, ...]:
        return tuple(s for s in cls if s.is_terminal())
