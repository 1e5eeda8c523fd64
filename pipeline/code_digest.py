"""A digest of an agent's code: what its version must change with besides its definition.

The definition's digest (Agent.behaviour_digest) sees the prompt, the tools' schemas and the
side effects' services, not what the tools do: a release that changes a tool's body, a key
function or the success check under the same package version would replay as the same
version, and the agent's on_version_change policy would never be asked. Here each function the
agent declares (tools, key functions, lookups, checks, scripts, its job, its event sources'
conversions) is hashed with its own source, and with the whole source of the module it lives
in and of the module that defines the agent, so a helper beside a tool counts too. Helpers in
other modules do not: an author who keeps a tool's logic elsewhere says so in the tool's
module (docs/agents.md, "Versions").

The runtime's own modules are left out (`default_job` lives in pipeline.agent_definition): an
upgrade of nightshift that changes no agent's code is no new version of every agent.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from pipeline.agent_definition import Agent

RUNTIME_MODULES = ("pipeline.agent_definition", "pipeline.tools.definition")
"""Where the defaults an agent did not choose are defined."""


def code_digest(agent: Agent, module_name: str) -> str:
    """16 hex digits over the sources of `agent`'s functions and of their modules and of
    `module_name` (where the agent is defined)."""
    digest = hashlib.sha256()
    modules = {module_name}
    for name, function in sorted(_functions(agent), key=lambda item: item[0]):
        digest.update(f"{name}\0{_source(function)}\0".encode())
        module = getattr(inspect.getmodule(function), "__name__", None)
        if module is not None:
            modules.add(module)
    for module in sorted(modules - set(RUNTIME_MODULES)):
        digest.update(f"{module}\0{_module_source(sys.modules.get(module))}\0".encode())
    return digest.hexdigest()[:16]


def _functions(agent: Agent) -> Iterator[tuple[str, Callable[..., Any]]]:
    """(where it is declared, the function) for every function the agent declares."""
    for field in ("script", "check_success", "job"):
        yield from _named(field, getattr(agent, field))
    for tool in agent.tools:
        yield from _named(f"tool {tool.name}", tool.fn)
        yield from _named(f"tool {tool.name} wake_time", tool.wake_time)
        effect = tool.side_effect
        if effect is None:
            continue
        for field in ("key", "lookup", "check", "honours_keys", "key_retention", "per_run_cap"):
            yield from _named(f"tool {tool.name} {field}", getattr(effect, field))
    for index, source in enumerate(agent.event_sources):
        yield from _named(f"event source {index} to_input", source.to_input)
        yield from _named(f"event source {index} deadline", source.deadline)


def _named(name: str, value: object) -> Iterator[tuple[str, Callable[..., Any]]]:
    function = getattr(value, "func", value)  # a functools.partial: the function it calls
    if callable(function) and (inspect.isfunction(function) or inspect.ismethod(function)):
        yield name, function


def _source(function: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):  # defined where no source is kept (a REPL, exec)
        return getattr(function, "__qualname__", repr(function))


def _module_source(module: ModuleType | None) -> str:
    if module is None:
        return ""
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return ""
