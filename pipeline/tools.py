"""The tool registry: name, description, JSON schema, and whether a tool touches the world."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator

from pipeline.settings import Settings


@dataclass(frozen=True)
class ArtifactRequest:
    """A tool's output that should be kept as a file rather than inline in the journal."""

    name: str
    content: str
    media_type: str = "text/plain"


ToolOutput = dict[str, Any] | str | ArtifactRequest


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: never a session, never a lease."""

    run_id: uuid.UUID
    agent: str
    tool_use_id: str
    settings: Settings
    run_input: dict[str, Any]
    idempotency_key: str | None = None
    """Set for side-effecting tools: send it to the service (e.g. as `Idempotency-Key`)."""
    keep_going: Callable[[], None] = lambda: None
    """Long tools call this between chunks of work: it raises (past any `except Exception`)
    when the run was cancelled, passed its deadline or lost its lease."""


KeyBuilder = Callable[[dict[str, Any], "ToolContext"], str]


@dataclass(frozen=True)
class SideEffect:
    """How a side-effecting tool talks to its service, for the action protocol."""

    service: str
    key: KeyBuilder
    """Builds the idempotency key from what the action means."""
    honours_keys: Callable[[Settings], bool] = lambda settings: False
    """Whether the service, as deployed, replays a repeated key instead of acting twice."""
    key_retention: Callable[[Settings], timedelta | None] = lambda settings: None
    """How long the service, as deployed, remembers a key; None means forever."""
    lookup: Callable[[str, ToolContext], ToolOutput | None] | None = None
    """Asks the service what happened under a key: its result, or None if nothing happened.
    Raises pipeline.LookupUnsupported when the service, as deployed, cannot tell."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[[dict[str, Any], ToolContext], ToolOutput]
    side_effect: SideEffect | None = None
    requires_approval: bool = False
    approvers: tuple[str, ...] = ()
    wake_time: Callable[[dict[str, Any], datetime], datetime] | None = None
    """For timer tools: when the run should wake, given the arguments and the time of the
    call. The run waits with no process until then; `fn` runs after it wakes."""
    needs: tuple[str, ...] = ()
    """Environment variables the tool cannot work without (`NIGHTSHIFT_EMAIL_URL`): a run of
    an agent with this tool fails at once, with reason `config`, on a worker where one is
    unset, instead of spending its steps on a service that is not there."""
    validator: Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        Draft202012Validator.check_schema(self.input_schema)
        object.__setattr__(self, "validator", Draft202012Validator(self.input_schema))

    @property
    def has_side_effects(self) -> bool:
        return self.side_effect is not None

    def argument_errors(self, args: object) -> list[str]:
        """Human-readable schema violations, empty when the arguments are valid."""
        errors = sorted(self.validator.iter_errors(args), key=lambda e: list(e.path))
        return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors]

    def spec(self) -> dict[str, Any]:
        """The tool as the Messages API expects it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


def tool(
    *,
    description: str,
    schema: dict[str, Any],
    name: str | None = None,
    side_effect: SideEffect | None = None,
    requires_approval: bool = False,
    approvers: tuple[str, ...] = (),
    wake_time: Callable[[dict[str, Any], datetime], datetime] | None = None,
    needs: tuple[str, ...] = (),
) -> Callable[[Callable[[dict[str, Any], ToolContext], ToolOutput]], Tool]:
    """Make a function a tool the model may call (an agent lists it in its `tools`)."""

    def make(fn: Callable[[dict[str, Any], ToolContext], ToolOutput]) -> Tool:
        return Tool(
            name=name or fn.__name__,
            description=description,
            input_schema=schema,
            fn=fn,
            side_effect=side_effect,
            requires_approval=requires_approval,
            approvers=approvers,
            wake_time=wake_time,
            needs=needs,
        )

    return make


_DOCUMENT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 200},
        "body": {"type": "string", "minLength": 1},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}


def document_tool(name: str, artifact: str, description: str) -> Tool:
    """A tool that keeps a markdown document (title, body) as the run's `artifact`.

    Content-addressed, so writing it again after a crash produces the same file.
    """

    def write(args: dict[str, Any], context: ToolContext) -> ArtifactRequest:
        return ArtifactRequest(artifact, f"# {args['title']}\n\n{args['body']}\n", "text/markdown")

    return tool(name=name, description=description, schema=_DOCUMENT_SCHEMA)(write)


MAX_WAIT = timedelta(days=30)


def _after(args: dict[str, Any], now: datetime) -> datetime:
    if "until" in args:
        return min(datetime.fromisoformat(args["until"]), now + MAX_WAIT)
    return now + timedelta(seconds=args["seconds"])


@tool(
    description=(
        "Pause this run and continue later: either after `seconds`, or at `until` (an ISO-8601 "
        "time with a timezone). Nothing runs while waiting. Returns when the time has come."
    ),
    schema={
        "type": "object",
        "properties": {
            "seconds": {"type": "integer", "minimum": 1, "maximum": int(MAX_WAIT.total_seconds())},
            "until": {"type": "string", "format": "date-time", "pattern": r"(Z|[+-]\d\d:\d\d)$"},
            "reason": {"type": "string", "maxLength": 200},
        },
        "oneOf": [{"required": ["seconds"]}, {"required": ["until"]}],
        "additionalProperties": False,
    },
    wake_time=_after,
)
def check_back_in(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"woke": True, "reason": args.get("reason", "")}
