"""The chaos harness's approvals against the real API: its double-webhook fault posts one signed
delivery twice at once (one decision, one replay refused), the workload's doubles are signed
apart (one first decision, one repeat), and nothing is approved twice."""

from __future__ import annotations

from pipeline.chaos.approvals import Approvals
from pipeline.chaos.webhook import ApprovalWebhook
from tests.integration.api_fixtures import (
    APPROVAL_SECRET,
    PR_KEY,
    action_row,
    live_server,
    make_app,
    park_on_approval,
    person_token,
)

APPROVER = "chaos-approver@example.com"


def test_the_double_webhook_fault_meets_the_replay_cache_and_approves_once(db_url: str) -> None:
    # given two actions waiting for the harness's approver
    park_on_approval(approvers=(APPROVER,))
    other = "patch:acme/shop:patch/issue-8"
    park_on_approval(other, approvers=(APPROVER,), bug={"issue": 8, "repo": "acme/shop",
                                                          "title": "rounding"})  # fmt: skip

    with live_server(make_app()) as base:
        approvals = Approvals(ApprovalWebhook(base, APPROVAL_SECRET, person_token(APPROVER)))
        # when the webhook fault posts one delivery twice at once, and the workload signs apart
        same = approvals.fire(PR_KEY, times=2, same=True)
        apart = approvals.fire(other, times=2)

    # then the identical delivery was refused as a replay; the two signed apart both answered
    assert sorted((d.first, d.replay) for d in same) == [(False, True), (True, False)], same
    assert sorted((d.first, d.replay) for d in apart) == [(False, False), (True, False)], apart
    assert approvals.replays_refused == 1 and approvals.replays_accepted == 0
    assert approvals.doubled() == [] and approvals.errors == []
    assert action_row(PR_KEY).decided_by == APPROVER
