"""How a tool takes its arguments: a hand-written JSON Schema (the tool gets a dict), a pydantic
model, or annotated parameters (a model is derived); each a DefinitionError naming the tool when
it cannot work."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from pipeline.errors import DefinitionError
from pipeline.tools.context import ToolContext


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
    known: frozenset[str] | None = field(init=False)
    """The field names (and aliases) the model declares, when unknown ones are refused: a
    model that does not say what to do with them (`model_config = ConfigDict(extra=...)`)
    refuses them, where pydantic would ignore a misspelt or invented argument unseen."""

    def __post_init__(self) -> None:
        schema = self.model.model_json_schema()
        schema.pop("title", None)
        known = None
        if "extra" not in self.model.model_config:
            fields = self.model.model_fields
            known = frozenset(fields) | {f.alias for f in fields.values() if f.alias}
            schema["additionalProperties"] = False
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "known", known)

    def errors(self, args: object) -> list[str]:
        unknown = self._unknown(args)
        try:
            self.model.model_validate(args)
        except ValidationError as exc:
            found = [
                f"{'/'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()
            ]
            return found + unknown
        return unknown

    def _unknown(self, args: object) -> list[str]:
        if self.known is None or not isinstance(args, dict):
            return []
        return [
            f"{name}: Extra inputs are not permitted" for name in args if name not in self.known
        ]

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


def takes(fn: Callable[..., Any], count: int) -> bool:
    """Whether fn can be called with `count` positional arguments."""
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    except ValueError:
        return True  # no signature to inspect (a builtin): trust it
    return True


def arguments_of(name: str, fn: Callable[..., Any], schema: dict[str, Any] | None) -> Arguments:
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
        if not takes(fn, 2):
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
