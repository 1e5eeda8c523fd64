"""Side effects exactly once: the action journal, idempotency keys and reconciliation.

intended -> attempted -> confirmed; an attempt with no saved reply is outcome_unknown and is
resolved by resending with the same key (only inside the service's key-retention window),
else by asking the service (lookup), else by a person (the run waits in needs_attention).

An action belongs to the run that recorded it (with its tool call and its arguments' hash):
only that run waits for its approval and sends it, with the arguments as recorded. Another run
that means the same key waits in needs_attention, naming both runs, while the owner has it in
hand; once the service settled it (done, or refused), it learns that outcome, the effect
meaning the same. Never a decision a person made for the other run: a rejection, or an
approved action of other arguments than this call's (what a person approved is that run's
call as they saw it). Then it stays parked for a person. A fork (pipeline/runs/fork.py) is
no other run to its origin: it meets the origin's actions as its own record.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

import pipeline.instruments as instruments
import pipeline.tracing as tracing
from models import ActionState, RunStatus
from pipeline.crash import crash_point
from pipeline.db import after_commit
from pipeline.engine import action_rows as rows
from pipeline.engine import dispatch
from pipeline.engine.action_rows import ActionView
from pipeline.engine.leases import Lease, fenced
from pipeline.errors import (
    LeaseLost,
    LookupUnsupported,
    PermanentError,
    StopStep,
    TemporaryError,
    redact_urls,
)
from pipeline.keys import (
    Wait,
    approval_wait,
    claimed_wait,
    conflict_wait,
    person_wait,
    retry_wait,
)
from pipeline.logs import get_logger
from pipeline.retry import RetryPolicy, call_with_retries, classify
from pipeline.tools import Tool, ToolContext, ToolOutput, once_scope, watching_replays

if TYPE_CHECKING:
    from pipeline.engine.toolcalls import ToolCall

log = get_logger("nightshift.actions")

RESEND_POLICY = RetryPolicy(attempts=3, base_seconds=0.5, cap_seconds=5.0)
TOOL_RETRY = RetryPolicy(attempts=4, base_seconds=0.5, cap_seconds=8.0)
"""A read-only tool, and a side effect's check (which may ask its service, a price book)."""


REPLAYED_BY_SERVICE = "replayed_by_service"
"""The resolution of an action whose service answered its send that it already had the key."""
ABSORBED = (REPLAYED_BY_SERVICE, "lookup")
"""The resolutions of an action its service already had when it was sent again or asked: a
duplicate absorbed where it happened (nightshift_duplicates_absorbed_total counts each)."""

STATE, RESOLUTION = "nightshift.action.state", "nightshift.action.resolution"
"""A send span's attributes (pipeline/tracing.py): the state the send left the action in."""

KEY_CONFLICT = "key_conflict"
"""The stop reason of a run parked because another run owns the key it means."""


# Stays here, not in pipeline/errors.py: it carries a Wait (pipeline.keys), a layer above errors.
class ParkRun(StopStep):
    """Stop this step and park the run until a person, an approval or a timer moves it on."""

    def __init__(
        self,
        status: RunStatus,
        wait: Wait,
        wake_at: datetime | None = None,
        reason: tuple[str, str] | None = None,
    ):
        super().__init__(f"parking run as {status} on {wait}")
        self.status = status
        self.waiting_on = str(wait)
        self.wake_at = wake_at
        self.reason = reason
        """(stop reason, what a person reads) while it is parked, for a conflict."""


def perform(tool: Tool, call: ToolCall, context: ToolContext) -> ToolOutput:
    """Run a side-effecting tool call so that its effect happens at most once."""
    action, rekeyed = _action_for(tool, call, context)
    settled = _settled_elsewhere(call, tool, action)
    if settled is not None:
        return settled
    key = action.key
    keyed = replace(context, idempotency_key=key)
    crash_point("after_intended")
    for resend in range(RESEND_POLICY.attempts + 1):
        context.keep_going()
        outcome = _next_move(call, tool, keyed, action, resend, rekeyed)
        if outcome is not None:
            return outcome
        action = rows.load(call.lease, key)
        settled = _settled_elsewhere(call, tool, action)
        if settled is not None:
            return settled
    if action.state is ActionState.INTENDED:
        # The last resend never went out: nothing is unknown, the service is down. A person
        # could not resolve this (their decisions need outcome_unknown): try again later.
        # Nothing in flight: the run waits on a durable timer (no process held), then tries again.
        later = timedelta(seconds=context.settings.service_retry_seconds)
        log.warning("action %s: the service kept failing; trying again in %s", key, later)
        raise ParkRun(RunStatus.WAITING, retry_wait(key), wake_at=action.now + later)
    _park_for_person(call.lease, key, "the service kept failing; the outcome is unknown")
    raise AssertionError("unreachable: parking raises")


def record_proposal(tool: Tool, call: ToolCall, context: ToolContext) -> None:
    """Record an approval-requiring call as pending without sending anything, so a person sees
    every proposal of a model reply at once rather than one per replay of the step."""
    assert tool.side_effect is not None and tool.requires_approval, f"{tool.name} needs no approval"
    try:
        _action_for(tool, call, context)
    except (PermanentError, TemporaryError):
        return  # a bad key, refused by its check or past the run's cap: perform() reports it


def _action_for(tool: Tool, call: ToolCall, context: ToolContext) -> tuple[ActionView, bool]:
    """The action of this tool call, and whether today's code computes another key for it.

    A call that already has an action (found by run and tool call) is settled through that
    one, under its own key: recording a new one under a key a new release computes would send
    the same call twice. Otherwise the key is computed and recorded (or found, another run's).
    """
    recorded = rows.of_call(call.lease, call.block["id"])
    if recorded is not None:
        return recorded, _rekeyed(tool, call, context, recorded)
    key = dispatch.action_key(tool, call.block["input"], context)
    return _record(call, tool, key, context), False


def _rekeyed(tool: Tool, call: ToolCall, context: ToolContext, recorded: ActionView) -> bool:
    """Whether this release keys the call differently from the one that recorded its action."""
    try:
        key = dispatch.action_key(tool, call.block["input"], context)
    except PermanentError as exc:
        key = f"(none: {exc})"
    if key == recorded.key:
        return False
    log.warning(
        "action %s: this release keys tool call %s as %r; settling it through the action "
        "recorded under its own key, never a second one",
        recorded.key,
        call.block["id"],
        key,
    )
    return True


def _record(call: ToolCall, tool: Tool, key: str, context: ToolContext) -> ActionView:
    """Save the key (or find who has it) before anything is sent; a new action only once the
    side effect's check lets it through (refused: PermanentError, and nothing is saved)."""
    assert tool.side_effect is not None, f"{tool.name} has no side effect declared"
    if tool.side_effect.check is not None and rows.is_new(call.lease, key):
        call_with_retries(
            lambda: tool.check_action(call.block["input"], context),
            TOOL_RETRY,
            before_retry=context.keep_going,
        )
    new = dispatch.new_action(call.run_id, call.block, tool, key, context.settings)
    with fenced(call.lease) as session:
        return rows.record_txn(session, new)


def _settled_elsewhere(call: ToolCall, tool: Tool, action: ActionView) -> ToolOutput | None:
    """None when the action is this run's to carry on, or its origins': the actions of the runs
    a fork was forked from are its own past, settled as their record says (done, failed or
    rejected there), never sent again and never a conflict. Another run's action that the service
    settled gives its outcome (the effect is not repeated), unless a person's decision stands
    between: an approved action counts only for the very same call (tool and arguments).
    Anything else parks this run, naming both runs."""
    mine = action.run_id == call.run_id or action.run_id in rows.origins(call.lease)
    if mine and dispatch.carries_on(tool, action.tool, action.requires_approval):
        return None
    key = action.key
    if mine:
        # The same key from another tool of this run, or recorded before the tool needed
        # approval: sending it now would skip the approval this tool requires.
        _park_for_conflict(
            conflict_wait(key),
            f"action {key!r} was recorded by {action.tool} "
            f"{'with' if action.requires_approval else 'without'} approval; {tool.name} "
            f"{'needs' if tool.requires_approval else 'does not need'} one",
        )
    # What a person approved is the owner's call as they saw it: it counts for this call only
    # when it is the very same one. With no approval, the key's meaning is what counts.
    same = not action.requires_approval or (
        action.tool == tool.name and action.args_hash == rows.arguments_hash(call.block["input"])
    )
    if same and action.state is ActionState.CONFIRMED:
        log.info("action %s was done by run %s; not doing it again", key, action.run_id)
        return action.result or {}
    if same and action.state is ActionState.FAILED:
        _replay_failure(action)
    _park_for_conflict(*_conflict(call, action, same))
    raise AssertionError("unreachable: parking raises")


_SETTLED = (ActionState.CONFIRMED, ActionState.FAILED, ActionState.REJECTED)


def _conflict(call: ToolCall, action: ActionView, same: bool) -> tuple[Wait, str]:
    """How this run waits on another run's key, and what the operator reads: both runs."""
    owner = f"run {action.run_id} ({action.run_status})"
    means = f"run {call.run_id} means the same key" + (
        "" if same else f" with other arguments ({call.block['name']})"
    )
    if action.state not in _SETTLED:  # in hand there, or just freed: woken once it changes
        return conflict_wait(action.key), (
            f"action {action.key!r} belongs to {owner}, where it is {action.state}; {means} "
            "and waits until that run settles it, or for a person to cancel it"
        )
    settled = (
        "a person rejected it for that run"
        if action.state is ActionState.REJECTED
        else f"it is {action.state} there" + ("" if same else " with that run's arguments")
    )
    return claimed_wait(action.key), (
        f"action {action.key!r} belongs to {owner}, where {settled}; {means}, and never takes "
        "that run's outcome or decision as its own: a person cancels it"
    )


def _replay_failure(action: ActionView) -> None:
    log.warning(
        "action %s: replaying its stored failure from %s (%s); `nightshift actions retry %s` "
        "lets the next run try again",
        action.key,
        action.updated_at.isoformat(timespec="seconds"),
        action.error,
        action.key,
    )
    raise PermanentError(
        f"{action.error or 'the service refused this action'} (a failure recorded "
        f"{action.updated_at:%Y-%m-%d %H:%M} UTC, replayed, not tried again; an operator can "
        f"retry it: nightshift actions retry {action.key})"
    )


def _rejected(action: ActionView) -> str:
    return dispatch.rejected_result(action.decided_by, action.note)


def _park_for_conflict(wait: Wait, why: str) -> None:
    log.warning("%s", why)
    raise ParkRun(RunStatus.NEEDS_ATTENTION, wait, reason=(KEY_CONFLICT, why))


def _next_move(
    call: ToolCall,
    tool: Tool,
    context: ToolContext,
    action: ActionView,
    resend: int,
    rekeyed: bool,
) -> ToolOutput | None:
    """Act on the action's state; None means: state changed, look again."""
    key = action.key
    if action.state is ActionState.CONFIRMED:
        return action.result or {}
    if action.state is ActionState.FAILED:
        _replay_failure(action)
    if action.state is ActionState.REJECTED:
        return _rejected(action)
    if action.state is ActionState.WITHDRAWN:
        return "Not done: the approval was withdrawn because the run ended before a decision."
    if action.state is ActionState.RELEASED:
        # Released since it was read (the run ended meanwhile): nothing here may send it.
        _park_for_conflict(
            conflict_wait(key), f"action {key!r} was released while this run meant it"
        )
    if action.state is ActionState.PENDING_APPROVAL:
        raise ParkRun(RunStatus.WAITING, approval_wait(key))
    if action.state is ActionState.ATTEMPTED:
        # An attempt whose reply was never saved: it may or may not have happened.
        rows.transition(call.lease, key, ActionState.OUTCOME_UNKNOWN, resolution=None)
        return None
    if action.state is ActionState.OUTCOME_UNKNOWN:
        return _reconcile(call, tool, context, action, resend, rekeyed)
    assert tool.side_effect is not None
    with tracing.send(key, tool.side_effect.service):
        return _send(call, tool, context, action)


def _reconcile(
    call: ToolCall,
    tool: Tool,
    context: ToolContext,
    action: ActionView,
    resend: int,
    rekeyed: bool,
) -> ToolOutput | None:
    """An outcome nobody saved: resend with the same key (inside the service's retention),
    else ask the service (lookup with the action's own key and arguments), else a person.
    A call this release keys differently (`rekeyed`) is never resent blind: whether the
    service still dedups the old key is what the new release may have changed."""
    key = action.key
    effect = tool.side_effect
    assert effect is not None
    if resend:
        time.sleep(RESEND_POLICY.delay(resend))  # the service just failed us: back off
    retention = effect.retention(context.settings)
    honoured = effect.honoured(context.settings) and not rekeyed
    if honoured and _inside_retention(retention, action):
        log.info("action %s: outcome unknown; resending with the same key", key)
        rows.transition(call.lease, key, ActionState.INTENDED, resolution="resent_with_key")
        return None
    if effect.lookup is not None:
        try:
            found = tool.look_up(key, action.args, context)
        except LookupUnsupported:
            found = None
            supported = False
        except Exception as exc:
            if isinstance(classify(exc), PermanentError):
                raise
            why = context.settings.config.redact(str(exc))
            log.warning("action %s: lookup failed (%s); will try again", key, why)
            return None
        else:
            supported = True
        if supported and found is not None:
            log.info("action %s: lookup says it happened; confirming without resending", key)
            rows.confirm(call.lease, key, found, resolution="lookup")
            instruments.DUPLICATES_ABSORBED.labels(effect.service, "lookup").inc()
            return None
        if supported:
            log.info("action %s: lookup says it did not happen; sending with the same key", key)
            rows.transition(call.lease, key, ActionState.INTENDED, resolution="lookup_not_found")
            return None
    why = "no reply was saved and the service cannot tell"
    if rekeyed:
        why += " (this release computes another key for the call; the recorded one is kept)"
    _park_for_person(call.lease, key, why)
    return None


def _inside_retention(retention: timedelta | None, action: ActionView) -> bool:
    if retention is None:
        return False  # the service says for how long it keeps keys, or it is not trusted
    if action.first_attempt_at is None:
        return True  # nothing sent yet
    return action.now - action.first_attempt_at < retention  # no overflow for timedelta.max


def _send(
    call: ToolCall, tool: Tool, context: ToolContext, action: ActionView
) -> ToolOutput | None:
    """Send once, under a lease that covers the send: its declared time, then one lease to save
    what came back. The extension is committed before anything is sent, so a takeover cannot
    begin while the send may still be in flight, even if this session or process dies."""
    key, run_id, lease = action.key, call.run_id, call.lease
    assert tool.side_effect is not None
    lease_seconds = context.settings.lease_seconds
    send_seconds = tool.side_effect.send_seconds(context.settings)
    window = send_seconds + lease_seconds
    with fenced(lease) as session:
        rows.set_state_txn(session, run_id, key, ActionState.ATTEMPTED, attempted=True)
        rows.set_lease_txn(session, lease, window)
    crash_point("after_attempted")
    started = time.monotonic()
    try:
        # The run row stays locked during the send: a worker taking over waits for the reply
        # (or for PostgreSQL to end this session if this process freezes past the window).
        with fenced(lease) as session:
            rows.hold_run_during_send_txn(session, window)
            # The arguments as recorded: what the approver saw, whatever this call passed.
            with once_scope(None), watching_replays() as replayed:
                # the send happens once already: once() is refused here
                result = tool.run(action.args, context)
            crash_point("after_send_before_reply")
            resolution = REPLAYED_BY_SERVICE if replayed else None
            rows.confirm_txn(session, run_id, key, rows.as_result(result), resolution)
            tracing.mark({STATE: ActionState.CONFIRMED.value, RESOLUTION: resolution or "sent"})
            if replayed:  # counted as the confirmation commits, before `after_confirmed`
                absorbed = instruments.DUPLICATES_ABSORBED.labels(
                    tool.side_effect.service, "replayed"
                )
                after_commit(session, absorbed.inc)
            rows.set_lease_txn(session, lease, lease_seconds)
    except DBAPIError as exc:
        if time.monotonic() - started < window:
            raise  # the database failed us mid-send: the next step finds `attempted`
        # The send outlasted its window (its client had no timeout within send_timeout):
        # PostgreSQL ended the session and the lease lapsed; the reply cannot be saved here.
        log.warning(
            "action %s: the send took longer than its send_timeout of %gs plus a lease; its "
            "reply is not saved (the next attempt reconciles): %s",
            key,
            send_seconds,
            type(getattr(exc, "orig", exc)).__name__,
        )
        raise LeaseLost(f"run {run_id}: lease lapsed during the send of {key}") from None
    except (StopStep, KeyboardInterrupt):
        raise  # the reply was not saved: the next step finds `attempted` and reconciles
    except Exception as exc:
        _send_failed(call, context, key, exc, time.monotonic() - started, send_seconds)
        return None
    crash_point("after_confirmed")
    if replayed:
        log.info("action %s: the service already had the key; a duplicate absorbed", key)
    _warn_if_overran(key, time.monotonic() - started, send_seconds)
    return result


def _send_failed(
    call: ToolCall,
    context: ToolContext,
    key: str,
    exc: Exception,
    took: float,
    send_seconds: float,
) -> None:
    """Record a send that raised: refused for good (`failed`, raised to the model), or with
    no reply (`outcome_unknown`, reconciled next), in one log line, with the lease back to one
    lease."""
    run_id, lease_seconds = call.run_id, context.settings.lease_seconds
    error = classify(exc)
    if isinstance(error, PermanentError):
        with fenced(call.lease) as session:
            failed = context.settings.config.redact(redact_urls(str(error)))
            rows.set_state_txn(session, run_id, key, ActionState.FAILED, error=failed)
            tracing.mark({STATE: ActionState.FAILED.value})
            rows.set_lease_txn(session, call.lease, lease_seconds)
        raise error from exc
    why = context.settings.config.redact(str(error))
    if took >= send_seconds:
        log.warning(
            "action %s: no reply within its send_timeout of %gs; outcome unknown: %s",
            key,
            send_seconds,
            why,
        )
    else:
        log.warning("action %s: send failed, outcome unknown: %s", key, why)
    with fenced(call.lease) as session:
        rows.set_state_txn(session, run_id, key, ActionState.OUTCOME_UNKNOWN)
        rows.set_lease_txn(session, call.lease, lease_seconds)
    tracing.mark({STATE: ActionState.OUTCOME_UNKNOWN.value})


def _warn_if_overran(key: str, took: float, send_seconds: float) -> None:
    if took > send_seconds:
        log.warning(
            "action %s: the send took %.1fs, past its send_timeout of %gs: give the tool's "
            "client a timeout within it (a send past it plus a lease may be taken over)",
            key,
            took,
            send_seconds,
        )


def _park_for_person(lease: Lease, key: str, why: str) -> None:
    log.warning("action %s: %s; the run waits for a person (nightshift actions resolve)", key, why)
    raise ParkRun(RunStatus.NEEDS_ATTENTION, person_wait(key))
