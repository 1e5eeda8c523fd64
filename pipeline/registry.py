"""Agents by name, from the `nightshift.agents` entry points and NIGHTSHIFT_AGENTS.

Loaded once per process, so the worker, beat, the API and every command see the same agents.
nightshift's own agents are registered exactly as a user's package registers its own:

    [project.entry-points."nightshift.agents"]
    my_agent = "my_package.agents:AGENT"

or, without packaging, `NIGHTSHIFT_AGENTS=my_module:AGENT,other_module:AGENT`.

The agents nightshift ships (its own distribution's entry points: the demo's nightly report,
Patch, the competitor monitor...) are off in a deployment until NIGHTSHIFT_SHIPPED_AGENTS names
them (`all`, or their names): a deployment runs its team's agents, and a shipped agent nobody
configured would only fail at night.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import (
    PackageNotFoundError,
    entry_points,
    packages_distributions,
    version,
)

from pipeline.agent_definition import Agent, EventSource
from pipeline.code_digest import code_digest
from pipeline.errors import RegistryError, UnknownAgent, UnknownEventSource
from pipeline.process_wide import ProcessWide
from pipeline.settings import Settings, get_settings

ENTRY_POINT_GROUP = "nightshift.agents"
AGENTS_ENV = "NIGHTSHIFT_AGENTS"
SHIPPED_ENV = "NIGHTSHIFT_SHIPPED_AGENTS"
SHIPPED_BY = "nightshift"
"""The distribution whose entry points are the shipped agents."""
HOW_TO_REGISTER = (
    f"register it with an entry point in the {ENTRY_POINT_GROUP!r} group or in {AGENTS_ENV} "
    "(docs/agents.md)"
)


@dataclass(frozen=True, eq=False)
class Registered:
    agent: Agent
    path: str
    """Where it was loaded from: `module:attribute`."""
    source: str
    """Who registered it: the distribution's entry point, or NIGHTSHIFT_AGENTS."""
    package: str
    """The distribution that declares it (`nightshift 0.1.0`), or its module for
    NIGHTSHIFT_AGENTS."""
    release: str
    """The version of the distribution its module comes from (`0.1.0`), `unpackaged` if none."""

    def version(self, model: str) -> str:
        """The agent version a run records: `0.1.0+<digest of what changes behaviour>`, its
        definition's and its code's (pipeline/code_digest.py)."""
        behaviour = self.agent.behaviour_digest(model)
        code = code_digest(self.agent, self.path.partition(":")[0])
        return f"{self.release}+{hashlib.sha256(f'{behaviour}.{code}'.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Registry:
    agents: Mapping[str, Registered]
    event_sources: Mapping[str, tuple[Agent, EventSource]]
    shipped_off: frozenset[str] = frozenset()
    """nightshift's shipped agents that NIGHTSHIFT_SHIPPED_AGENTS does not turn on here."""

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name].agent
        except KeyError:
            if name in self.shipped_off:
                raise UnknownAgent(
                    f"agent {name!r} is one of nightshift's shipped agents, off here: set "
                    f"{SHIPPED_ENV}={name} (or all) where it should run"
                ) from None
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
    release: str | None = None
    """The declaring distribution's version alone."""


def _declared(agents: str, shipped: frozenset[str]) -> tuple[list[_Declared], frozenset[str]]:
    """The entry points, then the `module:ATTR` paths listed in NIGHTSHIFT_AGENTS (`agents`);
    and the shipped agents left off, as `shipped` (NIGHTSHIFT_SHIPPED_AGENTS) does not name
    them."""
    points = list(entry_points(group=ENTRY_POINT_GROUP))
    ours = {point.name for point in points if point.dist and point.dist.name == SHIPPED_BY}
    unknown = sorted(shipped - ours - {"all"})
    if unknown:
        raise RegistryError(
            f"{SHIPPED_ENV} names {', '.join(map(repr, unknown))}, which nightshift does not "
            f"ship (it ships: all, {', '.join(sorted(ours))})"
        )
    off = frozenset() if "all" in shipped else frozenset(ours - shipped)
    declared = [
        _Declared(
            point.value,
            f"entry point {point.name!r} of {point.dist.name if point.dist else 'a package'}",
            point.name,
            f"{point.dist.name} {point.dist.version}" if point.dist else None,
            point.dist.version if point.dist else None,
        )
        for point in points
        if not (point.name in off and point.dist and point.dist.name == SHIPPED_BY)
    ]
    for path in agents.split(","):
        if path.strip():
            declared.append(_Declared(path.strip(), AGENTS_ENV))
    return declared, off


def _load(declared: _Declared) -> Agent:
    module_name, sep, attribute = declared.path.partition(":")
    where = f"{declared.source}: {declared.path!r}"
    if not sep or not module_name or not attribute:
        raise RegistryError(f"{where} must look like 'package.module:ATTRIBUTE'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            # An entry point names a module its package no longer has: an install made before
            # the module moved (an editable one keeps its metadata until it is reinstalled).
            stale = "; reinstall the package" if declared.name is not None else ""
            raise RegistryError(f"{where}: no module named {exc.name!r}{stale}") from None
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


def build(declared: Iterable[_Declared], shipped_off: frozenset[str] = frozenset()) -> Registry:
    agents: dict[str, Registered] = {}
    for item in declared:
        agent = _load(item)
        seen = agents.get(agent.name)
        if seen is not None and seen.agent is not agent:
            raise RegistryError(
                f"two agents are named {agent.name!r}: {seen.path} ({seen.source}) and "
                f"{item.path} ({item.source})"
            )
        module = item.path.partition(":")[0]
        registered = Registered(
            agent, item.path, item.source, item.package or module, item.release or _release(module)
        )
        agents.setdefault(agent.name, registered)
    # A shipped agent registered by its path in NIGHTSHIFT_AGENTS is on all the same.
    return Registry(agents, _event_sources(agents.values()), shipped_off - agents.keys())


def _event_sources(agents: Iterable[Registered]) -> dict[str, tuple[Agent, EventSource]]:
    sources: dict[str, tuple[Agent, EventSource]] = {}
    for registered in agents:
        for source in registered.agent.event_sources:
            other = sources.get(source.name)
            if other is not None:
                raise RegistryError(
                    f"agents {other[0].name!r} and {registered.agent.name!r} both take events "
                    f"from source {source.name!r}"
                )
            sources[source.name] = (registered.agent, source)
    return sources


def agents_by_value(agents: Iterable[Agent], source: str) -> Registry:
    """A registry of exactly these agents, given as values rather than found by path (a
    test's agent, its tools stubbed); `source` says who registered them."""
    found: dict[str, Registered] = {}
    for agent in agents:
        if agent.name in found:
            raise RegistryError(f"{source}: two agents are named {agent.name!r}")
        path = f"{source}:{agent.name}"
        found[agent.name] = Registered(agent, path, source, source, "unpackaged")
    return Registry(found, _event_sources(found.values()))


def _release(module: str) -> str:
    """The version of the installed distribution that provides `module` (a NIGHTSHIFT_AGENTS
    path: an entry point names its distribution)."""
    top = module.partition(".")[0]
    for distribution in _distributions().get(top, ()):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "unpackaged"


@cache
def _distributions() -> Mapping[str, list[str]]:
    """Top-level module -> distributions: reading every installed one's metadata takes half a
    second, so once a process."""
    return packages_distributions()


def _registered_here() -> Registry:
    settings = get_settings()
    declared, shipped_off = _declared(settings.agents, settings.shipped_agents)
    return build(declared, shipped_off)


registry: ProcessWide[Registry] = ProcessWide(_registered_here)
"""This process's agents, loaded on first use (`registry.cache_clear()` loads them again);
pipeline.testing puts a test's agent in force (`registry.replaced_by(agents_by_value(...))`)."""


def get_agent(name: str) -> Agent:
    return registry().agent(name)


def agent_version(name: str) -> str:
    """The version of agent `name` as this process runs it (UnknownAgent if it has none)."""
    registry().agent(name)  # UnknownAgent, naming the known ones
    return _version_of(registry().agents[name], model_of_runs(get_settings()))


@cache
def _version_of(registered: Registered, model: str) -> str:
    """Once a process: hashing the definition costs a quarter of a millisecond a step."""
    return registered.version(model)


def model_of_runs(settings: Settings) -> str:
    """What answers a run's model calls here: the configured model, else the agent's script."""
    return settings.model_name if settings.anthropic_api_key else "script"


def agent_names() -> list[str]:
    return sorted(registry().agents)


def all_agents() -> list[Agent]:
    return [registered.agent for registered in registry().agents.values()]
