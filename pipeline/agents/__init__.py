"""The shipped agents, by name."""

from __future__ import annotations

from pipeline.agents.base import Agent
from pipeline.errors import UnknownAgent


def _registry() -> dict[str, Agent]:
    from pipeline.agents import nightly_report

    return {agent.name: agent for agent in (nightly_report.AGENT,)}


def get_agent(name: str) -> Agent:
    agents = _registry()
    try:
        return agents[name]
    except KeyError:
        known = ", ".join(sorted(agents))
        raise UnknownAgent(f"unknown agent {name!r}; known agents: {known}") from None


def agent_names() -> list[str]:
    return sorted(_registry())


def all_agents() -> list[Agent]:
    return list(_registry().values())
