"""The authoring API: what a user's package imports, typed tools, side effects that are hard
to get wrong, and a one-line error for every definition mistake."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

import pipeline
from pipeline import Agent, PersonalData, SideEffect, ToolContext, text, tool
from pipeline.errors import DefinitionError
from pipeline.settings import Settings
from pipeline.tools import OnceOutsideStep

SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}


def context(agent: str = "mailer", **env: str) -> ToolContext:
    settings = Settings.from_env({"NIGHTSHIFT_DATA_DIR": "/tmp/nightshift-unit", **env})
    return ToolContext(uuid.uuid4(), agent, "toolu_1", settings, {"date": "2026-11-29"})


def key(args: Any, context: ToolContext) -> str:
    return f"{args['to']}:{context.run_input['date']}"


def send(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"sent": args["to"]}


def agent_with(*tools: Any, **fields: Any) -> Agent:
    values: dict[str, Any] = {
        "name": "mailer",
        "system": "You send mail.",
        "instructions": "Send it.",
        "tools": tools,
        "input_schema": {"type": "object"},
    }
    return Agent(**(values | fields))


# -- the public API --------------------------------------------------------------------------


def test_every_public_name_is_importable_and_documented_in_the_package_docstring() -> None:
    doc = pipeline.__doc__ or ""
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None
        assert re.search(rf"^\s+{name}\b", doc, re.MULTILINE), f"{name} is not documented"
    issue_12 = {"Agent", "tool", "SideEffect", "ToolContext", "ArtifactRequest", "check_back_in",
                "once", "PermanentError", "TemporaryError", "LookupUnsupported"}  # fmt: skip
    assert issue_12 <= set(pipeline.__all__)


def test_todays_keywords_still_define_a_tool_and_an_agent_without_a_script() -> None:
    # given a tool and an agent written with the keywords of the first release
    effect = SideEffect(service="email", key=key)
    mail = tool(description="Send one email.", schema=SCHEMA, side_effect=effect)(send)
    agent = agent_with(mail)

    # then the agent has no script (it runs on the real model) and the tool works as before
    assert agent.script is None
    assert mail.input_schema == SCHEMA and mail.spec()["name"] == "send"
    assert mail.run({"to": "ops@example.com"}, context()) == {"sent": "ops@example.com"}
    assert mail.argument_errors({}) == ["(root): 'to' is a required property"]


# -- typed tools -----------------------------------------------------------------------------


class Reminder(BaseModel):
    client: str = Field(pattern="^[a-z]+$")
    amount: float = Field(gt=0)


def test_a_pydantic_argument_derives_the_schema_validates_and_hands_the_model_over() -> None:
    seen: list[Reminder] = []

    @tool
    def remind(reminder: Reminder, context: ToolContext) -> dict[str, Any]:
        """Remind a client of an unpaid invoice."""
        seen.append(reminder)
        return {"client": reminder.client}

    assert remind.description == "Remind a client of an unpaid invoice."
    assert remind.input_schema["properties"]["amount"] == {
        "exclusiveMinimum": 0, "title": "Amount", "type": "number"}  # fmt: skip
    assert remind.input_schema["required"] == ["client", "amount"]
    assert remind.argument_errors({"client": "Acme!", "amount": "lots"}) == [
        "client: String should match pattern '^[a-z]+$'",
        "amount: Input should be a valid number, unable to parse string as a number",
    ]
    assert remind.run({"client": "acme", "amount": 12.5}, context()) == {"client": "acme"}
    assert seen == [Reminder(client="acme", amount=12.5)]


def test_annotated_parameters_become_the_schema_and_arrive_as_keyword_arguments() -> None:
    class Page(BaseModel):
        url: str
        size: int

    @tool(description="Fetch a page.")
    def fetch(
        url: Annotated[str, Field(description="an https URL")],
        max_bytes: int = 1000,
        *,
        context: ToolContext,
    ) -> Page:
        return Page(url=f"{url}#{context.agent}", size=max_bytes)

    schema = fetch.input_schema
    assert schema["properties"]["url"]["description"] == "an https URL"
    assert schema["required"] == ["url"] and schema["additionalProperties"] is False
    assert fetch.argument_errors({"url": "https://x", "max_bytes": 5, "extra": 1}) == [
        "extra: Extra inputs are not permitted"
    ]
    # a pydantic result is journaled as its JSON
    assert fetch.run({"url": "https://x"}, context()) == {"url": "https://x#mailer", "size": 1000}


def test_a_side_effects_key_and_lookup_get_the_typed_arguments() -> None:
    looked_up: list[tuple[str, Any]] = []

    def lookup(key: str, args: Reminder, context: ToolContext) -> dict[str, Any] | None:
        looked_up.append((key, args))
        return None

    effect = SideEffect(service="email", key=lambda r, c: f"{r.client}:2026-W48", lookup=lookup)

    @tool(description="Remind.", side_effect=effect)
    def remind(reminder: Reminder) -> str:
        return "sent"

    args = {"client": "acme", "amount": 3}
    key = remind.action_key(args, context(agent="invoices"))
    assert key == "invoices:acme:2026-W48"
    assert remind.look_up(key, args, context()) is None
    assert looked_up == [(key, Reminder(client="acme", amount=3))]


# -- side effects ----------------------------------------------------------------------------


def test_honours_keys_and_key_retention_take_plain_values_or_functions_of_the_settings() -> None:
    plain = SideEffect(service="s", key=key, honours_keys=True, key_retention=timedelta(hours=2))
    deployed = SideEffect(
        service="email",
        key=key,
        honours_keys=lambda settings: settings.email_mode == "keys",
        key_retention=lambda settings: timedelta(hours=settings.email_key_retention_hours),
    )
    settings = context(NIGHTSHIFT_EMAIL_MODE="lookup").settings
    assert plain.honoured(settings) and plain.retention(settings) == timedelta(hours=2)
    assert not deployed.honoured(settings)
    assert deployed.retention(settings) == timedelta(hours=24)
    assert not SideEffect(service="s", key=key).honoured(settings)


def test_keys_are_namespaced_by_agent_unless_a_shared_namespace_is_named() -> None:
    own = tool(description="d", schema=SCHEMA, side_effect=SideEffect(service="e", key=key))(send)
    shared = tool(
        description="d",
        schema=SCHEMA,
        side_effect=SideEffect(service="e", key=key, namespace="billing"),
    )(send)
    args = {"to": "acme"}
    assert own.action_key(args, context("reminders")) == "reminders:acme:2026-11-29"
    assert own.action_key(args, context("dunning")) == "dunning:acme:2026-11-29"
    assert shared.action_key(args, context("reminders")) == "billing:acme:2026-11-29"
    assert shared.action_key(args, context("dunning")) == "billing:acme:2026-11-29"


# -- definition errors -----------------------------------------------------------------------


def lookup_without_args(key: str, context: ToolContext) -> None:
    return None


TOOL_MISTAKES = [
    (dict(side_effect=SideEffect(service="e", key=key, honours_keys=True)),
     "honours_keys needs key_retention"),
    (dict(side_effect=SideEffect(service="e", key=key, honours_keys=lambda s: True)),
     "honours_keys needs key_retention"),
    (dict(side_effect=SideEffect(service="e", key=key, key_retention=timedelta(hours=1))),
     "key_retention is set but honours_keys is False"),
    (dict(side_effect=SideEffect(service="e", key=key, honours_keys=True,
                                 key_retention=timedelta(0))),
     "key_retention must be a positive timedelta"),
    (dict(side_effect=SideEffect(service="e", key=key, lookup=lookup_without_args)),
     "lookup must take (key, args, context)"),
    (dict(side_effect=SideEffect(service="e", key=lambda args: "k")),
     "key must take (args, context)"),
    (dict(side_effect=SideEffect(service="", key=key)), "needs a service name"),
    (dict(side_effect=SideEffect(service="e", key=key, namespace="a:b")), "namespace 'a:b'"),
    (dict(side_effect=SideEffect(service="e", key=key, per_run_cap=-1)),
     "per_run_cap must be a count"),
    (dict(side_effect=SideEffect(service="e", key=key, send_timeout=timedelta(0))),
     "send_timeout must be a positive timedelta"),
    (dict(side_effect=SideEffect(service="e", key=key, send_timeout=timedelta(days=2))),
     "send_timeout must be a positive timedelta of at most a day"),
    (dict(side_effect=SideEffect(service="e", key=key, send_timeout=30)),  # type: ignore[arg-type]
     "send_timeout must be a positive timedelta"),
    (dict(side_effect=SideEffect(service="e", key=key, check=lambda args: None)),
     "check must take (args, context)"),
    (dict(requires_approval=True), "requires_approval=True needs a side_effect"),
    (dict(approvers=("lead",)), "approvers are given but requires_approval is False"),
    (dict(side_effect=SideEffect(service="e", key=key), requires_approval=True,
          approvers="lead"), "approvers must be a tuple"),
    (dict(name="send email"), "the name must match"),
    (dict(description=" "), "needs a description"),
    (dict(schema={"type": "array"}), 'schema must have "type": "object"'),
    (dict(schema={"type": "object", "properties": {"a": {"type": "strin"}}}),
     "schema is not valid JSON Schema"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "message"), TOOL_MISTAKES)
def test_every_tool_definition_mistake_is_one_line_naming_the_tool(
    options: dict[str, Any], message: str
) -> None:
    options = {"description": "Send one email.", "schema": SCHEMA} | options
    with pytest.raises(DefinitionError) as raised:
        tool(**options)(send)
    error = str(raised.value)
    assert "\n" not in error
    assert error.startswith(f"tool {options.get('name', 'send')!r}: ")
    assert message in error


def untyped(args, context):  # type: ignore[no-untyped-def]
    return {}


def two_contexts(a: ToolContext, b: ToolContext) -> str:
    return ""


def takes_one(args: dict[str, Any]) -> str:
    return ""


@pytest.mark.parametrize(
    ("fn", "schema", "message"),
    [
        (untyped, None, "give schema=..., or annotate every argument (no annotation on 'args')"),
        (two_contexts, None, "takes the ToolContext twice"),
        (takes_one, SCHEMA, "with schema=, the function must take (args, context)"),
        (takes_one, None, "`args: dict` needs schema="),
    ],
)
def test_a_tool_function_that_does_not_fit_is_refused_naming_the_tool(
    fn: Any, schema: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(DefinitionError, match=re.escape(f"tool {fn.__name__!r}: ")) as raised:
        tool(description="d", schema=schema)(fn)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_an_annotation_that_cannot_be_resolved_is_named() -> None:
    def later(item: NotDefinedYet) -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    with pytest.raises(DefinitionError, match="tool 'later': cannot read its type annotations"):
        tool(description="d")(later)


MAIL = tool(description="Send one email.", schema=SCHEMA)(send)

AGENT_MISTAKES = [
    (dict(name="my agent"), "agent name 'my agent' must match"),
    (dict(tools=(send,)), "agent 'mailer': tools[0] (send) is not a tool: decorate it"),
    (dict(tools=(MAIL, MAIL)), "agent 'mailer': lists two tools named 'send'"),
    (dict(input_schema={"type": "objekt"}), "agent 'mailer': input_schema is not valid"),
    (dict(input_schema="{}"), "agent 'mailer': input_schema must be a JSON Schema object"),
    (dict(system=""), "agent 'mailer': system must be a non-empty string"),
    (dict(script="reply"), "agent 'mailer': script must be a function"),
    (dict(max_steps=0), "agent 'mailer': max_steps must be a positive integer"),
    (dict(event_sources=("ops",)), "agent 'mailer': event_sources holds a str"),
    (dict(on_version_change="ask"), "agent 'mailer': on_version_change must be one of continue"),
    (dict(personal_data=PersonalData(tools={"mail": ("args.to",)})),
     "agent 'mailer': personal_data.tools names 'mail', not one of its tools"),
    (dict(personal_data=PersonalData(tools={"send": ("to",)})),
     "agent 'mailer': personal_data.tools['send'] field 'to' must start with args. or result."),
    (dict(personal_data=PersonalData(input=("to..x",))),
     "agent 'mailer': personal_data.input field 'to..x' is not a dotted path of names or *"),
    (dict(personal_data={"input": ["to"]}), "agent 'mailer': personal_data must be a PersonalData"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "message"), AGENT_MISTAKES)
def test_every_agent_definition_mistake_is_one_line_naming_the_agent(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(DefinitionError) as raised:
        agent_with(MAIL, **fields)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_list_of_tools_is_accepted_as_a_tuple() -> None:
    agent = agent_with(script=lambda conversation: [text("done")], tools=[MAIL])
    assert agent.tools == (MAIL,)


def test_once_outside_a_running_step_is_refused_with_a_clear_error() -> None:
    with pytest.raises(OnceOutsideStep, match=r"once\(\) works only inside a tool"):
        pipeline.once("invoice-number", lambda: 1)


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")
    team: str


def test_a_pydantic_model_that_says_nothing_of_extra_fields_refuses_them() -> None:
    @tool
    def strict(reminder: Reminder, context: ToolContext) -> dict[str, Any]:
        """Remind a client."""
        return {}

    @tool
    def loose(args: Loose, context: ToolContext) -> dict[str, Any]:
        """Chose to ignore what it does not know."""
        return {}

    # given a model that did not choose, a model's invented field is refused and said
    assert strict.argument_errors({"client": "acme", "amount": 1, "cc": "x@evil.test"}) == [
        "cc: Extra inputs are not permitted"
    ]
    assert strict.input_schema["additionalProperties"] is False
    # and one that chose to ignore them keeps its choice
    assert loose.argument_errors({"team": "ops", "cc": "x"}) == []
    assert "additionalProperties" not in loose.input_schema
