"""Agents by name, from the `nightshift.agents` entry points and NIGHTSHIFT_AGENTS.

Loaded once per process, so the worker, beat, the API and every command see the same agents.
nightshift's own agents are registered exactly as a user's package registers its own:

    [project.entry-points."nightshift.agents"]
    my_agent = "my_package.agents:AGENT"

or, without packaging, `NIGHTSHIFT_AGENTS=my_module:AGENT,other_module:AGENT`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from pipeline.agent import Agent, EventSource
from pipeline.errors import NightshiftError, UnknownAgent

ENTRY_POINT_GROUP = "nightshift.agents"
AGENTS_ENV = "NIGHTSHIFT_AGENTS"
HOW_TO_REGISTER = (
    f"register it with an entry point in the {ENTRY_POINT_GROUP!r} group or in {AGENTS_ENV} "
    "(docs/agents.md)"
)


class RegistryError(NightshiftError):
    """An agent could not be registered."""


class UnknownEventSource(NightshiftError):
    """No agent takes events from that source."""


@dataclass(frozen=True)
class Registered:
    agent: Agent
    path: str
    """Where it was loaded from: `module:attribute`."""
    source: str
    """Who registered it: the distribution's entry point, or NIGHTSHIFT_AGENTS."""
    package: str
    """The distribution that declares it (`nightshift 0.1.0`), or its module for
    NIGHTSHIFT_AGENTS."""


@dataclass(frozen=True)
class Registry:
    agents: Mapping[str, Registered]
    event_sources: Mapping[str, tuple[Agent, EventSource]]

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name].agent
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise UnknownAgent(
                f"unknown agent {name!r} (known agents: {known}); {HOW_TO_REGISTER}"
            ) from None

    def event_source(self, name: str) -> tuple[Agent, EventSource]:
        try:
            return self.event_sources[name]
        except KeyError:
            known = ", ".join(sorted(self.event_sources)) or "none"
            raise UnknownEventSource(
                f"unknown event source {name!r}; known sources: {known}"
            ) from None


@dataclass(frozen=True)
class _Declared:
    path: str
    source: str
    name: str | None = None
    """The entry point's name, which must be the agent's name."""
    package: str | None = None
    """The declaring distribution and its version."""


def _declared(env: Mapping[str, str]) -> list[_Declared]:
    declared = [
        _Declared(
            point.value,
            f"entry point {point.name!r} of {point.dist.name if point.dist else 'a package'}",
            point.name,
            f"{point.dist.name} {point.dist.version}" if point.dist else None,
        )
        for point in entry_points(group=ENTRY_POINT_GROUP)
    ]
    for path in (env.get(AGENTS_ENV) or "").split(","):
        if path.strip():
            declared.append(_Declared(path.strip(), AGENTS_ENV))
    return declared


def _load(declared: _Declared) -> Agent:
    module_name, sep, attribute = declared.path.partition(":")
    where = f"{declared.source}: {declared.path!r}"
    if not sep or not module_name or not attribute:
        raise RegistryError(f"{where} must look like 'package.module:ATTRIBUTE'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise RegistryError(f"{where}: no module named {exc.name!r}") from None
        raise RegistryError(f"{where}: importing {module_name} failed: {exc}") from None
    except Exception as exc:  # a definition error in the user's module: say which and why
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise RegistryError(
            f"{where}: importing {module_name} failed: {type(exc).__name__}: {first}"
        ) from None
    try:
        agent = getattr(module, attribute)
    except AttributeError:
        raise RegistryError(
            f"{where}: module {module_name} has no attribute {attribute!r}"
        ) from None
    if not isinstance(agent, Agent):
        raise RegistryError(f"{where} is a {type(agent).__name__}, not a pipeline.Agent")
    if declared.name is not None and declared.name != agent.name:
        raise RegistryError(
            f"{where}: the entry point is named {declared.name!r} but the agent is named "
            f"{agent.name!r}; name them the same"
        )
    return agent


def build(declared: Iterable[_Declared]) -> Registry:
    agents: dict[str, Registered] = {}
    for item in declared:
        agent = _load(item)
        seen = agents.get(agent.name)
        if seen is not None and seen.agent is not agent:
            raise RegistryError(
                f"two agents are named {agent.name!r}: {seen.path} ({seen.source}) and "
                f"{item.path} ({item.source})"
            )
        package = item.package or item.path.partition(":")[0]
        agents.setdefault(agent.name, Registered(agent, item.path, item.source, package))
    sources: dict[str, tuple[Agent, EventSource]] = {}
    for registered in agents.values():
        for source in registered.agent.event_sources:
            other = sources.get(source.name)
            if other is not None:
                raise RegistryError(
                    f"agents {other[0].name!r} and {registered.agent.name!r} both take events "
                    f"from source {source.name!r}"
                )
            sources[source.name] = (registered.agent, source)
    return Registry(agents, sources)


@cache
def registry() -> Registry:
    """This process's agents, loaded on first use."""
    return build(_declared(os.environ))


def get_agent(name: str) -> Agent:
    return registry().agent(name)


def agent_names() -> list[str]:
    return sorted(registry().agents)


def all_agents() -> list[Agent]:
    return [registered.agent for registered in registry().agents.values()]
