"""pipeline.testing: an agent's script or canned replies run through the engine's own step
logic in memory; tool calls and side effects recorded, nothing sent; approvals decided."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from models import ActionState
from pipeline import (
    Agent,
    ArtifactRequest,
    Conversation,
    SideEffect,
    ToolContext,
    text,
    tool,
    tool_use,
)
from pipeline.runs.decisions import NotAnApprover
from pipeline.testing import KeyNotStable, run_agent, tool_context

RUN = {"team": "ops"}
SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "subject": {"type": "string"}},
    "required": ["to", "subject"],
    "additionalProperties": False,
}


def by_team(args: dict[str, Any], context: ToolContext) -> str:
    return f"digest:{context.run_input['team']}"


def by_subject(args: dict[str, Any], context: ToolContext) -> str:
    return f"digest:{args['subject']}"


_counter = itertools.count()


def by_attempt(args: dict[str, Any], context: ToolContext) -> str:
    return f"digest:{context.run_input['team']}:{next(_counter)}"  # a new key every time


def mailer(key: Any, *, approval: bool = False, approvers: tuple[str, ...] = ()) -> Any:
    def mail(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        raise AssertionError("the real send must never run in a test")

    effect = SideEffect(service="email", key=key)
    return tool(description="Mail it.", schema=SCHEMA, side_effect=effect, name="mail",
                requires_approval=approval, approvers=approvers)(mail)  # fmt: skip


def agent_with(mail: Any) -> Agent:
    return Agent(name="digest", system="You mail.", instructions="Mail the digest.",
                 tools=(mail,), input_schema={"type": "object"})  # fmt: skip


def mails(*subjects: str) -> list[Any]:
    """Canned replies: one mail per step with these subjects, then a final text."""
    calls: list[Any] = [
        [tool_use(step, 0, "mail", {"to": "ops@example.com", "subject": subject})]
        for step, subject in enumerate(subjects)
    ]
    return [*calls, "Done."]


class Service:
    """A stand-in for the mail service: what it was sent, with which key."""

    def __init__(self) -> None:
        self.sent: list[tuple[str | None, str]] = []

    def __call__(self, args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        self.sent.append((context.idempotency_key, args["subject"]))
        return {"id": f"m{len(self.sent)}"}


# -- a tool that would send twice -----------------------------------------------------------


def test_two_calls_meaning_one_action_are_sent_once_and_the_second_gets_the_first_outcome() -> None:
    service = Service()
    run = run_agent(agent_with(mailer(by_team)), RUN, replies=mails("a", "b"),
                    tools={"mail": service})  # fmt: skip

    assert run.status == "succeeded" and run.answer == "Done."
    (action,) = run.actions
    assert action.key == "digest:digest:ops" and action.service == "email"
    assert action.calls == ["toolu_s000_0", "toolu_s001_0"]
    assert action.sends == 1 and service.sent == [("digest:digest:ops", "a")]
    assert [c.result for c in run.calls] == [{"id": "m1"}, {"id": "m1"}]


def test_a_key_that_follows_the_arguments_shows_two_actions_where_one_was_meant() -> None:
    service = Service()
    run = run_agent(agent_with(mailer(by_subject)), RUN, replies=mails("a", "b"),
                    tools={"mail": service})  # fmt: skip

    assert [a.key for a in run.actions] == ["digest:digest:a", "digest:digest:b"]
    assert len(service.sent) == 2  # what a test asserting one email per team catches


def test_a_key_that_changes_per_attempt_fails_the_test_before_anything_is_sent() -> None:
    service = Service()
    with pytest.raises(KeyNotStable, match="mail's idempotency key changed"):
        run_agent(agent_with(mailer(by_attempt)), RUN, replies=mails("a"),
                  tools={"mail": service})  # fmt: skip
    assert service.sent == []


# -- approvals --------------------------------------------------------------------------------


def test_an_approval_parks_the_run_and_approving_sends_it_once() -> None:
    service = Service()
    agent = agent_with(mailer(by_team, approval=True, approvers=("alice",)))
    run = run_agent(agent, RUN, replies=mails("a"), tools={"mail": service})

    assert run.status == "waiting" and run.waiting_on == "approval:digest:digest:ops"
    (pending,) = run.pending
    assert pending.requires_approval and pending.approvers == ("alice",)
    assert service.sent == [] and run.calls == []
    with pytest.raises(NotAnApprover):
        run.approve(by="mallory")

    run.approve(by="alice")

    assert run.status == "succeeded" and run.answer == "Done."
    assert pending.state is ActionState.CONFIRMED and pending.decided_by == "alice"
    assert service.sent == [("digest:digest:ops", "a")]
    assert [c.result for c in run.calls] == [{"id": "m1"}]


def test_a_rejection_is_what_the_model_reads_and_nothing_is_sent() -> None:
    service = Service()
    seen: list[str] = []

    def script(conversation: Conversation) -> list[Any]:
        results = conversation.tool_results()
        if not results:
            return [tool_use(0, 0, "mail", {"to": "ops@example.com", "subject": "a"})]
        seen.append(results[-1]["content"])
        return [text("Not mailed.")]

    agent = agent_with(mailer(by_team, approval=True))
    agent = replace(agent, script=script)
    run = run_agent(agent, RUN, tools={"mail": service}).reject(note="wrong list")

    assert run.status == "succeeded" and run.answer == "Not mailed."
    assert seen == ["Not done: tester rejected this action (wrong list)."]
    (action,) = run.actions
    assert action.state is ActionState.REJECTED and action.sends == 0 and service.sent == []


# -- calls, refusals, the journal -------------------------------------------------------------


def test_invalid_arguments_and_unknown_tools_are_what_the_model_reads_as_errors() -> None:
    replies = [
        [tool_use(0, 0, "mail", {"to": "ops@example.com"}), tool_use(0, 1, "fax", {})],
        "Gave up.",
    ]
    run = run_agent(agent_with(mailer(by_team)), RUN, replies=replies)

    assert [(c.name, c.is_error, c.content) for c in run.calls] == [
        ("mail", True, "invalid arguments: (root): 'subject' is a required property"),
        ("fax", True, "unknown tool 'fax'"),
    ]
    assert run.actions == []
    assert [(e.key, e.step_name) for e in run.journal] == [
        ("model:0", "ask_model"), ("tool:toolu_s000_0", "mail"), ("tool:toolu_s000_1", "fax"),
        ("model:1", "ask_model"),
    ]  # fmt: skip


def test_an_unstubbed_side_effect_is_recorded_and_not_sent() -> None:
    run = run_agent(agent_with(mailer(by_team)), RUN, replies=mails("a"))

    (action,) = run.actions
    assert action.state is ActionState.INTENDED and action.sends == 0
    assert run.calls[0].result["sent"] is False


def test_a_tool_and_its_key_called_directly_with_a_test_context() -> None:
    mail = mailer(by_team)
    context = tool_context(agent_with(mail), RUN, config={"mail.url": "http://mail.test"})
    assert mail.action_key({"to": "a@b", "subject": "s"}, context) == "digest:digest:ops"
    assert context.config("mail.url") == "http://mail.test"


def test_the_deployments_approvers_come_from_env_and_the_process_environment_is_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_APPROVERS_MAIL", "mallory")  # not the test's: never read
    agent = agent_with(mailer(by_team, approval=True, approvers=("alice",)))
    run = run_agent(agent, RUN, replies=mails("a"), env={"NIGHTSHIFT_APPROVERS_MAIL": "bob"})

    assert run.pending[0].approvers == ("bob",)
    with pytest.raises(NotAnApprover):
        run.approve(by="alice")
    assert run.approve(by="bob").status == "succeeded"


def test_a_report_is_kept_as_an_artifact_in_memory_and_the_model_reads_its_reference() -> None:
    @tool(description="Write the report.", schema={"type": "object"})
    def report(args: dict[str, Any], context: ToolContext) -> ArtifactRequest:
        return ArtifactRequest("report.md", "# Night\nAll quiet.", "text/markdown")

    agent = Agent(name="reporter", system="You report.", instructions="Report.",
                  tools=(report,), input_schema={"type": "object"})  # fmt: skip
    run = run_agent(agent, {}, replies=[[tool_use(0, 0, "report", {})], "Reported."])

    assert run.artifacts == {"report.md": "# Night\nAll quiet."}
    ref = run.calls[0].result["artifact"]
    assert ref["name"] == "report.md" and ref["media_type"] == "text/markdown"
