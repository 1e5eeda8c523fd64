"""Tools the model may call: their arguments (a JSON Schema, a pydantic model or annotated
parameters), whether they touch the world (SideEffect), and `once` for effects on nightshift's
own record. Every mistake a tool author can make here is a DefinitionError naming the tool."""

from __future__ import annotations

import inspect
import re
import types
import typing
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from pipeline.errors import DefinitionError, NightshiftError
from pipeline.keys import action_key
from pipeline.settings import Settings, config_variable

T = TypeVar("T")

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What the Messages API accepts as a tool name."""
NAMESPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ArtifactRequest:
    """A tool's output that should be kept as a file rather than inline in the journal."""

    name: str
    content: str
    media_type: str = "text/plain"


ToolOutput = dict[str, Any] | str | ArtifactRequest | BaseModel


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: never a session, never a lease."""

    run_id: uuid.UUID
    agent: str
    tool_use_id: str
    settings: Settings
    run_input: dict[str, Any]
    idempotency_key: str | None = None
    """Set for side-effecting tools (and their lookup): send it to the service, e.g. as
    `Idempotency-Key`. Already namespaced by agent (see SideEffect.namespace)."""
    keep_going: Callable[[], None] = field(default=lambda: None, repr=False)
    """Long tools call this between chunks of work: it raises (past any `except Exception`)
    when the run was cancelled, passed its deadline or lost its lease."""

    def config(self, name: str, default: str | None = None) -> str:
        """This deployment's setting `name` (`"acme.url"`): NIGHTSHIFT_CONFIG_ACME_URL, else
        `[acme] url` in NIGHTSHIFT_CONFIG_FILE, else `default`. Missing with no default: a
        PermanentError naming both places (the model sees it as the tool's error)."""
        return self.settings.config.get(name, default)


KeyBuilder = Callable[[Any, ToolContext], str]
"""(arguments, context) -> what the action means, e.g. `2026-11-29:ops`."""
Lookup = Callable[[str, Any, ToolContext], "ToolOutput | None"]
"""(key, the action's stored arguments, context) -> the service's record of the action, or
None if nothing happened under the key. Raises LookupUnsupported when it cannot tell."""
Check = Callable[[Any, ToolContext], None]
"""(arguments, context) -> None, or PermanentError with the reason the model reads."""


@dataclass(frozen=True)
class SideEffect:
    """How a side-effecting tool talks to its service, for the action protocol."""

    service: str
    key: KeyBuilder
    """Builds the idempotency key from what the action means; the same meaning, the same key."""
    honours_keys: bool | Callable[[Settings], bool] = False
    """Whether the service, as deployed, replays a repeated key instead of acting twice."""
    key_retention: timedelta | Callable[[Settings], timedelta] | None = None
    """How long the service remembers a key (required with honours_keys; `timedelta.max` for
    a service that never forgets). After it, an unknown outcome is reconciled, not resent."""
    lookup: Lookup | None = None
    """Asks the service what happened under a key, given the key and the stored arguments."""
    namespace: str | None = None
    """Keys are `<namespace>:<key>`; by default the agent's name, so two agents cannot collide
    by accident. Agents that must share keys (one reminder per client, whichever agent sends
    it) name the same namespace."""
    per_run_cap: int | Callable[[Settings], int] | None = None
    """How many of this service's actions one run may record (an email cap, say): past it the
    call is refused with a permanent error and nothing is sent. Counted from the run's actions
    in the database, so a replay, a crash or a second worker cannot reset it."""
    check: Check | None = None
    """Refuses a call before its action is recorded: raise PermanentError saying why (a
    target outside the run's allowlist, an amount out of bounds). Nothing is saved, so nothing
    waits for approval. Asked only when the call would record a new action, never for one this
    run recorded already: a replayed step cannot refuse what an approver was shown."""

    def honoured(self, settings: Settings) -> bool:
        return bool(
            self.honours_keys(settings) if callable(self.honours_keys) else self.honours_keys
        )

    def retention(self, settings: Settings) -> timedelta | None:
        """None: the service keeps no keys (or, misconfigured, says nothing): never resend."""
        value = self.key_retention(settings) if callable(self.key_retention) else self.key_retention
        return value if isinstance(value, timedelta) else None

    def cap(self, settings: Settings) -> int | None:
        return self.per_run_cap(settings) if callable(self.per_run_cap) else self.per_run_cap

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.service, str) or not self.service.strip():
            found.append("side effect needs a service name (e.g. service='email')")
        if not callable(self.key):
            found.append("side effect's key must be a function (args, context) -> str")
        elif not _takes(self.key, 2):
            found.append("side effect's key must take (args, context)")
        if self.honours_keys is not False and self.key_retention is None:
            found.append(
                "honours_keys needs key_retention: how long the service remembers a key "
                "(e.g. timedelta(hours=24); timedelta.max if it never forgets)"
            )
        if self.honours_keys is False and self.key_retention is not None:
            found.append("key_retention is set but honours_keys is False; set honours_keys")
        if not isinstance(self.honours_keys, bool) and not callable(self.honours_keys):
            found.append("honours_keys must be a bool or a function of the settings")
        retention = self.key_retention
        if not (retention is None or callable(retention) or _positive(retention)):
            found.append("key_retention must be a positive timedelta or a function of the settings")
        if self.lookup is not None and (not callable(self.lookup) or not _takes(self.lookup, 3)):
            found.append("lookup must take (key, args, context)")
        if self.namespace is not None and not NAMESPACE.match(str(self.namespace)):
            found.append(f"namespace {self.namespace!r} must match {NAMESPACE.pattern}")
        if self.check is not None and (not callable(self.check) or not _takes(self.check, 2)):
            found.append("check must take (args, context)")
        cap = self.per_run_cap
        if not (cap is None or callable(cap) or (type(cap) is int and cap >= 0)):
            found.append("per_run_cap must be a count (0 or more) or a function of the settings")
        return found


# -- how a tool takes its arguments -----------------------------------------------------------


class Arguments(Protocol):
    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema the model is given."""

    def errors(self, args: object) -> list[str]:
        """Why the model's arguments are invalid; empty when they are valid."""

    def parse(self, args: dict[str, Any]) -> Any:
        """The arguments as the tool (and its key and lookup) receive them."""

    def call(self, fn: Callable[..., Any], value: Any, context: ToolContext) -> Any: ...


@dataclass(frozen=True)
class SchemaArguments:
    """A hand-written JSON Schema; the tool gets the arguments as a dict: fn(args, context)."""

    schema: dict[str, Any]
    validator: Draft202012Validator = field(repr=False, compare=False)

    def errors(self, args: object) -> list[str]:
        errors = sorted(self.validator.iter_errors(args), key=lambda e: list(e.path))
        return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors]

    def parse(self, args: dict[str, Any]) -> Any:
        return args

    def call(self, fn: Callable[..., Any], value: Any, context: ToolContext) -> Any:
        return fn(value, context)


@dataclass(frozen=True)
class ModelArguments:
    """A pydantic model: derived schema, validated, handed over as the model's instance.

    `parameter` is the tool's parameter that takes the whole model; None when the model was
    built from the tool's own annotated parameters (each field is passed by name)."""

    model: type[BaseModel]
    parameter: str | None
    context_parameter: str | None
    schema: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        schema = self.model.model_json_schema()
        schema.pop("title", None)
        object.__setattr__(self, "schema", schema)

    def errors(self, args: object) -> list[str]:
        try:
            self.model.model_validate(args)
        except ValidationError as exc:
            return [f"{'/'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()]
        return []

    def parse(self, args: dict[str, Any]) -> Any:
        return self.model.model_validate(args)

    def call(self, fn: Callable[..., Any], value: Any, context: ToolContext) -> Any:
        kwargs: dict[str, Any] = (
            {self.parameter: value}
            if self.parameter is not None
            else {name: getattr(value, name) for name in type(value).model_fields}
        )
        if self.context_parameter is not None:
            kwargs[self.context_parameter] = context
        return fn(**kwargs)


def _positive(retention: object) -> bool:
    return isinstance(retention, timedelta) and retention > timedelta(0)


def _takes(fn: Callable[..., Any], count: int) -> bool:
    """Whether fn can be called with `count` positional arguments."""
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    except ValueError:
        return True  # no signature to inspect (a builtin): trust it
    return True


def _arguments(name: str, fn: Callable[..., Any], schema: dict[str, Any] | None) -> Arguments:
    where = f"tool {name!r}"
    if schema is not None:
        if not isinstance(schema, dict):
            raise DefinitionError(f"{where}: schema must be a JSON Schema object (a dict)")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise DefinitionError(
                f"{where}: schema is not valid JSON Schema: {exc.message}"
            ) from None
        if schema.get("type") != "object":
            raise DefinitionError(f'{where}: schema must have "type": "object"')
        if not _takes(fn, 2):
            raise DefinitionError(f"{where}: with schema=, the function must take (args, context)")
        return SchemaArguments(schema, Draft202012Validator(schema))
    try:
        hints = _parameter_hints(fn)
    except Exception as exc:  # a name the annotations use that cannot be resolved
        raise DefinitionError(f"{where}: cannot read its type annotations ({exc})") from None
    parameters = list(inspect.signature(fn).parameters.values())
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise DefinitionError(f"{where}: *{parameter.name} cannot be a tool argument")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise DefinitionError(f"{where}: positional-only {parameter.name!r} is not supported")
    context = [p.name for p in parameters if _is_context(p, hints)]
    if len(context) > 1:
        raise DefinitionError(f"{where}: takes the ToolContext twice ({', '.join(context)})")
    context_parameter = context[0] if context else None
    fields = [p for p in parameters if p.name != context_parameter]
    if len(fields) == 1 and _is_model(hints.get(fields[0].name)):
        return ModelArguments(hints[fields[0].name], fields[0].name, context_parameter)
    unannotated = [p.name for p in fields if p.name not in hints]
    if unannotated:
        raise DefinitionError(
            f"{where}: give schema=..., or annotate every argument (no annotation on "
            f"{', '.join(map(repr, unannotated))})"
        )
    if [p.name for p in fields] == ["args"] and hints["args"] in (dict, dict[str, Any]):
        raise DefinitionError(f"{where}: `args: dict` needs schema=... (or type it)")
    definitions: dict[str, Any] = {
        p.name: (hints[p.name], ... if p.default is p.empty else p.default) for p in fields
    }
    try:
        model = create_model(
            f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **definitions
        )
        return ModelArguments(model, None, context_parameter)
    except Exception as exc:  # pydantic cannot build a schema for some annotation
        first = str(exc).splitlines()[0]
        raise DefinitionError(
            f"{where}: cannot derive a schema from its arguments: {first}"
        ) from None


def _parameter_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' annotations, resolved; the return annotation is left alone (it may name
    a class defined after the tool, or inside the function that defines it)."""
    probe = types.FunctionType(_no_code.__code__, inspect.unwrap(fn).__globals__)
    annotations = getattr(fn, "__annotations__", {})
    probe.__annotations__ = {k: v for k, v in annotations.items() if k != "return"}
    return typing.get_type_hints(probe, include_extras=True)


def _no_code() -> None: ...


def _is_context(parameter: inspect.Parameter, hints: dict[str, Any]) -> bool:
    hint = hints.get(parameter.name)
    return hint is ToolContext or (hint is None and parameter.name == "context")


def _is_model(hint: object) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)


# -- tools -----------------------------------------------------------------------------------


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
        output = self.arguments.call(self.fn, self.arguments.parse(args), context)
        return output.model_dump(mode="json") if isinstance(output, BaseModel) else output

    def action_key(self, args: dict[str, Any], context: ToolContext) -> str:
        """The side effect's idempotency key, in its namespace (by default the agent's)."""
        assert self.side_effect is not None, f"{self.name} has no side effect"
        meaning = self.side_effect.key(self.arguments.parse(args), context)
        return action_key(self.side_effect.namespace or context.agent, meaning)

    def check_action(self, args: dict[str, Any], context: ToolContext) -> None:
        """The side effect's check of a new action (PermanentError: refused)."""
        assert self.side_effect is not None and self.side_effect.check is not None
        self.side_effect.check(self.arguments.parse(args), context)

    def look_up(self, key: str, args: dict[str, Any], context: ToolContext) -> ToolOutput | None:
        assert self.side_effect is not None and self.side_effect.lookup is not None
        return self.side_effect.lookup(key, self.arguments.parse(args), context)

    def spec(self) -> dict[str, Any]:
        """The tool as the Messages API expects it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


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
            arguments=_arguments(tool_name, fn, schema),
            side_effect=side_effect,
            requires_approval=requires_approval,
            approvers=approvers,
            wake_time=wake_time,
            needs=needs,
        )

    return make(fn) if fn is not None else make


# -- once -----------------------------------------------------------------------------------


class OnceStore(Protocol):
    """Where `once` keeps results: the running step's journal (set by the engine)."""

    def once(self, key: str, fn: Callable[[], T]) -> T: ...


_ONCE: ContextVar[OnceStore | None] = ContextVar("nightshift_once", default=None)


class OnceOutsideStep(NightshiftError):
    """once() works only inside a tool called by a run's step (and not inside a side effect's
    send, which the action protocol already makes happen once)."""


def once(key: str, fn: Callable[[], T]) -> T:
    """Run `fn` at most once per `key` in this run and return its result; every later call
    with the key (including the replay of a step after a crash) returns the stored result.

    For an effect only nightshift's own record receives: recording a decision, allocating a
    number, a timestamp or a random choice a replay must not change. The result must be JSON
    (it is kept in the run's journal) and comes back as JSON would (tuples as lists). An effect
    on another service goes through a side-effecting tool instead.
    """
    store = _ONCE.get()
    if store is None:
        raise OnceOutsideStep()
    return store.once(key, fn)


@contextmanager
def once_scope(store: OnceStore | None) -> Iterator[None]:
    """While a tool runs: where its `once` calls keep their results (None: refused)."""
    token = _ONCE.set(store)
    try:
        yield
    finally:
        _ONCE.reset(token)


# -- shipped tools ---------------------------------------------------------------------------

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
