"""nightshift: durable AI-agent runs on Celery.

The authoring API: everything an agent's package needs, and all it should import (the tutorial
is docs/agents.md). Everything else in `pipeline` is the runtime's own and may move.

Defining an agent
    Agent          an agent: system prompt, instructions, tools, input schema, limits, and
                   optionally a script, a schedule job and event sources
    tool           makes a function a tool: `@tool(description=..., schema=...)` with
                   `fn(args, context)`, or a typed function (pydantic model or annotated
                   arguments) whose schema is derived and enforced
    Tool           what `@tool` makes: `run(args, context)` calls it, `action_key(args, context)`
                   gives its side effect's idempotency key, `argument_errors(args)` says why
                   the model's arguments would be refused
    SideEffect     declares that a tool acts on a service: idempotency key, whether the
                   service honours keys and for how long, lookup, key namespace, and how
                   long one send may take (send_timeout; the lease covers it)
    ToolContext    what a tool gets besides its arguments: run id, agent, run input, the
                   action's idempotency key, `config("acme.url")` for its own settings, and
                   `state`, the run's agent state (a plan, facts: `state.get`, `state.set`)
    PersonalData   which fields of its runs' input, result, state and side effects'
                   arguments and results are personal: retention drops those, keeps the rest
    ArtifactRequest  a tool result kept as an artifact (a report) instead of inline
    check_back_in  the timer tool: the run waits (no process) and continues later
    once           `once(key, fn)`: fn's result, fixed per key in a run once journaled;
                   replays return it (fn runs again after a crash before the journal write)
    service_replayed  called by a side effect's send whose service answered that it already
                   had the key (`Idempotent-Replayed: true`, a 409 on the key): recorded as a
                   duplicate the service absorbed

Errors a tool raises (Exceptions, under pipeline.errors.NightshiftError)
    PermanentError     retrying cannot help; the model sees the error
    TemporaryError     worth retrying (timeouts, 429, 5xx); retried with backoff
    LookupUnsupported  a side effect's lookup cannot tell what happened
    NotConfigured      a setting the run cannot work without is not set where the worker
                       runs: the run stops at once (reason `config`); see `tool(needs=...)`

The engine's stop signals (cancel, deadline, budget, lost lease, time limit) are the second
root, pipeline.errors.StopStep, a BaseException: they pass a tool's `except Exception`, and a
tool neither raises nor catches them.

Scripts (the offline stand-in for the model, for tests and the demo)
    Conversation   what a script sees: the run's input and the messages so far (a success
                   check also reads the run's `state`)
    text           a text block, as a script answers with
    tool_use       a tool call with a deterministic id, as a script answers with

Schedules and events (an agent's `job` and `event_sources`)
    Slot           the schedule's slot a job is asked about
    RunPlan        a job's answer: one run with this input
    BatchPlan      a job's answer: one child run per input, then one synthesis run
    EventSource    another service's events (`POST /events/{name}`) that start runs

Testing an agent (no service to set up): `pipeline.testing`, `run_agent(agent, input,
tools=stubs)` runs its script or canned replies on the real step, in-process, records tool
calls and side effects without sending, approves or rejects, and moves the clock
(docs/agents.md).

`celery -A pipeline worker` finds the Celery app here too.
"""

from typing import Any

from pipeline.agent_definition import (
    Agent,
    BatchPlan,
    Conversation,
    EventSource,
    PersonalData,
    RunPlan,
    Slot,
    text,
    tool_use,
)
from pipeline.errors import LookupUnsupported, NotConfigured, PermanentError, TemporaryError
from pipeline.tools import (
    ArtifactRequest,
    SideEffect,
    Tool,
    ToolContext,
    check_back_in,
    once,
    service_replayed,
    tool,
)

__all__ = [
    "Agent",
    "ArtifactRequest",
    "BatchPlan",
    "Conversation",
    "EventSource",
    "LookupUnsupported",
    "NotConfigured",
    "PermanentError",
    "PersonalData",
    "RunPlan",
    "SideEffect",
    "Slot",
    "TemporaryError",
    "Tool",
    "ToolContext",
    "check_back_in",
    "once",
    "service_replayed",
    "text",
    "tool",
    "tool_use",
]


def __getattr__(name: str) -> Any:
    if name == "app":
        # Lazy: the authoring API imports none of the runtime (an agent's package imports
        # `pipeline` and must not pull Celery and the database layer in with it).
        from pipeline.app import app

        return app
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
