"""Tools the model may call: their arguments (a JSON Schema, a pydantic model or annotated
parameters), whether they touch the world (SideEffect), and `once` for a value a replay must
not change. Every mistake a tool author can make here is a DefinitionError naming the tool.

The modules, each re-exported here under its public names (`from pipeline.tools import X`):
`context` (what a tool gets and returns), `agent_state` (the run's plan and facts, which a
tool reads and writes), `arguments` (how it takes its arguments), `side_effects`
(SideEffect), `definition` (Tool and @tool), `once_per_key` (once: one value per key, once
journaled), `timer` (check_back_in), `service_replays` (a send's service saying it already
had the key)."""

from pipeline.errors import OnceOutsideStep
from pipeline.tools.agent_state import AgentState
from pipeline.tools.arguments import Arguments, ModelArguments, SchemaArguments
from pipeline.tools.context import ArtifactRequest, ToolContext, ToolOutput
from pipeline.tools.definition import TOOL_NAME, Tool, ToolFunction, tool
from pipeline.tools.once_per_key import OnceStore, once, once_scope
from pipeline.tools.service_replays import service_replayed, watching_replays
from pipeline.tools.side_effects import Check, KeyBuilder, Lookup, SideEffect
from pipeline.tools.timer import MAX_WAIT, check_back_in

__all__ = [  # noqa: RUF022 -- grouped by module, as dramatiq does
    # context
    "ArtifactRequest",
    "ToolContext",
    "ToolOutput",
    # agent state
    "AgentState",
    # arguments
    "Arguments",
    "ModelArguments",
    "SchemaArguments",
    # side effects
    "Check",
    "KeyBuilder",
    "Lookup",
    "SideEffect",
    "service_replayed",
    "watching_replays",
    # the tool
    "TOOL_NAME",
    "Tool",
    "ToolFunction",
    "tool",
    # once
    "OnceOutsideStep",
    "OnceStore",
    "once",
    "once_scope",
    # the timer tool
    "MAX_WAIT",
    "check_back_in",
]
