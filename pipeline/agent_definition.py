"""What an agent is: a system prompt, tools, an input schema, limits and (optionally) a script
standing in for the model; and what its schedule job and event sources hand the runtime (plans,
never database writes). Mistakes in a definition are DefinitionErrors naming the agent."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from pipeline.errors import DefinitionError
from pipeline.tools import Tool

AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

Message = dict[str, Any]
Block = dict[str, Any]

VERSION_POLICIES = ("continue", "park", "fail")
"""Agent.on_version_change's choices."""

_INPUT_BLOCK = re.compile(r"```json\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class Conversation:
    """What a scripted model (or a success check) sees: the run's input and the messages so far."""

    input: dict[str, Any]
    messages: list[Message]
    state: dict[str, Any] = field(default_factory=dict)
    """The run's state for a success check: the agent state its tools keep (a plan, facts) and
    the runtime's `artifacts`. A script sees none: it answers as the model would, from the
    messages, and learns the state through what tools return."""

    def tool_results(self) -> list[Block]:
        return [
            block
            for message in self.messages
            if message["role"] == "user" and isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]

    def tool_uses(self) -> list[Block]:
        """Every tool_use block the model has written so far, oldest first."""
        return [
            block
            for message in self.messages
            if message["role"] == "assistant"
            for block in message["content"]
            if block["type"] == "tool_use"
        ]

    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def last_text(self) -> str:
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return " ".join(
                    b.get("text", "") for b in message["content"] if b["type"] == "text"
                )
        return ""


Script = Callable[[Conversation], list[Block]]


@dataclass(frozen=True)
class Slot:
    """A schedule's slot as the agent's job sees it."""

    schedule: str
    instant: datetime
    """The slot's instant (UTC)."""
    local: datetime
    """The same instant in the schedule's timezone."""
    params: Mapping[str, Any]
    """The schedule's params, as written in the schedule."""
    key: str
    """The slot's idempotency key: a run (or batch id) started with it starts once."""

    @property
    def date(self) -> str:
        """The slot's local date, `2026-11-29`: the 02:00 report of a night is for that day."""
        return self.local.date().isoformat()


@dataclass(frozen=True)
class RunPlan:
    """One run of the agent, with this input."""

    input: dict[str, Any]


@dataclass(frozen=True)
class BatchPlan:
    """A batch: one child run per input, and a synthesis run that gets every child's outcome."""

    batch_id: str
    name: str
    child_agent: str
    child_inputs: Sequence[dict[str, Any]]
    synthesis_agent: str
    params: dict[str, Any]
    token_cap: int | None = None
    cost_cap_usd: float | None = None
    tool_call_cap: int | None = None
    """Tool calls over all children; the batch stops with reason budget before passing it."""


Job = Callable[[Slot], RunPlan | BatchPlan]
"""What a schedule naming the agent starts for a slot."""


@dataclass(frozen=True)
class EventSource:
    """Another service's events that start runs of the agent (`POST /events/{name}`)."""

    name: str
    to_input: Callable[[Mapping[str, Any]], dict[str, Any]]
    """The event's payload -> the run's input (a KeyError names a missing field)."""
    deadline: timedelta | Callable[[Mapping[str, Any]], object] | None = None
    """How long a run this event starts may take (`timedelta(minutes=30)`), or a function of
    the payload returning its deadline (seconds, `"15m"`, an ISO time, None for none)."""


_FIELD = re.compile(r"^(\*|[^.*\s]+)(\.(\*|[^.*\s]+))*$")
"""A declared field: names joined by dots, `*` for every item of a list or value of an object."""


@dataclass(frozen=True)
class PersonalData:
    """What of an agent's runs is personal data: the fields retention drops when it compacts a
    finished run, keeping every other field of its outcome (docs/agents.md, "Personal data").
    A field is a dotted path into a JSON document; `*` stands for every item of a list or every
    value of an object (`invoices.*.email`); a field a document lacks drops nothing."""

    input: tuple[str, ...] = ()
    """Fields of the run's input (`email_to`)."""
    result: tuple[str, ...] = ()
    """Fields of the run's result, `{"text": <the closing reply>, "state": ...}`: `text` when
    the closing reply names people."""
    state: tuple[str, ...] = ()
    """Fields of the run's state; they go from the result's `state` too."""
    tools: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Tool name -> fields of the arguments (`args.body`) and result (`result.to`) its side
    effect's action records. A read-only tool's output lives only in the journal, which
    compaction reduces to outlines whatever is declared."""

    def __post_init__(self) -> None:
        for name in ("input", "result", "state"):
            object.__setattr__(self, name, _fields(f"personal_data.{name}", getattr(self, name)))
        if not isinstance(self.tools, Mapping):
            raise DefinitionError("personal_data.tools must map tool names to their fields")
        tools = {name: _fields(f"personal_data.tools[{name!r}]", fields)
                 for name, fields in self.tools.items()}  # fmt: skip
        object.__setattr__(self, "tools", tools)

    def problems(self, tool_names: Sequence[str]) -> list[str]:
        """What is wrong with the declaration, for an agent with these tools."""
        found = []
        for name in ("input", "result", "state"):
            found += [
                f"personal_data.{name} field {f!r} is not a dotted path of names or *"
                for f in getattr(self, name)
                if not _FIELD.match(f)
            ]
        for tool_name, fields in self.tools.items():
            if tool_name not in tool_names:
                found.append(f"personal_data.tools names {tool_name!r}, not one of its tools")
            found += [
                f"personal_data.tools[{tool_name!r}] field {f!r} must start with args. or "
                "result. and be a dotted path of names or *"
                for f in fields
                if not (_FIELD.match(f) and f.partition(".")[0] in ("args", "result") and "." in f)
            ]
        return found

    def of_result(self) -> tuple[str, ...]:
        """The declared fields of the run's result, its final `state` included."""
        return (*self.result, *(f"state.{f}" for f in self.state))

    def of_tool(self, tool_name: str, part: str) -> tuple[str, ...]:
        """The declared fields of `part` (`args` or `result`) of a tool's action."""
        prefix = f"{part}."
        fields = self.tools.get(tool_name, ())
        return tuple(f.removeprefix(prefix) for f in fields if f.startswith(prefix))


def _fields(what: str, fields: object) -> tuple[str, ...]:
    """A declaration's fields as a tuple (a lone string is one field, not its characters)."""
    if isinstance(fields, str):
        return (fields,)
    if not isinstance(fields, Sequence) or not all(isinstance(f, str) for f in fields):
        raise DefinitionError(f"{what} must be a tuple of field names (got {fields!r})")
    return tuple(fields)


def default_job(slot: Slot) -> RunPlan:
    """One run with the schedule's params as its input."""
    return RunPlan(dict(slot.params))


@dataclass(frozen=True)
class Agent:
    """An agent: register it by entry point (`nightshift.agents`) or NIGHTSHIFT_AGENTS."""

    name: str
    system: str
    instructions: str
    """The first user message, followed by the run's input as JSON."""
    tools: tuple[Tool, ...]
    input_schema: dict[str, Any]
    """JSON Schema of the run's input; a run with other input is refused when it is started."""
    script: Script | None = None
    """The deterministic stand-in for the model (what it would answer to this conversation),
    used when ANTHROPIC_API_KEY is not set. Without one the agent runs only on the real model,
    and starting it with no ANTHROPIC_API_KEY is refused."""
    max_steps: int = 20
    max_tokens: int = 1024
    """Per model call (the Messages API's max_tokens); a reply cut off there is asked again
    with more room, up to NIGHTSHIFT_MAX_TOKENS_CAP."""
    stop_sequences: tuple[str, ...] = ()
    """Text at which the model stops: such a reply is complete (stop_reason stop_sequence)."""
    max_tool_calls: int | None = None
    """Per run; the run stops with reason max_tool_calls when it would exceed it."""
    max_run_tokens: int | None = None
    """Per run, every token over all model calls: input (cache writes and reads included)
    and output."""
    max_run_cost_usd: float | None = None
    """Per run, the recorded cost of its model calls (cache writes and reads at their prices);
    the run stops with reason max_cost before the call that would start past it."""
    max_step_attempts: int = 3
    """Consecutive failed attempts of one step (its worker lost, its lease lapsed with no
    checkpoint, its time bound hit, a statement failed in the database) before the run fails
    with reason crashed_worker, time_limit or database_error; failures shared with a neighbour
    in a killed process count once (pipeline/runs/failed_attempts.py)."""
    max_concurrent_runs: int | None = None
    """At most this many of the agent's runs in a step at once, across every worker and host;
    the others wait for their turn in order, parked with reason max_concurrent_runs, holding
    no worker slot (docs/flow-control.md)."""
    check_success: Callable[[Conversation], bool] | None = None
    job: Job = default_job
    """What a schedule naming this agent starts for each slot."""
    event_sources: tuple[EventSource, ...] = ()
    on_version_change: str = "continue"
    """What a run started under another version of this agent does when a step of this one
    would replay its journal: `continue` (replay it, every side effect settled through its
    recorded action), `park` (wait in needs_attention until a person allows this version or
    cancels the run) or `fail` (reason version_changed). docs/operations.md, "Deploying a new
    release"."""
    personal_data: PersonalData = PersonalData()
    """The fields of its input, result, state and side effects' arguments and results that
    hold personal data: retention's compaction drops them and keeps the rest of the outcome."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not AGENT_NAME.match(self.name):
            raise DefinitionError(
                f"agent name {self.name!r} must match {AGENT_NAME.pattern} (it names the "
                "agent's runs, schedules and idempotency keys)"
            )
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "event_sources", tuple(self.event_sources))
        problems = self._problems()
        if problems:
            raise DefinitionError(f"agent {self.name!r}: " + "; ".join(problems))

    def _problems(self) -> list[str]:
        found = []
        for field_name in ("system", "instructions"):
            value = getattr(self, field_name)
            if not isinstance(value, str) or not value.strip():
                found.append(f"{field_name} must be a non-empty string")
        for index, item in enumerate(self.tools):
            if not isinstance(item, Tool):
                what = getattr(item, "__name__", type(item).__name__)
                found.append(f"tools[{index}] ({what}) is not a tool: decorate it with @tool(...)")
        names = [t.name for t in self.tools if isinstance(t, Tool)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            found.append(f"lists two tools named {twice[0]!r}")
        found += _schema_problems(self.input_schema)
        for field_name in ("script", "check_success"):
            value = getattr(self, field_name)
            if value is not None and not callable(value):
                found.append(f"{field_name} must be a function of the Conversation")
        if not callable(self.job):
            found.append("job must be a function of the Slot returning a RunPlan or BatchPlan")
        counts = ("max_steps", "max_tokens", "max_tool_calls", "max_run_tokens",
                  "max_concurrent_runs")  # fmt: skip
        for field_name in (*counts, "max_step_attempts"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, int) or value < 1):
                found.append(f"{field_name} must be a positive integer (got {value!r})")
        if self.on_version_change not in VERSION_POLICIES:
            found.append(
                f"on_version_change must be one of {', '.join(VERSION_POLICIES)} "
                f"(got {self.on_version_change!r})"
            )
        for source in self.event_sources:
            if not isinstance(source, EventSource):
                found.append(f"event_sources holds a {type(source).__name__}, not an EventSource")
        if isinstance(self.personal_data, PersonalData):
            found += self.personal_data.problems(names)
        else:
            found.append("personal_data must be a PersonalData(input=..., tools=...)")
        return found

    def unset_needs(self, is_set: Callable[[str], bool]) -> list[tuple[str, str]]:
        """(variable, tool) for each variable a tool needs that `is_set` says is missing."""
        return [(v, t.name) for t in self.tools for v in t.needs if not is_set(v)]

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def input_errors(self, run_input: object) -> list[str]:
        errors = sorted(self._input_validator.iter_errors(run_input), key=lambda e: list(e.path))
        return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors]

    @cached_property
    def _input_validator(self) -> Draft202012Validator:
        """Built once an agent: a night's fan-out checks every child's input with it."""
        return Draft202012Validator(self.input_schema)

    def first_message(self, run_input: dict[str, Any]) -> Message:
        body = json.dumps(run_input, sort_keys=True, indent=2)
        return {"role": "user", "content": f"{self.instructions}\n\nInput:\n```json\n{body}\n```"}

    @property
    def prompt_version(self) -> str:
        """Changes whenever the prompt, the tools or the model settings change."""
        return _digest(self._prompt())

    def behaviour_digest(self, model: str) -> str:
        """What changes how a run of this agent behaves, hashed: its prompt, instructions and
        model settings, its tools' names, descriptions and schemas, and each side effect's
        service and key namespace. With the agent's distribution version it is the run's
        agent version (pipeline.registry.agent_version)."""
        effects = {
            t.name: [t.side_effect.service, t.side_effect.namespace or self.name]
            for t in self.tools
            if t.side_effect is not None
        }
        return _digest({**self._prompt(), "model": model, "side_effects": effects})

    def _prompt(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "instructions": self.instructions,
            "tools": [t.spec() for t in self.tools],
            "max_tokens": self.max_tokens,
            **({"stop_sequences": list(self.stop_sequences)} if self.stop_sequences else {}),
        }


def _digest(described: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def _schema_problems(schema: object) -> list[str]:
    if not isinstance(schema, dict):
        return ["input_schema must be a JSON Schema object (a dict)"]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [f"input_schema is not valid JSON Schema: {exc.message}"]
    return []


def input_from_messages(messages: list[Message]) -> dict[str, Any]:
    """Recover the run's input from the first user message (used by the local Messages API)."""
    first = messages[0]["content"] if messages else ""
    text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
    match = _INPUT_BLOCK.search(text)
    return json.loads(match.group(1)) if match else {}


def tool_use(step: int, index: int, name: str, args: dict[str, Any]) -> Block:
    """A tool_use block with a deterministic id, as a scripted model writes it."""
    return {"type": "tool_use", "id": f"toolu_s{step:03d}_{index}", "name": name, "input": args}


def text(body: str) -> Block:
    return {"type": "text", "text": body}
