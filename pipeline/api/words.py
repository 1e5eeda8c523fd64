"""The status page in a pricing manager's words: states said plainly, waits explained, and
markdown artifacts rendered safely (every character of a model's text escaped, no raw HTML,
no script links)."""

from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt

from pipeline.keys import Wait, WaitKind
from pipeline.runs.decisions import not_an_approver, shown_to

# CommonMark with raw HTML off: a model's "<script>" is shown as text. markdown-it also
# refuses javascript:, vbscript: and data: links (its validateLink).
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")

RUN_WORDS = {
    "running": "running",
    "waiting": "waiting",
    "needs_attention": "needs a person",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}

ACTION_WORDS = {
    "pending_approval": "waiting for a decision",
    "intended": "about to be sent",
    "attempted": "sending",
    "outcome_unknown": "unknown whether it happened",
    "confirmed": "done",
    "failed": "failed",
    "rejected": "rejected",
}


BATCH_WORDS = {"synthesizing": "writing the summary", "stopped": "stopped"}


def plain(state: str) -> str:
    """A run's, batch's or action's state in words (actions: see `action_words`)."""
    return RUN_WORDS.get(state) or ACTION_WORDS.get(state) or BATCH_WORDS.get(state) or state


def action_words(action: dict[str, Any]) -> str:
    """An action's state as its approver reads it: approved and on its way is not "intended"."""
    state, decision = action.get("state", ""), action.get("decision")
    if state == "intended" and decision == "approve":
        return "approved, sending"
    if state == "intended" and decision == "did_not_happen":
        return "did not happen, sending again"
    if state == "confirmed" and decision == "happened":
        return "done (a person said it happened)"
    return ACTION_WORDS.get(state, state)


def waiting_words(waiting_on: str | None) -> str:
    """What a waiting run waits for, in words."""
    if not waiting_on:
        return ""
    try:
        wait = Wait.parse(waiting_on)
    except ValueError:
        return f"on {waiting_on}"
    return {
        WaitKind.APPROVAL: f"for a decision on {wait.ref}",
        WaitKind.ACTION: f"for a person to say whether {wait.ref} happened",
        WaitKind.TIMER: "for its timer",
        WaitKind.RETRY: f"to try {wait.ref} again (the service kept failing)",
        WaitKind.MODEL: f"for the model provider to answer again ({wait.ref} is down)",
        WaitKind.CONFLICT: f"for the run that owns {wait.ref} to settle it",
        WaitKind.CLAIMED: f"for a person: {wait.ref} is another run's, settled there",
        WaitKind.VERSION: f"for a person to allow it to go on under agent version {wait.ref}",
        WaitKind.TURN: f"for its turn (the runs of {wait.ref} in a step are at their maximum)",
        WaitKind.RATE: f"for its turn under {wait.ref}'s rate limits",
    }[wait.kind]


def markdown(text: str) -> str:
    """Safe HTML for a markdown document: escaped text, no raw HTML passes through."""
    return _MARKDOWN.render(text)


def who_decides(action: dict[str, Any], who: str) -> str:
    """Who may decide the action, as `who` may see it: the approvers are named only to one
    of them (a refused decision's 403 does not name them either: knowing whose credential
    would do tells a stranger whom to go after)."""
    approvers = action.get("approvers") or []
    if not_an_approver(action["idempotency_key"], who, approvers) is not None:
        return "named approvers (you are not one of them)"
    return ", ".join(approvers) if approvers else "anyone signed in"


AN_APPROVER = "an approver"
"""Who acted, as a person not among the action's approvers reads it."""


def as_seen_by(action: dict[str, Any], who: str) -> dict[str, Any]:
    """The action (`show_action`'s) as `who` may see it: who decided, and who did what in its
    audit trail, named only where `shown_to` allows (an approver's identity, to approvers)."""
    approvers = action.get("approvers") or []

    def named(identity: str | None) -> str | None:
        return identity if shown_to(who, identity, approvers) else AN_APPROVER

    audit = [
        entry if shown_to(who, entry["by"], approvers)
        else {**entry, "by": AN_APPROVER, "via": ""}
        for entry in action.get("audit", [])
    ]  # fmt: skip
    return {**action, "decided_by": named(action.get("decided_by")), "audit": audit}
