"""`nightshift start ... --wait`: wait for the run's outcome, print it, exit with its code.

The wait listens for the run's status in PostgreSQL (pipeline/views/outcomes.py): no worker
is held and the database is asked again only when the run changes (or every few seconds).
A run waiting on a timer is waited through; one waiting for a person is an outcome.
"""

from __future__ import annotations

import uuid

from models import RunStatus
from pipeline.cli.format import print_json
from pipeline.keys import Wait, WaitKind
from pipeline.views.actions import show_action
from pipeline.views.outcomes import RunOutcome, wait_for_outcome

SUCCEEDED = 0
FAILED = 1
"""Failed or cancelled; the reason and the error are printed."""
WAITS_FOR_PERSON = 3
STILL_GOING = 4
"""--timeout passed while the run was running or waiting on a timer."""


def wait_and_report(run_id: uuid.UUID, timeout: float | None, as_json: bool) -> int:
    found = wait_for_outcome(
        run_id, float("inf") if timeout is None else timeout, through_timers=True
    )
    code = exit_code(found)
    if as_json:
        print_json({**found.as_json(), "exit_code": code})
    else:
        print(describe(found, timeout))
    return code


def exit_code(found: RunOutcome) -> int:
    if found.status is RunStatus.SUCCEEDED:
        return SUCCEEDED
    if found.status.is_terminal():
        return FAILED
    return WAITS_FOR_PERSON if found.needs_person else STILL_GOING


def describe(found: RunOutcome, timeout: float | None) -> str:
    run = f"run {found.run_id}"
    if found.status is RunStatus.SUCCEEDED:
        text = (found.result or {}).get("text") or ""
        return f"{run} succeeded ({found.stop_reason})" + (f"\n{text}" if text else "")
    if found.status.is_terminal():
        error = f": {found.error}" if found.error else ""
        return f"{run} {found.status} ({found.stop_reason}){error}"
    if found.needs_person and found.waiting_on:
        wait = Wait.parse(found.waiting_on)
        if wait.kind is WaitKind.APPROVAL:
            return f"{run} waits for approval of {wait.ref}{_approve(wait.ref)}"
        if wait.kind is WaitKind.CLAIMED:
            return f"{run} cannot go on ({found.error}): nightshift cancel {found.run_id}"
        if wait.kind is WaitKind.VERSION:
            return (
                f"{run} waits for a person to allow agent version {wait.ref} "
                f"({found.error}): nightshift allow {found.run_id}, or nightshift cancel"
            )
        return (
            f"{run} needs a person to say whether {wait.ref} happened: "
            f"nightshift actions resolve {wait.ref} --happened|--did-not-happen"
        )
    waiting = f" (waiting on {found.waiting_on})" if found.waiting_on else ""
    return (
        f"{run} is still {found.status}{waiting} after {timeout:g} s; "
        f"follow it with nightshift watch {found.run_id}"
    )


def _approve(key: str) -> str:
    """The command that approves: the CLI decides as your OS user unless --as names one of
    the action's approvers."""
    approvers = show_action(key).get("approvers") or []
    if not approvers:
        return f": nightshift approve {key}"
    return f" by {' or '.join(approvers)}: nightshift approve {key} --as {approvers[0]}"
