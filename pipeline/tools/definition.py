"""A tool's definition, Tool and the `@tool` decorator: a function the model may call, with its
arguments, its side effect (if any), approval, a timer's wake time and the settings it needs."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from pipeline.errors import DefinitionError, NotConfigured
from pipeline.keys import action_key
from pipeline.settings import config_variable
from pipeline.tools.arguments import Arguments, SchemaArguments, arguments_of
from pipeline.tools.context import ToolContext, ToolOutput
from pipeline.tools.side_effects import SideEffect

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What the Messages API accepts as a tool name."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., ToolOutput]
    arguments: Arguments = field(repr=False)
    side_effect: SideEffect | None = None
    requires_approval: bool = False
    approvers: tuple[str, ...] = ()
    wake_time: Callable[[dict[str, Any], datetime], datetime] | None = None
    """For timer tools: when the run should wake, given the arguments and the time of the
    call. The run waits with no process until then; `fn` runs after it wakes."""
    needs: tuple[str, ...] = ()
    """Settings the tool cannot work without: environment variables (`NIGHTSHIFT_EMAIL_URL`)
    or tool settings (`acme.url`, see ToolContext.config). A run of an agent with this tool
    fails at once, with reason `config`, on a worker where one is unset, instead of spending
    its steps on a service that is not there."""

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise DefinitionError(f"tool {self.name!r}: " + "; ".join(problems))
        object.__setattr__(self, "approvers", tuple(self.approvers))
        # A tool setting (`acme.url`) is needed as its variable, which the error then names.
        needs = (config_variable(n) if "." in n else n for n in self.needs)
        object.__setattr__(self, "needs", tuple(needs))

    def _problems(self) -> list[str]:
        if not isinstance(self.name, str) or not TOOL_NAME.match(self.name):
            return [f"the name must match {TOOL_NAME.pattern} (the Messages API's rule)"]
        found = []
        if not isinstance(self.description, str) or not self.description.strip():
            found.append("needs a description (description=... or a docstring)")
        if self.side_effect is not None:
            if not isinstance(self.side_effect, SideEffect):
                found.append("side_effect must be a pipeline.SideEffect")
            else:
                found += self.side_effect.problems()
        if self.requires_approval and self.side_effect is None:
            found.append("requires_approval=True needs a side_effect (approval is for actions)")
        if self.approvers and not self.requires_approval:
            found.append("approvers are given but requires_approval is False")
        if isinstance(self.approvers, str):
            found.append("approvers must be a tuple of names, not one string")
        if isinstance(self.needs, str):
            found.append("needs must be a tuple of names, not one string")
        return found

    @property
    def input_schema(self) -> dict[str, Any]:
        return self.arguments.schema

    @property
    def has_side_effects(self) -> bool:
        return self.side_effect is not None

    @property
    def typed(self) -> bool:
        """Whether the tool gets a pydantic value rather than the raw dict."""
        return not isinstance(self.arguments, SchemaArguments)

    def argument_errors(self, args: object) -> list[str]:
        """Human-readable violations of the tool's arguments, empty when they are valid."""
        return self.arguments.errors(args)

    def run(self, args: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Call the tool with the model's (valid) arguments."""
        with _unconfigured_stops_the_run():
            output = self.arguments.call(self.fn, self.arguments.parse(args), context)
        return output.model_dump(mode="json") if isinstance(output, BaseModel) else output

    def action_key(self, args: dict[str, Any], context: ToolContext) -> str:
        """The side effect's idempotency key, in its namespace (by default the agent's)."""
        assert self.side_effect is not None, f"{self.name} has no side effect"
        with _unconfigured_stops_the_run():
            meaning = self.side_effect.key(self.arguments.parse(args), context)
        return action_key(self.side_effect.namespace or context.agent, meaning)

    def check_action(self, args: dict[str, Any], context: ToolContext) -> None:
        """The side effect's check of a new action (PermanentError: refused)."""
        assert self.side_effect is not None and self.side_effect.check is not None
        with _unconfigured_stops_the_run():
            self.side_effect.check(self.arguments.parse(args), context)

    def look_up(self, key: str, args: dict[str, Any], context: ToolContext) -> ToolOutput | None:
        assert self.side_effect is not None and self.side_effect.lookup is not None
        with _unconfigured_stops_the_run():
            return self.side_effect.lookup(key, self.arguments.parse(args), context)

    def spec(self) -> dict[str, Any]:
        """The tool as the Messages API expects it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


@contextmanager
def _unconfigured_stops_the_run() -> Iterator[None]:
    """A tool's NotConfigured (an error) becomes the stop signal that ends the run with reason
    `config`, so the engine's handling of tool errors (the model reads them) never sees it."""
    try:
        yield
    except NotConfigured as exc:
        raise exc.stop() from exc


ToolFunction = Callable[..., ToolOutput]


@typing.overload
def tool(fn: ToolFunction, /) -> Tool: ...


@typing.overload
def tool(
    *,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    name: str | None = None,
    side_effect: SideEffect | None = None,
    requires_approval: bool = False,
    approvers: tuple[str, ...] = (),
    wake_time: Callable[[dict[str, Any], datetime], datetime] | None = None,
    needs: tuple[str, ...] = (),
) -> Callable[[ToolFunction], Tool]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    name: str | None = None,
    side_effect: SideEffect | None = None,
    requires_approval: bool = False,
    approvers: tuple[str, ...] = (),
    wake_time: Callable[[dict[str, Any], datetime], datetime] | None = None,
    needs: tuple[str, ...] = (),
) -> Tool | Callable[[ToolFunction], Tool]:
    """Make a function a tool the model may call (an agent lists it in its `tools`).

    Either `schema=` (a JSON Schema) with a function `(args: dict, context)`, or a typed
    function: one pydantic model argument, or annotated arguments; then the schema is derived,
    the model's arguments are validated with it and the function gets typed values. A parameter
    annotated `ToolContext` (or an unannotated one named `context`) receives the context.
    `description` defaults to the function's docstring.
    """

    def make(fn: ToolFunction) -> Tool:
        if not callable(fn):
            raise DefinitionError(f"@tool decorates a function, not a {type(fn).__name__}")
        tool_name = str(name or getattr(fn, "__name__", ""))
        text = description if description is not None else inspect.getdoc(fn)
        return Tool(
            name=tool_name,
            description=(text or "").strip(),
            fn=fn,
            arguments=arguments_of(tool_name, fn, schema),
            side_effect=side_effect,
            requires_approval=requires_approval,
            approvers=approvers,
            wake_time=wake_time,
            needs=needs,
        )

    return make(fn) if fn is not None else make
