"""pipeline.testing: an agent's script or canned replies run on the real step (the claim, the
limits, the journal, the action protocol, the decisions, the tick) on a PostgreSQL database of
the run's own, its messages handed off in-process; tool calls and side effects recorded,
nothing sent unless a stub stands in for the service; approvals decided; the clock moved."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from models import ActionState
from pipeline import (
    Agent,
    ArtifactRequest,
    Conversation,
    SideEffect,
    ToolContext,
    check_back_in,
    text,
    tool,
    tool_use,
)
from pipeline.agents.nightly_report import AGENT as NIGHTLY_REPORT
from pipeline.errors import LeaseLost, NotAnApprover
from pipeline.runs.fanout import NIGHTLY_CAP
from pipeline.testing import KeyNotStable, run_agent, tool_context
from pipeline.testing.database import give_back, take

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


def mailer(
    key: Any, *, approval: bool = False, approvers: tuple[str, ...] = (), **effect: Any
) -> Any:
    def mail(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        raise AssertionError("the real send must never run in a test")

    side_effect = SideEffect(service="email", key=key, **effect)
    return tool(description="Mail it.", schema=SCHEMA, side_effect=side_effect, name="mail",
                requires_approval=approval, approvers=approvers,
                needs=("NIGHTSHIFT_EMAIL_URL",))(mail)  # fmt: skip


def agent_with(*tools: Any, **options: Any) -> Agent:
    return Agent(name="digest", system="You mail.", instructions="Mail the digest.",
                 tools=tools, input_schema={"type": "object"}, **options)  # fmt: skip


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
    assert action.calls == ("toolu_s000_0", "toolu_s001_0")
    assert action.state is ActionState.CONFIRMED and action.result == {"id": "m1"}
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


def test_an_unstubbed_side_effect_is_recorded_and_not_sent_and_needs_no_setting() -> None:
    # the mail tool needs NIGHTSHIFT_EMAIL_URL, which is not set: its stand-in does not
    run = run_agent(agent_with(mailer(by_team)), RUN, replies=mails("a"))

    assert run.status == "succeeded"
    (action,) = run.actions
    assert action.sends == 0 and action.result is not None and action.result["sent"] is False
    assert run.calls[0].result["sent"] is False


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
    (action,) = run.actions
    assert action.state is ActionState.CONFIRMED and action.decided_by == "alice"
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

    agent = replace(agent_with(mailer(by_team, approval=True)), script=script)
    run = run_agent(agent, RUN, tools={"mail": service}).reject(note="wrong list")

    assert run.status == "succeeded" and run.answer == "Not mailed."
    assert seen == ["Not done: tester rejected this action (wrong list)."]
    (action,) = run.actions
    assert action.state is ActionState.REJECTED and action.sends == 0 and service.sent == []


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


def test_a_tool_and_its_key_called_directly_with_a_test_context() -> None:
    mail = mailer(by_team)
    context = tool_context(agent_with(mail), RUN, config={"mail.url": "http://mail.test"})
    assert mail.action_key({"to": "a@b", "subject": "s"}, context) == "digest:digest:ops"
    assert context.config("mail.url") == "http://mail.test"


def test_a_report_is_kept_as_an_artifact_and_the_model_reads_its_reference() -> None:
    @tool(description="Write the report.", schema={"type": "object"})
    def report(args: dict[str, Any], context: ToolContext) -> ArtifactRequest:
        return ArtifactRequest("report.md", "# Night\nAll quiet.", "text/markdown")

    agent = Agent(name="reporter", system="You report.", instructions="Report.",
                  tools=(report,), input_schema={"type": "object"})  # fmt: skip
    run = run_agent(agent, {}, replies=[[tool_use(0, 0, "report", {})], "Reported."])

    assert run.artifacts == {"report.md": "# Night\nAll quiet."}
    ref = run.calls[0].result["artifact"]
    assert ref["name"] == "report.md" and ref["media_type"] == "text/markdown"
    assert "report.md" in run.state["artifacts"]


def test_a_run_that_asks_for_more_replies_than_given_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="asked the model for reply 2; replies= gave 1"):
        run_agent(agent_with(mailer(by_team)), RUN, replies=[[tool_use(0, 0, "fax", {})]])


# -- what only a worker did before: the run's state, limits, settings, deadlines, timers ------


def test_the_nightly_report_succeeds_its_success_check_reading_the_runs_state() -> None:
    sent = Service()
    run = run_agent(
        NIGHTLY_REPORT,
        {"team": "ops", "date": "2026-11-29"},
        tools={
            "fetch_source": lambda args, _: {"title": args["name"], "body": "All quiet."},
            "send_report_email": sent,
        },
    )

    assert (run.status, run.reason) == ("succeeded", "completed"), run.error
    assert run.answer == "The nightly report for ops is written and sent."
    assert list(run.artifacts) == ["report"]
    assert sent.sent == [("nightly_report:2026-11-29:ops", "Nightly report for ops, 2026-11-29")]


def test_max_steps_and_max_tool_calls_stop_the_run_as_on_a_worker() -> None:
    @tool(description="Look.", schema={"type": "object"})
    def look(args: dict[str, Any], context: ToolContext) -> str:
        return "nothing yet"

    def forever(conversation: Conversation) -> list[Any]:
        step = conversation.assistant_turns()
        return [tool_use(step, 0, "look", {})]

    agent = Agent(name="looker", system="You look.", instructions="Look.", tools=(look,),
                  input_schema={"type": "object"}, script=forever, max_steps=3)  # fmt: skip
    run = run_agent(agent, {})
    assert (run.status, run.reason, run.step) == ("failed", "max_steps", 3)

    run = run_agent(replace(agent, max_steps=10, max_tool_calls=2), {})
    assert (run.status, run.reason) == ("failed", "max_tool_calls")
    assert len(run.calls) == 2


def test_a_runs_token_limit_and_the_deployments_nightly_cap_stop_it_as_on_a_worker() -> None:
    replies = mails("a", "b", "c")
    run = run_agent(agent_with(mailer(by_subject), max_run_tokens=1), RUN, replies=replies)
    assert (run.status, run.reason) == ("failed", "max_tokens")
    # a step's tokens count from its checkpoint: the first step ends, the second never asks
    assert [a.key for a in run.actions] == ["digest:digest:a"] and run.step == 1

    capped = {"NIGHTSHIFT_NIGHTLY_TOKEN_CAP": "1"}
    run = run_agent(agent_with(mailer(by_subject)), RUN, replies=replies, env=capped)
    assert (run.status, run.reason) == ("failed", NIGHTLY_CAP)


def test_a_tool_whose_setting_is_missing_fails_the_run_with_reason_config() -> None:
    @tool(description="Read it.", schema={"type": "object"}, needs=("acme.url",))
    def read(args: dict[str, Any], context: ToolContext) -> str:
        return context.config("acme.url")

    agent = Agent(name="reader", system="You read.", instructions="Read.", tools=(read,),
                  input_schema={"type": "object"})  # fmt: skip
    replies = [[tool_use(0, 0, "read", {})], "Read."]

    run = run_agent(agent, {}, replies=replies)
    assert (run.status, run.reason) == ("failed", "config")
    assert "NIGHTSHIFT_CONFIG_ACME_URL" in (run.error or "")

    run = run_agent(agent, {}, replies=replies, config={"acme.url": "http://acme.test"})
    assert run.status == "succeeded" and run.calls[0].content == "http://acme.test"


def timer_agent() -> Agent:
    def script(conversation: Conversation) -> list[Any]:
        if not conversation.tool_uses():
            return [tool_use(0, 0, "check_back_in", {"seconds": 3600, "reason": "settle"})]
        return [text("Checked again.")]

    return Agent(name="waiter", system="You wait.", instructions="Wait an hour.",
                 tools=(check_back_in,), input_schema={}, script=script)  # fmt: skip


def test_a_timer_waits_until_the_clock_is_advanced_past_it() -> None:
    run = run_agent(timer_agent(), {})
    assert run.status == "waiting" and run.wake_at is not None
    assert timedelta(minutes=59) < run.wake_at - run.now <= timedelta(hours=1)

    run.advance(minutes=30)
    assert run.status == "waiting"  # the tick found nothing due

    run.advance(minutes=31)
    assert (run.status, run.answer) == ("succeeded", "Checked again.")
    assert run.calls[0].result == {"woke": True, "reason": "settle"}


def test_a_deadline_that_passes_while_the_run_waits_ends_it() -> None:
    run = run_agent(timer_agent(), {}, deadline="30m")
    assert run.status == "waiting"

    run.advance(minutes=45)

    assert (run.status, run.reason) == ("failed", "deadline")


# -- the key retention window, across a worker that died mid-send -----------------------------


def lost_mid_send(calls: list[str]) -> Any:
    """The mail service's stand-in: the first send reaches it, and then the worker is gone
    before the reply is saved (its lease lost); later sends are answered."""

    def send(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        calls.append(context.idempotency_key or "")
        if len(calls) == 1:
            raise LeaseLost("the worker died after sending")
        return {"id": "m1", "replayed": len(calls) > 1}

    return send


def retained_mailer(looked_up: list[str]) -> Any:
    def lookup(key: str, args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        looked_up.append(key)
        return {"id": "m1", "found": True}

    return mailer(by_team, honours_keys=True, key_retention=timedelta(hours=24), lookup=lookup)


def test_inside_the_key_retention_the_unknown_send_is_resent_with_the_same_key() -> None:
    calls: list[str] = []
    looked_up: list[str] = []
    run = run_agent(agent_with(retained_mailer(looked_up)), RUN, replies=mails("a"),
                    tools={"mail": lost_mid_send(calls)})  # fmt: skip
    assert run.status == "running" and calls == ["digest:digest:ops"]

    run.advance(hours=1)  # the lease lapses; the tick hands the run to a worker

    assert run.status == "succeeded"
    assert calls == ["digest:digest:ops", "digest:digest:ops"] and looked_up == []
    assert run.actions[0].result == {"id": "m1", "replayed": True}


def test_past_the_key_retention_the_unknown_send_is_looked_up_not_resent() -> None:
    calls: list[str] = []
    looked_up: list[str] = []
    run = run_agent(agent_with(retained_mailer(looked_up)), RUN, replies=mails("a"),
                    tools={"mail": lost_mid_send(calls)})  # fmt: skip

    run.advance(hours=30)  # the worker comes back 30 hours later

    assert run.status == "succeeded"
    assert calls == ["digest:digest:ops"] and looked_up == ["digest:digest:ops"]
    assert run.actions[0].result == {"id": "m1", "found": True}


# -- the database a run lives in ---------------------------------------------------------------


def test_each_run_has_a_database_of_its_own_in_the_templates_state() -> None:
    first = run_agent(agent_with(mailer(by_team)), RUN, replies=mails("a"))
    second = run_agent(agent_with(mailer(by_team)), RUN, replies=mails("a"))

    assert first.actions[0].key == second.actions[0].key  # no conflict: two databases
    assert first.settings.database_url != second.settings.database_url
    del first, second

    database = take()  # one given back, emptied: as the template left it
    url = make_url(database.url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename <> 'alembic_version'"
        ).fetchall()
        rows = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone() for (t,) in tables}
    give_back(database)
    assert len(rows) > 10 and set(rows.values()) == {(0,)}
